"""The sidecar's call path: verify each call's route credential, then forward it to the agent.

With ``[sidecar] upstream`` set, :class:`Gateway` listens where the agent is registered
(``endpoints.primary``'s host and port, or ``[sidecar] listen``) and, for every request:

* ``GET /healthz`` and ``GET /readyz`` are answered by the sidecar from its probes of the agent
  (no credential: the node's probes and load balancers call them);
* everything else must carry a route credential for this agent (``Authorization: Bearer``,
  checked by :class:`node.client.CallVerifier` with the region's keys): 401 without one or with
  an expired or forged one, 403 for another agent's or for a caller outside ``allowed_callers``;
* what passes goes to ``upstream`` + the same path and query, with the body and ``Content-Type``,
  the ``X-Reach-*`` headers, the W3C trace context (``traceparent``, ``tracestate``), and ``X-Reach-Caller`` / ``X-Reach-Caller-Role`` saying who the
  credential names (any such header a caller sent is dropped first); the credential itself is
  not passed on. The agent's answer comes back as it is; an agent that does not answer is a 502.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from node.client import CallVerifier, CredentialRejected

log = logging.getLogger(__name__)

__all__ = ["CALLER_HEADER", "CALLER_ROLE_HEADER", "Gateway"]

CALLER_HEADER = "X-Reach-Caller"
CALLER_ROLE_HEADER = "X-Reach-Caller-Role"
# Header names are compared lower-cased (HTTP says case does not matter). The W3C trace context
# passes unchanged, as through any intermediary that does not trace itself: the agent's span is
# then the caller's child (node.client.host).
_PASSED_ON = ("content-type", "accept", "traceparent", "tracestate")
_SET_HERE = (CALLER_HEADER.lower(), CALLER_ROLE_HEADER.lower())


class Gateway:
    """Verifies and forwards calls for one agent; ``start()`` listens, ``aclose()`` stops. Idempotent close."""

    def __init__(self, *, verifier: CallVerifier, upstream: str, listen: tuple[str, int], max_body_bytes: int,
                 timeout_s: float, status: Callable[[], tuple[bool, bool]],
                 ssl_context: ssl.SSLContext | bool = True) -> None:
        self.verifier = verifier
        self.ssl_context = ssl_context  # an https upstream is checked against it (the agent's [client] ca_file)
        self.upstream = upstream.rstrip("/")
        self.listen = listen
        self.max_body_bytes = max_body_bytes
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.status = status  # (alive, ready) as the sidecar's probes last saw the agent
        self.forwarded = 0
        self.refused: dict[str, int] = {}
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl_context))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, *self.listen).start()

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.verifier.aclose()

    async def _healthz(self, request: web.Request) -> web.Response:
        alive, _ = self.status()
        return web.json_response({"ok": alive}, status=200 if alive else 503)

    async def _readyz(self, request: web.Request) -> web.Response:
        _, ready = self.status()
        return web.json_response({"ready": ready}, status=200 if ready else 503)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        try:
            caller = await self.verifier.verify(request.headers.get("Authorization"))
        except CredentialRejected as exc:
            self.refused[exc.code] = self.refused.get(exc.code, 0) + 1
            return web.json_response(exc.body(), status=exc.status)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return web.json_response({"error": "payload_too_large", "message": f"the body exceeds the sidecar's "
                                      f"{self.max_body_bytes} bytes (max_body_bytes)", "field": None}, status=413)
        headers = {name: value for name, value in request.headers.items()
                   if (lowered := name.lower()) in _PASSED_ON
                   or (lowered.startswith("x-reach-") and lowered not in _SET_HERE)}
        headers[CALLER_HEADER] = caller.sub
        headers[CALLER_ROLE_HEADER] = caller.rol.value
        url = self.upstream + request.rel_url.path_qs
        session = self._session
        if session is None:
            return web.json_response({"error": "sidecar_stopping", "message": "the sidecar is stopping",
                                      "field": None}, status=503)
        try:
            async with session.request(request.method, url, data=body, headers=headers, timeout=self.timeout,
                                       allow_redirects=False) as answer:
                content = await answer.read()
                status, content_type = answer.status, answer.headers.get("Content-Type")
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("the agent at %s did not answer %s %s: %r", self.upstream, request.method, request.path, exc)
            return web.json_response({"error": "agent_unreachable", "message": f"the agent at {self.upstream} did "
                                      f"not answer: {type(exc).__name__}", "field": None}, status=502)
        self.forwarded += 1
        response = web.Response(status=status, body=content)
        if content_type:
            response.headers["Content-Type"] = content_type
        return response


def listen_address(primary: str, listen: str | None) -> tuple[str, int]:
    """Where the gateway listens: ``listen`` (host:port), else the primary endpoint's host and port."""
    if listen:
        host, _, port = listen.rpartition(":")
        return host, int(port)
    parts = urlsplit(primary)
    return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)
