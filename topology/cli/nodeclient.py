"""The HTTP client of a node's v1 API that the operator commands share (:mod:`.operator` runs
them with one): one bearer token, JSON answers decoded, server-sent events read, and a failure
as :class:`~topology.cli.operator.NodeAnswered` (the node's error) or
:class:`~topology.cli.operator.Unreachable` (no HTTP answer).

A request and its answer (:meth:`NodeClient.call`: every command but ``watch``) go over the
standard library's ``http.client``, in the command's own thread: importing aiohttp's client (and
the TLS contexts it builds at import) took more than half of ``agents list``'s start, for one
request. ``watch`` follows a stream and uses aiohttp (:meth:`NodeClient.events`), imported then.

An https node is checked against ``$AGENT_REACH_CA_FILE`` (and shown
``$AGENT_REACH_CLIENT_CERT_FILE``/``$AGENT_REACH_CLIENT_KEY_FILE`` when it requires a client
certificate) through :class:`node.core.ClientTlsSettings`, imported only when one is set: without
them the system's trust store, and a command that starts as light as before.
"""

from __future__ import annotations

import http.client
import os
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson

from .nodenames import TLS_ENV, URL_ENV
from .operator import DEFAULT_TIMEOUT_S, NodeAnswered, Unreachable, UsageError

__all__ = ["NodeClient"]


class NodeClient:
    """The node's v1 API with one bearer token; ``with NodeClient(url, token) as client``."""

    def __init__(self, url: str, token: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"{self.url}: the node's URL is http://HOST:PORT or https://HOST:PORT")
        self._base_path = parts.path
        self._ssl = _ssl_from_environment() if parts.scheme == "https" else None
        self._connection: http.client.HTTPConnection | None = None
        self._parts = parts

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def call(self, method: str, path: str, *, params: Sequence[tuple[str, str]] | None = None,
             body: object = None) -> Any:
        """The decoded JSON answer; raises :class:`NodeAnswered` or :class:`Unreachable`.

        ``timeout_s`` bounds the connection and each read of the answer."""
        data = orjson.dumps(body) if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        target = self._base_path + path + (f"?{urlencode(params)}" if params else "")
        try:
            connection = self._connection = self._connection or self._connect()
            connection.request(method, target, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read()
        except (http.client.HTTPException, OSError) as exc:  # TimeoutError and ssl.SSLError are OSErrors
            self.__exit__()
            raise Unreachable(self._unreachable(exc)) from exc
        return self._decoded(method, path, response.status, raw)

    def _connect(self) -> http.client.HTTPConnection:
        host, port = self._parts.hostname or "", self._parts.port
        if self._ssl is None:
            return http.client.HTTPConnection(host, port, timeout=self.timeout_s)
        context = self._ssl if isinstance(self._ssl, ssl.SSLContext) else ssl.create_default_context()
        return http.client.HTTPSConnection(host, port, timeout=self.timeout_s, context=context)

    async def events(self, path: str, *, params: Sequence[tuple[str, str]] | None = None,
                     ) -> AsyncIterator[tuple[str, Any]]:
        """The server-sent events of ``path`` as ``(event, data)`` until the node ends the stream."""
        import aiohttp  # a stream: aiohttp's reader, for watch alone

        timeout = aiohttp.ClientTimeout(total=None, connect=self.timeout_s, sock_connect=self.timeout_s)
        connector = aiohttp.TCPConnector(ssl=True if self._ssl is None else self._ssl)
        try:
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {self.token}"},
                                             connector=connector) as session, \
                    session.get(self.url + path, params=params, timeout=timeout, allow_redirects=False) as response:
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
        untrusted = _untrusted_certificate(exc)
        if untrusted is not None:
            return (f"cannot reach the node at {self.url}: its certificate is not trusted "
                    f"({untrusted}); set ${TLS_ENV[0]} to the CA bundle that signed it")
        if isinstance(exc, TimeoutError):
            reason = f"no answer within {self.timeout_s:g} s"
        elif isinstance(exc, OSError) and exc.strerror:
            reason = exc.strerror.lower()
        else:
            reason = str(exc) or type(exc).__name__
        return f"cannot reach the node at {self.url}: {reason} (is it running? see --node, ${URL_ENV})"


def _untrusted_certificate(exc: BaseException) -> object | None:
    """Why the node's certificate was refused (from either client), or None for another failure."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return exc.verify_message or exc.reason
    return getattr(exc, "certificate_error", None)  # aiohttp's ClientConnectorCertificateError


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
