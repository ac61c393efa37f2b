"""``POST /v1/send``: the node routes and delivers an envelope itself, for traffic that must be audited.

``POST /v1/send`` (body: an :class:`~node.core.envelope.Envelope`; query ``delivery=sync|callback``,
optional ``version`` and ``scope``):

1. **Refusals first.** ``hop_count`` — the highest of the envelope's, the ``X-Reach-Hop`` stamp
   the sender got with the delivery it acts on, and the trace's ledger (:mod:`node.http.proxy.hops`):
   an agent can raise it, never lower it — at or beyond the maximum (default 5) is refused with 422
   ``hop_limit_exceeded`` — an A→B→A loop dies after five hops instead of storming; an envelope
   past ``expire_at_ms`` is refused with 410 ``envelope_expired`` (no ghost messages).
2. **Once per id** (:mod:`node.store.once`). A repeated envelope id — concurrent or later, on this
   replica or another — is answered from the stored answer with ``X-Reach-Duplicate: true`` and
   is not delivered again. A send that fails releases its claim, so the caller may retry.
3. **Route and deliver** with the SDK's attempt and failover (:mod:`node.delivery.attempts`, where
   the rules are written down): the router picks the target (``target_agent`` as agent_id or
   pattern, else ``operation`` as the capability; ``extensions.conversation_id`` for affinity);
   the node POSTs the envelope with ``hop_count + 1`` (and its stamp), ``source_agent`` set from the caller's
   token and the target's route credential (``Authorization: Bearer``, naming the caller, as on a
   direct call), through its egress-checked session. Idempotent envelopes fail over, others get one
   attempt. A target's 4xx is passed through as its answer. Outcomes feed the router's breakers.
   **Passthrough** targets get the raw payload, and their answer is returned as is.
4. **Callbacks.** ``delivery=callback`` answers 202 at once and sends the result (or a
   ``reach.delivery_failed`` event) to the sending agent's *registered* ``callback_endpoint`` —
   never to an address found in the payload, and only for an agent (or admin) token: a caller
   token named like an agent is not that agent. At most ``max_background`` such deliveries are in
   flight, at most ``max_background_per_caller`` (default: a tenth of them) of one tenant (its
   token's role and subject): one tenant's slow endpoint fills its own share, not the pool
   (:mod:`node.http.proxy.callbacks`).
5. **Route events.** Every decision, delivery attempt, outcome, duplicate, refusal and callback
   goes to the node's trace log (:mod:`node.http.traces`). ``GET /v1/policy`` tells a client the
   region's rules before it registers.

Limits are ``NodeConfig.proxy`` (:class:`~node.config.ProxySettings`); the sends are counted in
``NodeMetrics.proxy_sends`` (``agent_reach_proxy_sends``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from ...config import ProxySettings
from ...core import (Conflict, Envelope, EnvelopeExpired, EnvelopeType, HopLimitExceeded, NodeError, Policy,
                    RouteEvent, RouteEventKind, SendAccepted, Span, SpanKind, StoreUnavailable,
                    ValidationFailed, carried, now_ms, seconds_hint, traceparent_of)
from ...core.models import (CredentialRequest, Outcome, OutcomeReport, RouteRequest, RouteTarget, RouteTicket,
                           TokenClaims, TokenRole, compat)
from ...delivery import Failover, Pacing, Tried, deliver
from ...routing import reachable_transports
from ...service import RegistryNode
from ...store import Answer, DeliveryInProgress, OnceCache
from ...trust import EgressPolicy, PayloadPolicy, egress_denial, egress_session, mask_secrets, tenant_of
from ..plumbing import CALLER, json_response, parse_body, validation_error
from ..traces import TraceLog, charged, install_trace_routes
from .callbacks import CallbackPool, post_callback
from .hops import HOP_HEADER, HopLedger
from .results import described, kept_result, result_envelope

log = logging.getLogger(__name__)

# A claim outlives the send's budget by this much, so a slow first send is not taken for a dead one.
_CLAIM_GRACE_MS = 10_000


# -- errors ----------------------------------------------------------------------------------


class NoCallbackEndpoint(ValidationFailed):
    """``delivery=callback`` needs the caller to be registered with a ``callback_endpoint``."""

    code = "no_callback_endpoint"


class DeliveryFailed(NodeError):
    """Every delivery attempt failed; ``details.attempts`` says why each did."""

    status = 502
    code = "delivery_failed"


class DuplicateEnvelope(Conflict):
    """The id was delivered already and its answer was too large to keep for duplicates."""

    code = "duplicate_envelope"


# -- the proxy -------------------------------------------------------------------------------


class _EgressGuard:
    """The region's egress policy as the delivery's guard (the session's connector checks the rest)."""

    def __init__(self, policy: EgressPolicy) -> None:
        self.policy = policy

    def check_url(self, url: str) -> None:
        self.policy.check_url(url)

    def denial(self, exc: BaseException) -> NodeError | None:
        return egress_denial(exc)


class Proxy:
    """Delivers envelopes for callers; owns its HTTP session and background deliveries."""

    def __init__(self, node: RegistryNode, *, traces: TraceLog, rng: random.Random | None = None) -> None:
        self.node = node
        self.settings: ProxySettings = node.config.proxy
        self.egress: EgressPolicy = node.config.egress
        self.guard = _EgressGuard(self.egress)
        self.policy = self.settings.retry_policy()
        self.limits = self.settings.attempt_limits(owner="the proxy's")
        self.payload = PayloadPolicy(refused_keys=self.settings.refused_payload_keys,
                                     passthrough=self.settings.payload_policy_passthrough, region=node.region)
        self.rng = rng or random.Random()
        self.traces = traces  # api.py's direct-mode decisions still reach the log through here
        self.hops = HopLedger(traces.redis, signer=node.signer, prefix=traces.prefix, region=node.region,
                              ttl_ms=self.settings.trace_ttl_ms)
        self.once = OnceCache.of(node.store, node_id=node.node_id, ttl_ms=self.settings.idempotency_ttl_ms,
                                 pending_ttl_ms=self.settings.request_timeout_ms + _CLAIM_GRACE_MS,
                                 max_body_bytes=self.settings.idempotency_max_body_bytes)
        self.session: aiohttp.ClientSession | None = None
        self.callbacks = CallbackPool(self.settings)
        self._closed = False

    async def start(self) -> None:
        self.session = egress_session(self.egress, ssl_context=self.node.config.client_ssl_context())

    async def aclose(self) -> None:
        """Cancel background deliveries and close the session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.callbacks.aclose()
        if self.session is not None:
            await self.session.close()

    # -- handlers ----------------------------------------------------------------------------

    async def handle_send(self, request: web.Request) -> web.Response:
        caller: TokenClaims = request[CALLER]
        envelope = await parse_body(request, Envelope)
        envelope = carried(envelope, traceparent_of(envelope, request.headers))  # the caller's W3C context travels on
        delivery = request.query.get("delivery", "sync")
        if delivery not in ("sync", "callback"):
            raise ValidationFailed("delivery must be sync or callback", field="delivery")
        route = self._route_request(envelope, request)
        envelope = await self.hops.counted(envelope, caller.sub, request.headers.get(HOP_HEADER))
        if route.capability:
            self.node.budgets.spend(caller, route.capability)
        self.traces.refuse_if_over(charged(caller))
        callback_endpoint = self._callback_endpoint(caller) if delivery == "callback" else None
        # A callback send is answered before routing: what every local target would refuse, refuse now.
        await self._refuse_if_needed(envelope, caller, reachable_transports(
            self.node.cache.index, agent_id=route.agent_id, capability=route.capability) if callback_endpoint else [])
        wait_s = self.settings.request_timeout_ms / 1000 + 1.0

        if callback_endpoint is not None:
            async def accept() -> Answer:
                self.callbacks.spawn(self._deliver_later(envelope, route, caller, callback_endpoint), tenant_of(caller))
                body = SendAccepted(id=envelope.id, trace_id=envelope.trace_id, callback_endpoint=callback_endpoint)
                return Answer(202, "application/json", body.model_dump_json().encode())

            answer, duplicate = await self.once.run(self.once.key(tenant_of(caller), envelope.id), accept,
                                                    wait_s=wait_s)
        else:
            async def deliver_now() -> Answer:
                events: list[RouteEvent] = []
                try:
                    answer = await self._deliver(envelope, route, caller, events)
                finally:
                    await self.traces.append(events, charge=charged(caller))
                await self.traces.keep_result(kept_result(envelope, caller, answer, delivery="sync",
                                                          max_bytes=self.settings.result_max_bytes),
                                              charge=charged(caller))
                return answer

            answer, duplicate = await self.once.run(self.once.key(tenant_of(caller), envelope.id), deliver_now,
                                                    wait_s=wait_s)
        if duplicate:
            self._count("duplicate")
            await self.traces.append([self._event(RouteEventKind.DUPLICATE, envelope, caller, result="duplicate",
                                                  status=answer.status, agent_id=answer.headers.get("X-Reach-Agent"),
                                                  detail="answered from the idempotency cache, not delivered again")],
                                     charge=charged(caller))
            return self._duplicate_response(answer)
        self._count("accepted" if callback_endpoint else "delivered")
        return _response(answer)

    async def handle_policy(self, request: web.Request) -> web.Response:
        config = self.node.config
        return json_response(Policy(region=self.node.region, allowed_transports=config.allowed_transports,
                                    max_body_bytes=config.max_body_bytes, max_hops=self.settings.max_hops,
                                    ticket_ttl_ms=config.ticket_ttl_ms, egress_allow=list(config.egress.allow),
                                    egress_deny=list(config.egress.deny), caller=request[CALLER],
                                    refused_payload_keys=sorted(self.payload.refused_keys)))

    # -- checks ------------------------------------------------------------------------------

    def _route_request(self, envelope: Envelope, request: web.Request) -> RouteRequest:
        target = envelope.target_agent
        data: dict[str, Any] = {"trace_id": envelope.trace_id}
        if target and "*" in target:
            data["pattern"] = target
            if envelope.operation:
                data["capability"] = envelope.operation
        elif target:
            data["agent_id"] = target
        elif envelope.operation:
            data["capability"] = envelope.operation
        else:
            raise ValidationFailed("give target_agent or operation (the capability to route by)", field="operation")
        conversation = envelope.extensions.get("conversation_id")
        if isinstance(conversation, str):
            data["conversation_id"] = conversation
        for name in ("version", "scope"):
            if name in request.query:
                data[name] = request.query[name]
        try:
            return RouteRequest.model_validate(data)
        except ValidationError as exc:
            raise validation_error(exc) from exc

    async def _refuse_if_needed(self, envelope: Envelope, caller: TokenClaims, transports: list[str]) -> None:
        refusal: NodeError | None = None
        if envelope.hop_count >= self.settings.max_hops:
            refusal = HopLimitExceeded(
                f"hop_count {envelope.hop_count} reached the limit of {self.settings.max_hops} hops: "
                "a loop between agents, or a chain longer than this region allows", field="hop_count")
        elif envelope.expire_at_ms is not None and (hint := seconds_hint("expire_at_ms", envelope.expire_at_ms)):
            refusal = ValidationFailed(hint, field="expire_at_ms", code="expire_at_in_seconds",
                                       details={"use": "expire_at_ms"})
        elif envelope.expired(now_ms=now_ms()):
            refusal = EnvelopeExpired(f"the envelope expired at {envelope.expire_at_ms} ms; send a new one",
                                      field="expire_at_ms")
        else:  # transports: the targets a callback send may reach, judged before it is answered
            refusal = self.payload.refusal(envelope.payload, envelope.extensions, transports)
        if refusal is None:
            return
        self._count(refusal.code)
        await self.traces.append([self._event(RouteEventKind.REFUSED, envelope, caller, result=refusal.code,
                                              status=refusal.status, detail=refusal.message)],
                                 charge=charged(caller))
        raise refusal

    def _callback_endpoint(self, caller: TokenClaims) -> str:
        record = self.node.find(caller.sub) if caller.role in (TokenRole.AGENT, TokenRole.ADMIN) else None
        if record is None or not record.callback_endpoint:
            raise NoCallbackEndpoint(f"{caller.role.value} {caller.sub!r} has no registered callback_endpoint; send "
                                     "with the token of an agent registered with one (results never go to an "
                                     "address written in the payload)", field="callback_endpoint")
        return record.callback_endpoint

    # -- delivery ----------------------------------------------------------------------------

    async def _deliver(self, envelope: Envelope, route: RouteRequest, caller: TokenClaims,
                       events: list[RouteEvent]) -> Answer:
        """Route and deliver with failover for idempotent envelopes; raises DeliveryFailed. The node's
        span of it (``invoke_agent``, each attempt a ``delivery`` event) is the parent of the agent's."""
        with self.node.tracing.spans.invoke_agent(envelope, kind=SpanKind.SERVER, parent=traceparent_of(envelope),
                                                  **{"agent_reach.region": self.node.region,
                                                     "agent_reach.caller": caller.sub}) as span:
            return await self._deliver_in(span, carried(envelope, span.context), route, caller, events)

    async def _deliver_in(self, span: Span, envelope: Envelope, route: RouteRequest, caller: TokenClaims,
                          events: list[RouteEvent]) -> Answer:
        started = time.monotonic()
        budget_s = self.settings.request_timeout_ms / 1000
        remaining_ms = envelope.remaining_ms(now_ms=now_ms())
        if remaining_ms is not None:
            budget_s = min(budget_s, remaining_ms / 1000)
        failures: list[dict[str, Any]] = []

        async def decide(request: RouteRequest, *, fresh: bool) -> RouteTicket:
            ticket = await self._decide(request, first=not fresh, envelope=envelope, caller=caller, events=events)
            self._check_payload(envelope, ticket.target, caller, events)
            await self.hops.delivering(envelope.trace_id, envelope.hop_count + 1,
                                       [ticket.target.agent_id, *(other.agent_id for other in ticket.alternates)])
            return ticket

        def stamp(target: RouteTarget) -> dict[str, str]:
            return {HOP_HEADER: self.hops.stamp(envelope.trace_id, envelope.hop_count + 1, target.agent_id)}

        def on_attempt(tried: Tried) -> None:
            self._after_attempt(tried, envelope, caller, events, failures)
            span.event("delivery", {"gen_ai.agent.id": tried.pick.target.agent_id, "agent_reach.attempt": tried.index,
                                    "agent_reach.outcome": tried.outcome.value,
                                    "http.response.status_code": tried.status})

        async def issue(ticket: RouteTicket, target: RouteTarget) -> str:
            self._check_payload(envelope, target, caller, events)
            request = CredentialRequest(signature=ticket.signature, agent_id=target.agent_id)
            return self.node.issue_credential(request, caller).credential

        delivery = await deliver(
            envelope.forwarded().model_copy(update={"source_agent": caller.sub}),
            Failover(route, resolve=decide, issue=issue),
            session=self._require_session, limits=self.limits, pacing=Pacing(self.policy, self.rng),
            max_attempts=self.settings.max_attempts if envelope.idempotent else 1, deadline=started + budget_s,
            on_attempt=on_attempt, guard=self.guard, stamp=stamp)
        answered = delivery.answered
        if answered is not None and answered.answer is not None:
            target, answer = answered.pick.target, answered.answer
            span.set("gen_ai.agent.id", target.agent_id)
            events.append(self._event(RouteEventKind.OUTCOME, envelope, caller, target=target, result="delivered",
                                      status=answer.status, latency_ms=(time.monotonic() - started) * 1000))
            return Answer(answer.status, answer.content_type, answer.body, headers={
                "X-Reach-Agent": target.agent_id, "X-Reach-Region": target.region,
                "X-Reach-Attempts": str(answered.index + 1), "X-Reach-Trace-Id": envelope.trace_id,
                "X-Reach-Envelope-Id": envelope.id})
        self._count("failed")
        note = "" if envelope.idempotent else " (one attempt: the envelope is not marked idempotent)"
        message = (f"could not deliver {envelope.id} after {len(failures)} attempt(s){note}: "
                   + ("; ".join(f"{f['agent_id']}: {f['error']}" for f in failures) or "no agent to try"))
        events.append(self._event(RouteEventKind.OUTCOME, envelope, caller, result="failed", detail=message[:1000]))
        raise DeliveryFailed(message, details={"attempts": failures})

    async def _decide(self, request: RouteRequest, *, first: bool, envelope: Envelope, caller: TokenClaims,
                      events: list[RouteEvent]) -> RouteTicket:
        """A ticket from the router in process; every decision (or why there is none) joins the trace."""
        noted = mask_secrets(envelope.extensions) if envelope.extensions else None
        try:
            ticket = await self.node.resolve(request, caller, extensions=noted)
        except NodeError as exc:
            events.append(self._event(RouteEventKind.DECISION, envelope, caller, result=exc.code, detail=exc.message))
            if first:
                self._count(exc.code)
            raise
        alternates = ", ".join(a.agent_id for a in ticket.alternates) or "none"
        detail = f"ticket {ticket.ticket_id}, {ticket.locality.value}; alternates: {alternates}"
        events.append(self._event(RouteEventKind.DECISION, envelope, caller, target=ticket.target,
                                  result=ticket.match.kind.value, detail=detail, extensions=noted))
        return ticket

    def _check_payload(self, envelope: Envelope, target: RouteTarget, caller: TokenClaims,
                       events: list[RouteEvent]) -> None:
        """The region's payload policy (``node.trust.payload``) for a send to ``target``: raises
        :class:`~node.trust.PayloadRefused` before anything is delivered."""
        refusal = self.payload.refusal(envelope.payload, envelope.extensions, [target.transport])
        if refusal is not None:
            self._count(refusal.code)
            events.append(self._event(RouteEventKind.REFUSED, envelope, caller, target=target, result=refusal.code,
                                      status=refusal.status, detail=refusal.message))
            raise refusal

    def _after_attempt(self, tried: Tried, envelope: Envelope, caller: TokenClaims, events: list[RouteEvent],
                       failures: list[dict[str, Any]]) -> None:
        """The outcome sink: the router's breakers (as a report), the trace, and DeliveryFailed's details."""
        target, failure = tried.pick.target, tried.failure
        events.append(self._event(RouteEventKind.DELIVERY, envelope, caller, target=target, attempt=tried.index,
                                  result=tried.outcome.value if failure is not None else "success",
                                  status=tried.status, latency_ms=tried.latency_ms,
                                  detail=str(failure) if failure is not None else None))
        self._report(tried.pick.ticket, target, tried.outcome, tried.latency_ms, caller)
        if failure is not None:
            failures.append(described(target.agent_id, failure))

    def _require_session(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise StoreUnavailable("the proxy is not started", code="proxy_not_started")
        return self.session

    def _report(self, ticket: RouteTicket, target: RouteTarget, outcome: Outcome, latency_ms: float,
                caller: TokenClaims) -> None:
        try:
            self.node.report(OutcomeReport(signature=ticket.signature, agent_id=target.agent_id, outcome=outcome,
                                           latency_ms=round(latency_ms, 3)), caller)
        except NodeError as exc:  # the node signed this ticket a moment ago; only a clock jump gets here
            log.warning("could not record the outcome of %s: %s", target.agent_id, exc.message)

    async def _deliver_later(self, envelope: Envelope, route: RouteRequest, caller: TokenClaims,
                             callback_endpoint: str) -> None:
        events: list[RouteEvent] = []
        try:
            status, agent = 200, {}
            try:
                answer = await self._deliver(envelope, route, caller, events)
                result = result_envelope(envelope, caller, answer)
                agent = {"X-Reach-Agent": answer.headers["X-Reach-Agent"]}
            except NodeError as exc:
                result = Envelope(type=EnvelopeType.EVENT, operation="reach.delivery_failed",
                                  payload={"error": exc.code, "message": exc.message, "details": exc.details},
                                  trace_id=envelope.trace_id, target_agent=caller.sub, reply_to_id=envelope.id,
                                  hop_count=envelope.hop_count + 1, expire_at_ms=envelope.expire_at_ms)
                status = exc.status
            kept = kept_result(envelope, caller, Answer(status, "application/json", result.to_json(), agent),
                               delivery="callback", max_bytes=self.settings.result_max_bytes)
            await self.traces.keep_result(kept, charge=charged(caller))
            await self._callback(callback_endpoint, result, envelope, caller, events)
        finally:
            await self.traces.append(events, charge=charged(caller))

    async def _callback(self, url: str, result: Envelope, original: Envelope, caller: TokenClaims,
                        events: list[RouteEvent]) -> None:
        if self.session is None:
            return

        def recorded(attempt: int, status: int | None, latency_ms: float, error: str | None) -> None:
            events.append(self._event(RouteEventKind.CALLBACK, original, caller, endpoint=url, attempt=attempt,
                                      agent_id=caller.sub, result="success" if error is None else "failure",
                                      status=status, latency_ms=latency_ms, detail=error))

        await post_callback(self.session, url, result, original, settings=self.settings, egress=self.egress,
                            backoff_s=lambda attempt: self.policy.backoff_s(attempt, self.rng), on_attempt=recorded)

    # -- helpers -----------------------------------------------------------------------------

    def _count(self, result: str) -> None:
        self.node.metrics.count(self.node.metrics.proxy_sends, result)

    def _event(self, kind: RouteEventKind, envelope: Envelope, caller: TokenClaims, *,
               target: RouteTarget | None = None, **fields: Any) -> RouteEvent:
        if target is not None:
            fields.setdefault("agent_id", target.agent_id)
            fields.setdefault("region", target.region)
            fields.setdefault("endpoint", target.endpoint)
        if fields.get("latency_ms") is not None:
            fields["latency_ms"] = round(fields["latency_ms"], 3)
        if fields.get("detail"):
            fields["detail"] = fields["detail"][:1000]
        return RouteEvent(event=kind, at_ms=now_ms(), trace_id=envelope.trace_id, caller=caller.sub,
                          envelope_id=envelope.id, **fields)

    def _duplicate_response(self, answer: Answer) -> web.Response:
        if answer.too_large:
            raise DuplicateEnvelope("this envelope id was delivered already; its answer was too large to keep",
                                    field="id")
        body = answer.body
        if answer.status == 202:
            accepted = compat.read_json(SendAccepted, body).model_copy(update={"duplicate": True})
            body = accepted.model_dump_json().encode()
        response = _response(Answer(answer.status, answer.content_type, body, dict(answer.headers)))
        response.headers["X-Reach-Duplicate"] = "true"
        return response


def _response(answer: Answer) -> web.Response:
    headers = {"Content-Type": answer.content_type, **answer.headers}
    return web.Response(status=answer.status, body=answer.body, headers=headers)


PROXY_KEY = web.AppKey("proxy", Proxy)


def install_proxy_routes(app: web.Application, node: RegistryNode) -> None:
    """Add ``/v1/send`` and ``/v1/policy`` (and the trace routes, unless installed) to a node's app."""
    traces = install_trace_routes(app, node)
    proxy = Proxy(node, traces=traces)
    app[PROXY_KEY] = proxy

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await proxy.start()
        yield
        await proxy.aclose()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/send", proxy.handle_send)
    app.router.add_get("/v1/policy", proxy.handle_policy)


__all__ = ["PROXY_KEY", "DeliveryFailed", "DeliveryInProgress", "DuplicateEnvelope", "EnvelopeExpired",
           "HopLimitExceeded", "NoCallbackEndpoint", "Proxy", "install_proxy_routes"]
