"""An agent's HTTP side: :class:`AgentHost` serves what the reach layer calls and keeps the agent registered.

What every agent on the reach layer serves — the contract the README's agent example writes out
by hand, and this host keeps for a handler ``async def handle(envelope) -> result``:

* ``POST /invoke`` (the path of the registered ``endpoints.primary``): the body is an
  :class:`~node.core.envelope.Envelope`. First the caller's route credential is verified
  (``Authorization: Bearer``, :class:`~node.client.CallVerifier`): 401 without one or with an
  expired or forged one, 403 for a credential meant for another agent or a caller outside the
  registration's ``allowed_callers``. Then an envelope past ``expire_at_ms`` gets 410, an envelope
  id the same caller sent before is answered from a local cache without running the handler
  again (the receiving half of idempotency; another caller's same id is another message), and
  otherwise the handler runs with the envelope — its ``source_agent`` set to the verified
  caller — and the answer is ``envelope.reply(result)``. While the handler runs, the calls and
  sends it makes through ``host.client`` carry on the delivery's hop count and the node's signed
  stamp of it (``X-Reach-Hop``): an envelope written afresh does not restart a loop's count. A handler that
  raises :class:`HandlerRejected` answers 4xx (not retried); any other exception 500 (retried
  elsewhere when the call is idempotent).
* ``GET /healthz``: 200 while the process serves; ``GET /readyz``: 200 with the current load
  while :attr:`AgentHost.ready`, else 503.
* Registration with :class:`~node.client.ReachClient` (``host.client``, also the way to call other
  agents), heartbeats carrying ``inflight`` on their own thread, deregistration on exit.
* When the program set up OpenTelemetry, each call served is a span ``invoke_agent {agent_id}``,
  a child of the W3C ``traceparent`` it came with (header, else the envelope's), current while
  the handler runs (:mod:`node.core.tracing`).

This module loads ``aiohttp.web``; ``from node.client import …`` does not import it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from pydantic import ValidationError

from ..core import HOP_HEADER, Envelope, NodeError, SpanKind, application_spans, carried, traceparent_of
from ..core.models import Load, Registration, compat
from ._calls import INCOMING, Incoming
from ._reach_client import ReachClient
from .verifier import CallVerifier, CredentialRejected

__all__ = ["ANSWER_CACHE_SIZE", "AgentHost", "Handler", "HandlerRejected"]

Handler = Callable[[Envelope], Awaitable[Any]]
ANSWER_CACHE_SIZE = 1_000
INVOKE_PATH = "/invoke"


class HandlerRejected(NodeError):
    """Raised by a handler: the request itself is wrong (answered with ``status``, 4xx; not retried)."""

    status = 422
    code = "rejected"

    def __init__(self, message: str, *, status: int = 422, code: str | None = None) -> None:
        if not 400 <= status < 500:
            raise ValueError("a rejection is a 4xx status")
        super().__init__(message, code=code)
        self.status = status


class AgentHost:
    """Serves one agent's handler over HTTP and keeps it registered; an async context manager.

    ``registration`` is a :class:`Registration` or its fields; without ``endpoints`` the host
    registers ``{"primary": "http://<host>:<bound port>/invoke"}``. ``node_url``/``token`` default
    to ``$AGENT_REACH_URL``/``$AGENT_REACH_TOKEN``; other keywords are ``ReachClient`` settings.
    ``verify_calls=False`` serves calls without checking their route credential (the agent then
    trusts its network instead: say so in ``labels``).
    """

    def __init__(self, registration: Registration | Mapping[str, Any], handler: Handler, *,
                 node_url: str | None = None, token: str | None = None, host: str = "127.0.0.1", port: int = 0,
                 verify_calls: bool = True, **client_options: Any) -> None:
        self._fields = registration.model_dump() if isinstance(registration, Registration) else dict(registration)
        self.agent_id: str = self._fields["agent_id"]
        self.handler = handler
        self.node_url = node_url
        self.token = token
        self.host = host
        self.port = port
        self.verify_calls = verify_calls
        self.client_options = client_options
        self.ready = True
        self.inflight = 0
        self.handled = 0
        self.refused: dict[str, int] = {}  # credential refusals by code (observability and tests)
        self.url = ""
        self.client: ReachClient | None = None
        self.verifier: CallVerifier | None = None
        self._answers: OrderedDict[tuple[str, str, str], bytes] = OrderedDict()  # (role, caller, id)
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> AgentHost:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Listen, then register (the endpoint must answer before the node sends anyone)."""
        app = web.Application()
        fields = dict(self._fields)
        path = INVOKE_PATH
        if "endpoints" in fields:
            path = urlsplit(fields["endpoints"]["primary"]).path or "/"
        app.router.add_post(path, self._invoke)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
            self.url = f"http://{self.host}:{_bound_port(self._runner)}"
            fields.setdefault("endpoints", {"primary": f"{self.url}{INVOKE_PATH}"})
            self.client = ReachClient(self.node_url, token=self.token, registration=fields,
                                      load=lambda: Load(inflight=self.inflight), **self.client_options)
            registration = self.client.registration
            if self.verify_calls and registration is not None:
                self.verifier = self.client.call_verifier()
            await self.client.start()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Deregister and stop serving. Idempotent."""
        if self.client is not None:
            await self.client.aclose()
        if self.verifier is not None:
            await self.verifier.aclose()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _invoke(self, request: web.Request) -> web.Response:
        caller = None
        if self.verifier is not None:
            try:
                caller = await self.verifier.verify(request.headers.get("Authorization"))
            except CredentialRejected as exc:
                self.refused[exc.code] = self.refused.get(exc.code, 0) + 1
                return web.json_response(exc.body(), status=exc.status)
        try:
            envelope = compat.read_json(Envelope, await request.read())
        except ValidationError as exc:
            return web.json_response({"error": "invalid_envelope", "message": str(exc.errors()[0]["msg"]),
                                      "field": None}, status=400)
        if envelope.expired():
            return web.json_response({"error": "envelope_expired", "message": "nobody may act on it", "field": None},
                                     status=410)
        # A retry is the same caller's same id: ids are often business keys another caller can
        # know, and must not get it this caller's answer nor stop the handler running for it.
        answer_key = (caller.rol.value, caller.sub, envelope.id) if caller is not None else ("", "", envelope.id)
        cached = self._answers.get(answer_key)
        if cached is not None:  # the same message again (a retry): same answer, no second execution
            return web.Response(body=cached, content_type="application/json")
        if caller is not None:  # who calls is what the credential says, not what the envelope claims
            envelope = envelope.model_copy(update={"source_agent": caller.sub})
        self.inflight += 1
        # The agent's span, when the program traces: a child of the hop that delivered the call, and
        # current while the handler runs, so the calls it makes (envelope.child()) are its children.
        # What the handler's calls and sends carry on: this delivery's hop count and the node's stamp.
        attributes = {"gen_ai.agent.id": self.agent_id, "agent_reach.caller": envelope.source_agent}
        with application_spans().invoke_agent(envelope, kind=SpanKind.SERVER, name=self.agent_id, **attributes,
                                              parent=traceparent_of(envelope, request.headers)) as span:
            envelope = carried(envelope, span.context)
            carrying = INCOMING.set(Incoming(envelope.hop_count, request.headers.get(HOP_HEADER)))
            try:
                result = await self.handler(envelope)
            except HandlerRejected as exc:
                span.fail(f"{exc.status} {exc.code}")
                return web.json_response(exc.body(), status=exc.status)
            finally:
                INCOMING.reset(carrying)
                self.inflight -= 1
        self.handled += 1
        body = envelope.reply(result).to_json()
        self._answers[answer_key] = body
        if len(self._answers) > ANSWER_CACHE_SIZE:
            self._answers.popitem(last=False)
        return web.Response(body=body, content_type="application/json")

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "agent_id": self.agent_id})

    async def _readyz(self, request: web.Request) -> web.Response:
        return web.json_response({"ready": self.ready, "inflight": self.inflight}, status=200 if self.ready else 503)


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return address[1]
    raise RuntimeError("the runner has no listening TCP site")
