"""The registry node's HTTP API as the SDK calls it: requests, decoded answers, errors mapped to classes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from pydantic import BaseModel, ValidationError

from ..core import TRACEPARENT, Envelope, SendAccepted, TraceParent, current_context, looks_like_envelope
from ..core.a2a import CardRegistration
from ..core.models import CredentialRequest, Heartbeat, IssuedCredential, Load, RegisterResponse, Registration, compat
from ._errors import NodeUnreachable, node_error


def wire_json(body: BaseModel) -> bytes:
    """``body`` as sent to a node: only the fields set, and none that is null — so a node of an
    older version, which refuses fields it does not know, is sent no field this SDK added unless
    the caller used it (the node fills in the defaults, which are the same models')."""
    return body.model_dump_json(exclude_unset=True, exclude_none=True).encode()


@dataclass(slots=True)
class SendResult:
    """The answer of proxy mode (``POST /v1/send``)."""

    status: int
    body: Any
    envelope: Envelope | None
    agent_id: str | None
    duplicate: bool
    accepted: SendAccepted | None = None


class NodeApi:
    """Requests to the registry node over one aiohttp session (one per event loop)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, token: str, *, timeout_s: float) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def request(self, method: str, path: str, body: BaseModel | dict[str, Any] | None = None, *,
                      params: dict[str, str] | None = None) -> Any:
        """The decoded JSON answer; raises :class:`NodeUnreachable` or the node's error."""
        data = None
        headers = self.headers
        context = current_context()  # the program's span, when it traces: the node's span joins it
        if context is not None:
            headers = {**headers, TRACEPARENT: context.header()}
        if body is not None:
            data = wire_json(body) if isinstance(body, BaseModel) else orjson.dumps(body)
            headers = {**headers, "Content-Type": "application/json"}
        url = self.base_url + path
        try:
            async with self.session.request(method, url, data=data, headers=headers, params=params,
                                            timeout=self.timeout) as resp:
                raw = await resp.read()
                status = resp.status
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            hint = ("; give [client] ca_file (or $AGENT_REACH_CA_FILE) the CA that signed its certificate"
                    if isinstance(exc, aiohttp.ClientConnectorCertificateError) else "")
            raise NodeUnreachable(f"node {self.base_url} did not answer {method} {path}: "
                                  f"{type(exc).__name__}: {exc}{hint}") from exc
        try:
            decoded = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            decoded = raw.decode(errors="replace")
        if status >= 400:
            raise node_error(status, decoded, what=f"{method} {path} on {self.base_url}")
        return decoded

    async def register(self, registration: Registration) -> RegisterResponse:
        return compat.read_python(RegisterResponse, await self.request("POST", "/v1/agents", registration))

    async def register_card(self, card: CardRegistration) -> RegisterResponse:
        """``POST /v1/agent-cards``: register an agent from its A2A Agent Card."""
        # exclude_unset: send what the caller wrote; the card itself exactly as it was given
        body = {**card.model_dump(mode="json", exclude_unset=True, exclude={"card"}), "card": card.card.given()}
        return compat.read_python(RegisterResponse, await self.request("POST", "/v1/agent-cards", body))

    async def credential(self, request: CredentialRequest) -> IssuedCredential:
        """``POST /v1/credentials``: the route credential of one of a ticket's alternates."""
        return compat.read_python(IssuedCredential, await self.request("POST", "/v1/credentials", request))

    async def heartbeat(self, agent_id: str, heartbeat: Heartbeat) -> None:
        await self.request("PUT", f"/v1/agents/{quote(agent_id)}/heartbeat", heartbeat)

    async def report_load(self, agent_id: str, load: Load) -> None:
        await self.request("PUT", f"/v1/agents/{quote(agent_id)}/load", load)

    async def deregister(self, agent_id: str) -> None:
        await self.request("DELETE", f"/v1/agents/{quote(agent_id)}")

    async def send(self, envelope: Envelope, *, query: dict[str, str], timeout_s: float,
                   headers: dict[str, str] | None = None) -> SendResult:
        """``POST /v1/send``: the target's answer as it came, or the node's own error raised.

        Unlike :meth:`request`, an error status that carries ``X-Reach-Agent`` is the target's
        answer, returned rather than raised.
        """
        url = f"{self.base_url}/v1/send"
        try:
            async with self.session.post(url, data=envelope.to_json(), params=query,
                                         headers={**self.headers, **(headers or {}),
                                                  "Content-Type": "application/json",
                                                  **_trace_headers(envelope)},
                                         timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                raw = await resp.read()
                status = resp.status
                agent = resp.headers.get("X-Reach-Agent")
                duplicate = resp.headers.get("X-Reach-Duplicate") == "true"
                is_json = resp.content_type == "application/json"
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise NodeUnreachable(f"node {self.base_url} did not answer POST /v1/send: {exc!r}") from exc
        body: Any = raw
        if is_json and raw:
            body = orjson.loads(raw)
        if status >= 400 and agent is None:
            raise node_error(status, body, what=f"POST /v1/send on {self.base_url}")
        accepted = compat.read_python(SendAccepted, body) if status == 202 else None
        return SendResult(status=status, body=body, envelope=as_envelope(body), agent_id=agent,
                          duplicate=duplicate or bool(accepted and accepted.duplicate), accepted=accepted)


def _trace_headers(envelope: Envelope) -> dict[str, str]:
    """The W3C ``traceparent`` header of the context ``envelope`` carries, if any."""
    context = TraceParent.parse(envelope.extensions.get(TRACEPARENT))
    return {TRACEPARENT: context.header()} if context is not None else {}


def as_envelope(body: Any) -> Envelope | None:
    """``body`` as an :class:`Envelope` when it is one, else ``None`` (a target that is not envelope-aware)."""
    if not looks_like_envelope(body):
        return None
    try:
        return compat.read_python(Envelope, body)
    except ValidationError:
        return None


__all__ = ["NodeApi", "SendResult", "as_envelope"]
