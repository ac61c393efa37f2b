"""Proxy mode: the node routes and delivers an envelope itself, for traffic that must be audited.

``POST /v1/send`` (body: an :class:`~node.envelope.Envelope`; query ``delivery=sync|callback``,
optional ``version`` and ``scope``):

1. **Refusals first.** ``hop_count`` at or beyond the maximum (default 5) is refused with 422
   ``hop_limit_exceeded`` — an A→B→A loop dies after five hops instead of storming; an envelope
   past ``expire_at_ms`` is refused with 410 ``envelope_expired`` (no ghost messages).
2. **Once per id.** The envelope id (scoped by the caller's identity) is claimed in the region's
   Redis with ``SET NX``; a repeated id — concurrent or later, on this replica or another — is
   answered from the stored answer with ``X-Reach-Duplicate: true`` and is not delivered again.
   A send that fails releases its claim, so the caller may retry with the same id.
3. **Route and deliver.** The router picks the target (``target_agent`` as agent_id or pattern,
   else ``operation`` as the capability; ``extensions.conversation_id`` for affinity). The node
   POSTs the envelope with ``hop_count + 1`` and ``source_agent`` set from the caller's token to
   the target's endpoint. Idempotent envelopes fail over to an alternate or a fresh decision
   (never the same agent twice); others get one attempt. Outcomes feed the router's breaker.
   **Passthrough** targets (``transport = "passthrough"``) get the raw payload, and their answer
   is returned as is (status, content type, body).
4. **Callbacks.** ``delivery=callback`` answers 202 at once and sends the result (or a
   ``reach.delivery_failed`` event) to the caller's *registered* ``callback_endpoint`` — never
   to an address found in the payload.
5. **Route events.** Every decision, delivery attempt, outcome, duplicate, refusal and callback
   is appended to the trace's list in the region's Redis (``{prefix}:{region}:trace:{trace_id}``,
   TTL and a length cap); ``GET /v1/traces/{trace_id}`` reads it back, so a caller whose answer
   was lost can find out what happened. Clients add their direct-call deliveries with
   ``POST /v1/traces``. ``GET /v1/policy`` tells a client the region's rules before it registers.

Keys (all under the region's hash tag, next to :mod:`node.store`'s)::

    {prefix}:{region}:send:{caller}:{envelope_id}  STRING  the claim, then the stored answer (TTL)
    {prefix}:{region}:trace:{trace_id}             LIST    route events, oldest first (TTL, capped)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import random
import re
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.exceptions import RedisError

from .agentconfig import RetryPolicy
from .egress import EgressDenied, EgressPolicy, egress_denial, egress_session
from .envelope import (
    DEFAULT_MAX_HOPS,
    MAX_HOPS_CEILING,
    PASSTHROUGH,
    TRACE_ID_PATTERN,
    Envelope,
    EnvelopeExpired,
    EnvelopeType,
    HopLimitExceeded,
    Policy,
    RouteEvent,
    RouteEventKind,
    RouteEvents,
    SendAccepted,
    Trace,
    looks_like_envelope,
    raw_payload,
)
from .errors import Conflict, Forbidden, NodeError, NotFound, RateLimited, StoreUnavailable, ValidationFailed
from .http import CALLER, json_response, parse_body, validation_error
from .models import Outcome, OutcomeReport, RouteRequest, RouteTarget, RouteTicket, TokenClaims, TokenRole
from .service import RegistryNode
from .store import now_ms

log = logging.getLogger(__name__)

DEFAULT_IDEMPOTENCY_TTL_MS = 600_000
DEFAULT_TRACE_TTL_MS = 86_400_000
DEFAULT_TRACE_MAX_EVENTS = 1_000
DEFAULT_IDEMPOTENCY_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_BACKGROUND = 1_000
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
_POLL_INTERVAL_S = 0.02
_TRACE_RE = re.compile(TRACE_ID_PATTERN)

# Compare-and-delete: release a claim only if it is still ours.
_RELEASE = """
local cur = redis.call('GET', KEYS[1])
if cur and string.find(cur, ARGV[1], 1, true) then return redis.call('DEL', KEYS[1]) end
return 0
"""


# -- errors ----------------------------------------------------------------------------------


class NoCallbackEndpoint(ValidationFailed):
    """``delivery=callback`` needs the caller to be registered with a ``callback_endpoint``."""

    code = "no_callback_endpoint"


class DeliveryFailed(NodeError):
    """Every delivery attempt failed; ``details.attempts`` says why each did."""

    status = 502
    code = "delivery_failed"


class DeliveryInProgress(Conflict):
    """Another send with the same envelope id is still being delivered: retry later with the same id."""

    code = "delivery_in_progress"


class DuplicateEnvelope(Conflict):
    """The id was delivered already and its answer was too large to keep for duplicates."""

    code = "duplicate_envelope"


# -- settings --------------------------------------------------------------------------------


class ProxySettings(BaseModel):
    """Limits of proxy mode; the defaults serve most regions (``configure_proxy`` to change them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_hops: int = Field(default=DEFAULT_MAX_HOPS, ge=1, le=MAX_HOPS_CEILING)
    connect_timeout_ms: int = Field(default=3_000, ge=1)
    read_timeout_ms: int = Field(default=30_000, ge=1)
    request_timeout_ms: int = Field(default=30_000, ge=1, description="Budget of one send, all attempts included.")
    max_attempts: int = Field(default=3, ge=1, le=10, description="For idempotent envelopes; others get one.")
    retry_initial_backoff_ms: int = Field(default=100, ge=0)
    retry_max_backoff_ms: int = Field(default=2_000, ge=0)
    retry_multiplier: float = Field(default=2.0, ge=1.0)
    jitter_ratio: float = Field(default=0.2, ge=0.0, lt=1.0)
    idempotency_ttl_ms: int = Field(default=DEFAULT_IDEMPOTENCY_TTL_MS, ge=1_000)
    idempotency_max_body_bytes: int = Field(default=DEFAULT_IDEMPOTENCY_MAX_BODY_BYTES, ge=0)
    trace_ttl_ms: int = Field(default=DEFAULT_TRACE_TTL_MS, ge=1_000)
    trace_max_events: int = Field(default=DEFAULT_TRACE_MAX_EVENTS, ge=1, le=100_000)
    callback_attempts: int = Field(default=3, ge=1, le=10)
    max_background: int = Field(default=DEFAULT_MAX_BACKGROUND, ge=1,
                                description="Callback-mode deliveries in flight; beyond it sends get 429.")
    max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, ge=1,
                                    description="A target's answer (decoded) beyond this fails the attempt.")

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(initial_backoff_s=self.retry_initial_backoff_ms / 1000, multiplier=self.retry_multiplier,
                           max_backoff_s=max(self.retry_max_backoff_ms, self.retry_initial_backoff_ms) / 1000,
                           jitter_ratio=self.jitter_ratio, max_attempts=self.max_attempts)


_SETTINGS: weakref.WeakKeyDictionary[RegistryNode, ProxySettings] = weakref.WeakKeyDictionary()
_COUNTERS: weakref.WeakKeyDictionary[object, Any] = weakref.WeakKeyDictionary()


def configure_proxy(node: RegistryNode, settings: ProxySettings) -> None:
    """Use ``settings`` for ``node``'s proxy (call before the app is built)."""
    _SETTINGS[node] = settings


def _sends_counter(node: RegistryNode) -> Any:
    counter = _COUNTERS.get(node.metrics)
    if counter is None:
        counter = Counter("agent_reach_proxy_sends", "Proxy-mode sends by result", ["result"],
                          registry=node.metrics.registry).labels
        _COUNTERS[node.metrics] = counter
    return counter


# -- the trace log ---------------------------------------------------------------------------


class TraceLog:
    """Route events per trace_id in the region's Redis: a capped list with a TTL."""

    def __init__(self, node: RegistryNode, *, ttl_ms: int, max_events: int) -> None:
        self.redis = node.store.redis
        self.prefix = f"{node.store.key_base}:trace:"
        self.ttl_ms = ttl_ms
        self.max_events = max_events

    def key(self, trace_id: str) -> str:
        return self.prefix + trace_id

    async def append(self, events: list[RouteEvent]) -> None:
        """Append events (one pipeline); a Redis failure is logged, never raised: the send stands."""
        if not events:
            return
        grouped: dict[str, list[str]] = {}
        for event in events:
            grouped.setdefault(event.trace_id, []).append(event.model_dump_json(exclude_none=True))
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for trace_id, items in grouped.items():
                    key = self.key(trace_id)
                    pipe.rpush(key, *items)
                    pipe.ltrim(key, -self.max_events, -1)
                    pipe.pexpire(key, self.ttl_ms)
                await pipe.execute()
        except RedisError as exc:
            log.warning("could not record %d route events: %s", len(events), exc)

    async def read(self, trace_id: str) -> list[RouteEvent]:
        try:
            raw = await self.redis.lrange(self.key(trace_id), 0, -1)
        except RedisError as exc:
            raise StoreUnavailable(f"cannot read trace {trace_id} from Redis: {exc}") from exc
        events = []
        for item in raw:
            try:
                events.append(RouteEvent.model_validate_json(item))
            except ValidationError:
                log.warning("skipping an unreadable event in %s", self.key(trace_id))
        return events


# -- once-per-id -----------------------------------------------------------------------------


@dataclass(slots=True)
class Answer:
    """What a send answered; stored so a duplicate gets the same answer."""

    status: int
    content_type: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    too_large: bool = False

    def dump(self) -> str:
        return orjson.dumps({"state": "done", "status": self.status, "content_type": self.content_type,
                             "headers": self.headers, "too_large": self.too_large,
                             "body": "" if self.too_large else base64.b64encode(self.body).decode()}).decode()

    @classmethod
    def load(cls, data: dict[str, Any]) -> Answer:
        return cls(status=int(data["status"]), content_type=str(data["content_type"]),
                   body=base64.b64decode(data.get("body") or ""), headers=dict(data.get("headers") or {}),
                   too_large=bool(data.get("too_large")))


class OnceCache:
    """Runs a delivery at most once per key across all replicas of a region.

    Concurrent duplicates in this process wait on the first one's future; duplicates on other
    replicas poll the stored claim until the answer is there.
    """

    def __init__(self, node: RegistryNode, *, ttl_ms: int, pending_ttl_ms: int, max_body_bytes: int) -> None:
        self.redis = node.store.redis
        self.prefix = f"{node.store.key_base}:send:"
        self.node_id = node.node_id
        self.ttl_ms = ttl_ms
        self.pending_ttl_ms = pending_ttl_ms
        self.max_body_bytes = max_body_bytes
        self._release = self.redis.register_script(_RELEASE)
        self._inflight: dict[str, asyncio.Future[Answer]] = {}
        self.waiting = 0  # duplicates now waiting for a first send's answer

    def key(self, caller: str, envelope_id: str) -> str:
        return f"{self.prefix}{caller}:{envelope_id}"

    async def run(self, key: str, deliver: Callable[[], Awaitable[Answer]], *, wait_s: float) -> tuple[Answer, bool]:
        """``(answer, duplicate)``: the stored answer of an earlier send, or ``deliver()``'s.

        Raises what ``deliver`` raises (to concurrent duplicates too, which did not deliver),
        :class:`DeliveryInProgress` when another replica's send outlasts ``wait_s``.
        """
        deadline = time.monotonic() + wait_s
        while True:
            local = self._inflight.get(key)
            if local is not None:
                self.waiting += 1
                try:
                    return await asyncio.shield(local), True
                except _ClaimAgain:
                    continue
                finally:
                    self.waiting -= 1
            future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
            self._inflight[key] = future
            try:
                answer, duplicate = await self._claim_and_deliver(key, deliver, deadline)
            except _ClaimAgain as exc:
                _fail(future, exc)
                continue
            except asyncio.CancelledError:
                _fail(future, DeliveryInProgress("the first send of this envelope id was cancelled; "
                                                 "retry with the same id", field="id"))
                raise
            except Exception as exc:
                _fail(future, exc)
                raise
            else:
                future.set_result(answer)
                return answer, duplicate
            finally:
                if self._inflight.get(key) is future:
                    del self._inflight[key]

    async def _claim_and_deliver(self, key: str, deliver: Callable[[], Awaitable[Answer]],
                                 deadline: float) -> tuple[Answer, bool]:
        token = os.urandom(8).hex()
        claim = orjson.dumps({"state": "pending", "node": self.node_id, "token": token}).decode()
        async with _redis_errors("claim the envelope id"):
            claimed = await self.redis.set(key, claim, nx=True, px=self.pending_ttl_ms)
        if not claimed:
            stored = await self._wait_stored(key, deadline)
            if stored is None:
                raise _ClaimAgain()  # the other send failed and released the id: claim it ourselves
            return stored, True
        try:
            answer = await deliver()
        except BaseException:
            with contextlib.suppress(RedisError):
                await self._release(keys=[key], args=[token])
            raise
        await self._store(key, answer)
        return answer, False

    async def _store(self, key: str, answer: Answer) -> None:
        if len(answer.body) > self.max_body_bytes:
            answer = Answer(answer.status, answer.content_type, b"", dict(answer.headers), too_large=True)
        async with _redis_errors("store the answer for duplicates"):
            await self.redis.set(key, answer.dump(), px=self.ttl_ms)

    async def _wait_stored(self, key: str, deadline: float) -> Answer | None:
        self.waiting += 1
        try:
            return await self._poll_stored(key, deadline)
        finally:
            self.waiting -= 1

    async def _poll_stored(self, key: str, deadline: float) -> Answer | None:
        while True:
            async with _redis_errors("read the envelope id's claim"):
                raw = await self.redis.get(key)
            if raw is None:
                return None
            data = orjson.loads(raw)
            if data.get("state") == "done":
                return Answer.load(data)
            if time.monotonic() >= deadline:
                raise DeliveryInProgress("a send with this envelope id is still being delivered; "
                                         "retry later with the same id to get its answer", field="id")
            await asyncio.sleep(_POLL_INTERVAL_S)


class _ClaimAgain(Exception):
    """The id's earlier send failed and released it: try to claim it again."""


def _fail(future: asyncio.Future[Answer], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
        future.exception()  # mark it retrieved: there may be no concurrent duplicate waiting


@contextlib.asynccontextmanager
async def _redis_errors(what: str) -> AsyncIterator[None]:
    try:
        yield
    except RedisError as exc:
        raise StoreUnavailable(f"cannot {what} in Redis: {exc}") from exc


# -- the proxy -------------------------------------------------------------------------------


class _Failed(Exception):
    def __init__(self, outcome: Outcome, message: str, *, status: int | None = None,
                 egress: EgressDenied | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.status = status
        self.egress = egress

    def attempt(self, agent_id: str) -> dict[str, Any]:
        """How ``DeliveryFailed.details.attempts`` describes this failure."""
        described: dict[str, Any] = {"agent_id": agent_id, "error": str(self), "status": self.status}
        if self.egress is not None:
            described["reason"] = self.egress.code
            described["egress"] = {"address": self.egress.address, "rule": self.egress.rule}
        return described


class _ResponseTooLarge(Exception):
    """A target's answer grew past ``max_response_bytes``."""


class Proxy:
    """Delivers envelopes for callers; owns its HTTP session and background deliveries."""

    def __init__(self, node: RegistryNode, settings: ProxySettings, *, rng: random.Random | None = None) -> None:
        self.node = node
        self.settings = settings
        self.egress: EgressPolicy = node.config.egress
        self.policy = settings.retry_policy()
        self.rng = rng or random.Random()
        self.traces = TraceLog(node, ttl_ms=settings.trace_ttl_ms, max_events=settings.trace_max_events)
        self.once = OnceCache(node, ttl_ms=settings.idempotency_ttl_ms,
                              pending_ttl_ms=settings.request_timeout_ms + 10_000,
                              max_body_bytes=settings.idempotency_max_body_bytes)
        self.sends = _sends_counter(node)
        self.session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def start(self) -> None:
        self.session = egress_session(self.egress)

    async def aclose(self) -> None:
        """Cancel background deliveries and close the session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.session is not None:
            await self.session.close()

    # -- handlers ----------------------------------------------------------------------------

    async def handle_send(self, request: web.Request) -> web.Response:
        caller: TokenClaims = request[CALLER]
        envelope = await parse_body(request, Envelope)
        delivery = request.query.get("delivery", "sync")
        if delivery not in ("sync", "callback"):
            raise ValidationFailed("delivery must be sync or callback", field="delivery")
        route = self._route_request(envelope, request)
        await self._refuse_if_needed(envelope, caller)
        callback_endpoint = self._callback_endpoint(caller) if delivery == "callback" else None
        wait_s = self.settings.request_timeout_ms / 1000 + 1.0

        if callback_endpoint is not None:
            async def accept() -> Answer:
                self._spawn(self._deliver_later(envelope, route, caller, callback_endpoint))
                body = SendAccepted(id=envelope.id, trace_id=envelope.trace_id, callback_endpoint=callback_endpoint)
                return Answer(202, "application/json", body.model_dump_json().encode())

            answer, duplicate = await self.once.run(self.once.key(caller.sub, envelope.id), accept, wait_s=wait_s)
        else:
            async def deliver() -> Answer:
                events: list[RouteEvent] = []
                try:
                    return await self._deliver(envelope, route, caller, events)
                finally:
                    await self.traces.append(events)

            answer, duplicate = await self.once.run(self.once.key(caller.sub, envelope.id), deliver, wait_s=wait_s)
        if duplicate:
            self.sends("duplicate").inc()
            await self.traces.append([self._event(RouteEventKind.DUPLICATE, envelope, caller, result="duplicate",
                                                  status=answer.status, agent_id=answer.headers.get("X-Reach-Agent"),
                                                  detail="answered from the idempotency cache, not delivered again")])
            return self._duplicate_response(answer)
        self.sends("accepted" if callback_endpoint else "delivered").inc()
        return _response(answer)

    async def handle_trace(self, request: web.Request) -> web.Response:
        caller: TokenClaims = request[CALLER]
        trace_id = request.match_info["trace_id"]
        if not _TRACE_RE.match(trace_id):
            raise ValidationFailed("trace_id must be 1-100 characters of [A-Za-z0-9_.:-]", field="trace_id")
        events = await self.traces.read(trace_id)
        if caller.role is not TokenRole.ADMIN:
            events = [event for event in events
                      if caller.sub in (event.caller, event.agent_id) and self._may_see_agent(caller, event.agent_id)]
        if not events:
            raise NotFound(f"region {self.node.region} has no events of trace {trace_id} that you took part in "
                           "(traces expire; events go to the region that handled the send)",
                           field="trace_id", code="unknown_trace")
        return json_response(Trace(trace_id=trace_id, region=self.node.region, count=len(events), events=events))

    def _may_see_agent(self, caller: TokenClaims, agent_id: str | None) -> bool:
        """An event naming an agent whose ``allowed_callers`` exclude the caller is not shown."""
        record = self.node.find(agent_id) if agent_id else None
        return record is None or self.node.visible(record, caller)

    async def handle_trace_events(self, request: web.Request) -> web.Response:
        caller: TokenClaims = request[CALLER]
        batch = await parse_body(request, RouteEvents)
        for event in batch.events:
            if caller.role is not TokenRole.ADMIN and event.caller != caller.sub:
                raise Forbidden(f"a token for {caller.sub!r} may only record its own calls, not {event.caller!r}",
                                field="events.caller")
        await self.traces.append([event.model_copy(update={"mode": "direct"}) for event in batch.events])
        return json_response({"accepted": len(batch.events)})

    async def handle_policy(self, request: web.Request) -> web.Response:
        config = self.node.config
        return json_response(Policy(region=self.node.region, allowed_transports=config.allowed_transports,
                                    max_body_bytes=config.max_body_bytes, max_hops=self.settings.max_hops,
                                    ticket_ttl_ms=config.ticket_ttl_ms, egress_allow=list(config.egress.allow),
                                    egress_deny=list(config.egress.deny), caller=request[CALLER]))

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

    async def _refuse_if_needed(self, envelope: Envelope, caller: TokenClaims) -> None:
        refusal: NodeError | None = None
        if envelope.hop_count >= self.settings.max_hops:
            refusal = HopLimitExceeded(
                f"hop_count {envelope.hop_count} reached the limit of {self.settings.max_hops} hops: "
                "a loop between agents, or a chain longer than this region allows", field="hop_count")
        elif envelope.expired(now_ms=now_ms()):
            refusal = EnvelopeExpired(f"the envelope expired at {envelope.expire_at_ms} ms; send a new one",
                                      field="expire_at_ms")
        if refusal is None:
            return
        self.sends(refusal.code).inc()
        await self.traces.append([self._event(RouteEventKind.REFUSED, envelope, caller, result=refusal.code,
                                              status=refusal.status, detail=refusal.message)])
        raise refusal

    def _callback_endpoint(self, caller: TokenClaims) -> str:
        record = self.node.find(caller.sub)
        if record is None or not record.callback_endpoint:
            raise NoCallbackEndpoint(f"{caller.sub!r} has no registered callback_endpoint; register one "
                                     "(results never go to an address written in the payload)",
                                     field="callback_endpoint")
        return record.callback_endpoint

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        if len(self._tasks) >= self.settings.max_background:
            if asyncio.iscoroutine(coroutine):
                coroutine.close()
            raise RateLimited(f"{len(self._tasks)} background deliveries in flight; retry shortly")
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a background delivery failed: %r", task.exception(), exc_info=task.exception())

    # -- delivery ----------------------------------------------------------------------------

    async def _deliver(self, envelope: Envelope, route: RouteRequest, caller: TokenClaims,
                       events: list[RouteEvent]) -> Answer:
        """Route and deliver with failover for idempotent envelopes; raises DeliveryFailed."""
        settings = self.settings
        started = time.monotonic()
        budget_s = settings.request_timeout_ms / 1000
        remaining_ms = envelope.remaining_ms(now_ms=now_ms())
        if remaining_ms is not None:
            budget_s = min(budget_s, remaining_ms / 1000)
        deadline = started + budget_s
        forwarded = envelope.forwarded().model_copy(update={"source_agent": caller.sub})
        max_attempts = settings.max_attempts if envelope.idempotent else 1
        tried: list[str] = []
        failures: list[dict[str, Any]] = []
        queue: list[tuple[RouteTicket, RouteTarget]] = []
        for attempt in range(max_attempts):
            if attempt > 0:
                delay = self.policy.backoff_s(attempt - 1, self.rng)
                if time.monotonic() + delay >= deadline:
                    break
                await asyncio.sleep(delay)
            pick = await self._next_target(route, queue, tried, envelope, caller, events)
            if pick is None:
                break
            ticket, target = pick
            tried.append(target.agent_id)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            began = time.perf_counter()
            try:
                answer = await self._post(target, forwarded.model_copy(update={"target_agent": target.agent_id}),
                                          remaining)
            except _Failed as failure:
                latency = (time.perf_counter() - began) * 1000
                failures.append(failure.attempt(target.agent_id))
                events.append(self._event(RouteEventKind.DELIVERY, envelope, caller, target=target, attempt=attempt,
                                          result=failure.outcome.value, status=failure.status, latency_ms=latency,
                                          detail=str(failure)))
                self._report(ticket, target, failure.outcome, latency, caller)
                continue
            latency = (time.perf_counter() - began) * 1000
            events.append(self._event(RouteEventKind.DELIVERY, envelope, caller, target=target, attempt=attempt,
                                      result="success", status=answer.status, latency_ms=latency))
            events.append(self._event(RouteEventKind.OUTCOME, envelope, caller, target=target, result="delivered",
                                      status=answer.status, latency_ms=(time.monotonic() - started) * 1000))
            self._report(ticket, target, Outcome.SUCCESS, latency, caller)
            answer.headers.update({"X-Reach-Agent": target.agent_id, "X-Reach-Region": target.region,
                                   "X-Reach-Attempts": str(attempt + 1), "X-Reach-Trace-Id": envelope.trace_id,
                                   "X-Reach-Envelope-Id": envelope.id})
            return answer
        self.sends("failed").inc()
        note = "" if envelope.idempotent else " (one attempt: the envelope is not marked idempotent)"
        message = (f"could not deliver {envelope.id} after {len(failures)} attempt(s){note}: "
                   + ("; ".join(f"{f['agent_id']}: {f['error']}" for f in failures) or "no agent to try"))
        events.append(self._event(RouteEventKind.OUTCOME, envelope, caller, result="failed", detail=message[:1000]))
        raise DeliveryFailed(message, details={"attempts": failures})

    async def _next_target(self, route: RouteRequest, queue: list[tuple[RouteTicket, RouteTarget]], tried: list[str],
                           envelope: Envelope, caller: TokenClaims, events: list[RouteEvent]
                           ) -> tuple[RouteTicket, RouteTarget] | None:
        while queue:
            ticket, target = queue.pop(0)
            if target.agent_id not in tried:
                return ticket, target
        request = route.model_copy(update={"exclude": list(tried)}) if tried else route
        try:
            ticket = await self.node.resolve(request, caller)
        except NodeError as exc:
            events.append(self._event(RouteEventKind.DECISION, envelope, caller, result=exc.code, detail=exc.message))
            if tried:
                return None
            self.sends(exc.code).inc()
            raise
        alternates = ", ".join(a.agent_id for a in ticket.alternates) or "none"
        events.append(self._event(RouteEventKind.DECISION, envelope, caller, target=ticket.target,
                                  result=ticket.match.kind.value,
                                  detail=f"ticket {ticket.ticket_id}, {ticket.locality.value}; alternates: {alternates}"))
        queue.extend((ticket, target) for target in (ticket.target, *ticket.alternates)
                     if target.agent_id not in tried)
        return queue.pop(0) if queue else None

    async def _post(self, target: RouteTarget, envelope: Envelope, remaining_s: float) -> Answer:
        session = self.session
        if session is None:
            raise StoreUnavailable("the proxy is not started", code="proxy_not_started")
        if target.transport == PASSTHROUGH:
            data, content_type = raw_payload(envelope.payload)
        else:
            data, content_type = envelope.to_json(), "application/json"
        timeout = aiohttp.ClientTimeout(total=remaining_s, sock_connect=self.settings.connect_timeout_ms / 1000,
                                        sock_read=self.settings.read_timeout_ms / 1000)
        headers = {"Content-Type": content_type, "X-Reach-Trace-Id": envelope.trace_id,
                   "X-Reach-Envelope-Id": envelope.id, "X-Reach-Hop-Count": str(envelope.hop_count)}
        self._check_egress(target.endpoint)
        limit = self.settings.max_response_bytes
        try:
            # Redirects are never followed: a target could bounce the node to an address the
            # egress policy was only asked about once (and a 307 would re-send the body).
            async with session.post(target.endpoint, data=data, headers=headers, timeout=timeout,
                                    allow_redirects=False) as response:
                status = response.status
                if 300 <= status < 400:
                    raise _Failed(Outcome.FAILURE, f"HTTP {status}: the target answered a redirect"
                                  f"{_location(response)}; the node never follows redirects (register the final URL)",
                                  status=status)
                body = await _read_bounded(response, limit)
                response_type = response.headers.get("Content-Type", "application/octet-stream")
        except asyncio.CancelledError:
            raise
        except _ResponseTooLarge as exc:
            raise _Failed(Outcome.FAILURE, f"the answer exceeds the proxy's limit of {limit} bytes "
                          "(max_response_bytes); send large results by reference") from exc
        except TimeoutError as exc:
            raise _Failed(Outcome.TIMEOUT, "timed out") from exc
        except (aiohttp.ClientError, OSError) as exc:
            denied = egress_denial(exc)
            if denied is not None:
                raise _Failed(Outcome.FAILURE, f"egress_denied: {denied.message}", egress=denied) from exc
            raise _Failed(Outcome.FAILURE, f"{type(exc).__name__}: {exc}") from exc
        if status >= 500 or status in (408, 429):
            raise _Failed(Outcome.REJECTED if status == 429 else Outcome.FAILURE, f"HTTP {status}", status=status)
        return Answer(status, response_type, body)

    def _check_egress(self, url: str) -> None:
        """The static half of the egress policy (scheme, userinfo, literal hosts); the connector does the rest."""
        try:
            self.egress.check_url(url)
        except EgressDenied as denied:
            raise _Failed(Outcome.FAILURE, f"egress_denied: {denied.message}", egress=denied) from denied

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
            try:
                answer = await self._deliver(envelope, route, caller, events)
                result = _result_envelope(envelope, caller, answer)
            except NodeError as exc:
                result = Envelope(type=EnvelopeType.EVENT, operation="reach.delivery_failed",
                                  payload={"error": exc.code, "message": exc.message, "details": exc.details},
                                  trace_id=envelope.trace_id, target_agent=caller.sub, reply_to_id=envelope.id,
                                  hop_count=envelope.hop_count + 1, expire_at_ms=envelope.expire_at_ms)
            await self._callback(callback_endpoint, result, envelope, caller, events)
        finally:
            await self.traces.append(events)

    async def _callback(self, url: str, result: Envelope, original: Envelope, caller: TokenClaims,
                        events: list[RouteEvent]) -> None:
        session = self.session
        if session is None:
            return
        timeout = aiohttp.ClientTimeout(total=self.settings.read_timeout_ms / 1000,
                                        sock_connect=self.settings.connect_timeout_ms / 1000)
        headers = {"Content-Type": "application/json", "X-Reach-Trace-Id": result.trace_id,
                   "X-Reach-Reply-To": original.id}
        for attempt in range(self.settings.callback_attempts):
            if attempt:
                await asyncio.sleep(self.policy.backoff_s(attempt - 1, self.rng))
            began = time.perf_counter()
            status: int | None = None
            denied: EgressDenied | None = None
            try:
                self._check_egress(url)
                # The body is not read: only the status matters, and an unread answer cannot
                # fill the node's memory (the connection is closed instead of reused).
                async with session.post(url, data=result.to_json(), headers=headers, timeout=timeout,
                                        allow_redirects=False) as response:
                    status = response.status
                error = None if status < 300 else f"HTTP {status}"
            except asyncio.CancelledError:
                raise
            except _Failed as failure:
                denied, error = failure.egress, str(failure)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                denied = egress_denial(exc)
                error = f"egress_denied: {denied.message}" if denied else f"{type(exc).__name__}: {exc}"
            latency = (time.perf_counter() - began) * 1000
            events.append(self._event(RouteEventKind.CALLBACK, original, caller, endpoint=url, attempt=attempt,
                                      agent_id=caller.sub, result="success" if error is None else "failure",
                                      status=status, latency_ms=latency, detail=error))
            if error is None:
                return
            if denied is not None:
                break  # the policy will say the same on every retry
        log.warning("could not deliver the result of %s to %s", original.id, url)

    # -- helpers -----------------------------------------------------------------------------

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
            accepted = SendAccepted.model_validate_json(body).model_copy(update={"duplicate": True})
            body = accepted.model_dump_json().encode()
        response = _response(Answer(answer.status, answer.content_type, body, dict(answer.headers)))
        response.headers["X-Reach-Duplicate"] = "true"
        return response


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, counted as it arrives; raises :class:`_ResponseTooLarge` past ``limit`` bytes.

    aiohttp's stream reader pauses the socket while its buffer is full, so at most ``limit`` plus
    one chunk is ever held; the caller's context exit then closes the connection.
    """
    declared = response.content_length
    if declared is not None and declared > limit:
        raise _ResponseTooLarge()
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise _ResponseTooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def _location(response: aiohttp.ClientResponse) -> str:
    location = response.headers.get("Location")
    return f" to {location[:200]!r}" if location else ""


def _response(answer: Answer) -> web.Response:
    headers = {"Content-Type": answer.content_type, **answer.headers}
    return web.Response(status=answer.status, body=answer.body, headers=headers)


def _result_envelope(request: Envelope, caller: TokenClaims, answer: Answer) -> Envelope:
    """What goes to the callback: the target's response envelope, or its raw answer wrapped in one."""
    decoded: Any = answer.body
    if answer.content_type.startswith("application/json"):
        with contextlib.suppress(orjson.JSONDecodeError):
            decoded = orjson.loads(answer.body)
    if looks_like_envelope(decoded):
        with contextlib.suppress(ValidationError):
            response = Envelope.model_validate(decoded)
            if response.reply_to_id is None:
                response = response.model_copy(update={"reply_to_id": request.id})
            return response
    if isinstance(decoded, bytes):
        decoded = decoded.decode(errors="replace")
    return Envelope(type=EnvelopeType.RESPONSE, operation=request.operation, payload=decoded,
                    trace_id=request.trace_id, source_agent=answer.headers.get("X-Reach-Agent"),
                    target_agent=caller.sub, reply_to_id=request.id, hop_count=request.hop_count + 1,
                    expire_at_ms=request.expire_at_ms, extensions={"status": answer.status})


PROXY_KEY = web.AppKey("proxy", Proxy)


def install_proxy_routes(app: web.Application, node: RegistryNode) -> None:
    """Add ``/v1/send``, ``/v1/traces`` and ``/v1/policy`` to a node's app (called by ``build_app``)."""
    proxy = Proxy(node, _SETTINGS.get(node) or ProxySettings())
    app[PROXY_KEY] = proxy

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await proxy.start()
        yield
        await proxy.aclose()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/send", proxy.handle_send)
    app.router.add_get("/v1/traces/{trace_id}", proxy.handle_trace)
    app.router.add_post("/v1/traces", proxy.handle_trace_events)
    app.router.add_get("/v1/policy", proxy.handle_policy)


__all__ = ["DeliveryFailed", "DeliveryInProgress", "DuplicateEnvelope", "EnvelopeExpired", "HopLimitExceeded",
           "NoCallbackEndpoint", "Proxy", "ProxySettings", "TraceLog", "configure_proxy", "install_proxy_routes"]
