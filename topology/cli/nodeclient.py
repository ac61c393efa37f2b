"""The HTTP client of a node's v1 API that the operator commands share (:mod:`.operator` runs
them with one): one bearer token, JSON answers decoded, server-sent events read, and a failure
as :class:`~topology.cli.operator.NodeAnswered` (the node's error) or
:class:`~topology.cli.operator.Unreachable` (no HTTP answer).

An https node is checked against ``$AGENT_REACH_CA_FILE`` (and shown
``$AGENT_REACH_CLIENT_CERT_FILE``/``$AGENT_REACH_CLIENT_KEY_FILE`` when it requires a client
certificate) through :class:`node.core.ClientTlsSettings`, imported only when one is set: without
them the system's trust store, and a command that starts as light as before.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import orjson

from .nodenames import TLS_ENV, URL_ENV
from .operator import DEFAULT_TIMEOUT_S, NodeAnswered, Unreachable, UsageError

__all__ = ["NodeClient"]


class NodeClient:
    """The node's v1 API with one bearer token; ``async with NodeClient(url, token) as client``."""

    def __init__(self, url: str, token: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> NodeClient:
        self._session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {self.token}"},
                                              connector=aiohttp.TCPConnector(ssl=_ssl_from_environment()))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("use NodeClient as 'async with'")
        return self._session

    async def call(self, method: str, path: str, *, params: Sequence[tuple[str, str]] | None = None,
                   body: object = None) -> Any:
        """The decoded JSON answer; raises :class:`NodeAnswered` or :class:`Unreachable`."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        data = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else None
        try:
            async with self.session.request(method, self.url + path, params=params, data=data, headers=headers,
                                            timeout=timeout, allow_redirects=False) as response:
                raw = await response.read()
                return self._decoded(method, path, response.status, raw)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unreachable(self._unreachable(exc)) from exc

    async def events(self, path: str, *, params: Sequence[tuple[str, str]] | None = None,
                     ) -> AsyncIterator[tuple[str, Any]]:
        """The server-sent events of ``path`` as ``(event, data)`` until the node ends the stream."""
        timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout_s, sock_connect=self.timeout_s)
        try:
            async with self.session.get(self.url + path, params=params, timeout=timeout,
                                        allow_redirects=False) as response:
                if response.status != 200:
                    self._decoded("GET", path, response.status, await response.read())
                fields: dict[str, str] = {}
                async for raw in response.content:
                    line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    if line.startswith(":"):
                        continue
                    if line:
                        name, _, value = line.partition(":")
                        fields[name] = fields.get(name, "") + value.removeprefix(" ")
                        continue
                    if "data" in fields:
                        yield fields.get("event", "message"), orjson.loads(fields["data"])
                    fields = {}
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unreachable(self._unreachable(exc)) from exc

    def _decoded(self, method: str, path: str, status: int, raw: bytes) -> Any:
        try:
            decoded = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            decoded = None
        if status < 400:
            if decoded is None and raw:
                raise Unreachable(f"{self.url} answered {method} {path} with something that is not JSON; is it an "
                                  "Agent-Reach node?")
            return decoded
        if isinstance(decoded, dict) and "error" in decoded:
            where = f" (field {decoded['field']})" if decoded.get("field") else ""
            raise NodeAnswered(f"the node answered {status} {decoded['error']}{where}: {decoded.get('message', '')}",
                               status=status, body=decoded)
        raise NodeAnswered(f"the node answered {status} to {method} {path}", status=status)

    def _unreachable(self, exc: BaseException) -> str:
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            return (f"cannot reach the node at {self.url}: its certificate is not trusted "
                    f"({exc.certificate_error}); set ${TLS_ENV[0]} to the CA bundle that signed it")
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, TimeoutError):
            reason = f"no answer within {self.timeout_s:g} s"
        return f"cannot reach the node at {self.url}: {reason} (is it running? see --node, ${URL_ENV})"


def _ssl_from_environment() -> ssl.SSLContext | bool:
    """What https is checked against; raises :class:`UsageError` for a file that cannot be used."""
    if not any(os.environ.get(variable, "").strip() for variable in TLS_ENV):
        return True
    from node.core import ClientTlsSettings, TlsConfigError  # pydantic: only for those who set TLS up

    try:
        return ClientTlsSettings().with_environment().client_ssl_context()
    except TlsConfigError as exc:
        raise UsageError(f"${_ENV_OF[exc.setting]}: {exc}") from None


_ENV_OF = dict(zip(("ca_file", "client_cert_file", "client_key_file"), TLS_ENV))
