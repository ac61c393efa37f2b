"""The agent SDK: register, stay alive, find others and call them — ``ReachClient``.

::

    async with ReachClient("http://127.0.0.1:7070", token=TOKEN, registration=registration,
                           load=lambda: Load(inflight=server.inflight)) as reach:
        result = await reach.call("translate.text", {"text": "退款说明", "target_lang": "en"},
                                  idempotent=True)

What it guarantees:

* **Registration** retries with backoff until the node answers (``register_max_wait_ms`` caps
  it); a rejection (bad token, forbidden transport, invalid field) raises at once.
* **Heartbeats** run on their own thread with their own event loop and HTTP session
  (``heartbeat_in_thread=True``, the default): an agent handler that blocks the caller's event
  loop — synchronous I/O, a CPU-bound step — does not stop them. The ``load`` callback is
  called on that thread, so it must be thread-safe (reading counters is). A pure-Python busy
  loop holding the GIL still lets the heartbeat thread run every ``sys.getswitchinterval()``
  (5 ms); only a C extension that holds the GIL for longer than the lease can starve it.
  ``unknown_agent`` (the lease lapsed) re-registers from the same thread.
* **Close** stops heartbeats, flushes outcome reports and deregisters.
* ``resolve()`` caches a ticket until it expires; a failure of its target evicts it.
* ``call()`` POSTs an :class:`~node.envelope.Envelope` to the target (the raw payload for
  ``transport = "passthrough"``) with separate connect, read and overall timeouts. Only
  ``idempotent=True`` calls are retried: after the wait of :class:`RetryPolicy` they move to an
  alternate of the ticket or a fresh decision that excludes every agent already tried — never
  the same address twice. A breaker per target skips agents that keep failing. Every attempt's
  outcome goes to ``/v1/reports`` in the background, batched.

Errors (the node's tree, :mod:`node.errors`, plus)::

    NodeError
    └── ClientError               base of what only the SDK raises
        ├── NodeUnreachable       503 the node did not answer (connection refused, timeout)
        ├── NodeRejected          the node answered with an error this SDK has no class for
        └── CallFailed            502 no attempt of call() succeeded; ``.attempts`` says why each failed
            ├── CallRejected      the target answered 4xx (not retried: the request is wrong)
            └── CallTimeout       504 the overall request timeout passed

A node error with a known code is raised as its own class (``NoAgentAvailable``,
``UnknownAgent``, ``Unauthorized``, :class:`~node.envelope.HopLimitExceeded`,
:class:`~node.envelope.EnvelopeExpired` …) with the node's code, message, field and details.
``call()`` raises those last two itself before sending: a direct call is a hop, like a
proxied one, so ``hop_count`` is incremented and an A→B→A loop stops at ``max_hops`` (5).

This module is the facade; the parts live in private modules: ``_client_errors`` (the tree
above), ``_client_http`` (the node's API), ``_heartbeat``, ``_reports`` (batched outcome
reports), ``_retry`` (backoff, breaker, failover order), ``_tickets`` (the ticket cache) and
``_delivery`` (one attempt at a target).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from pydantic import ValidationError

from ._client_errors import (
    Attempt,
    CallFailed,
    CallRejected,
    CallTimeout,
    ClientError,
    NodeRejected,
    NodeUnreachable,
    node_error,
)
from ._client_http import NodeApi, SendResult
from ._delivery import AttemptError, deliver
from ._heartbeat import Heartbeater, HeartbeatStats, LoadCallback
from ._reports import Reporter
from ._retry import ClientBreakers, Failover, Pick, Sleep, register_with_backoff
from ._tickets import TicketCache
from .agentconfig import (
    AgentConfig,
    AgentConfigError,
    ClientSettings,
    RetryPolicy,
    load_agent_config,
)
from .envelope import (
    Envelope,
    EnvelopeExpired,
    EnvelopeType,
    HopLimitExceeded,
    Policy,
    RouteEvent,
    RouteEventKind,
    Trace,
    epoch_ms,
)
from .errors import NodeError, UnknownAgent, ValidationFailed
from .models import (
    Outcome,
    OutcomeReport,
    RegisterResponse,
    Registration,
    RouteRequest,
    RouteTicket,
    Scope,
    Status,
)
from .outcomes import BreakerState, OutcomeTracker

log = logging.getLogger(__name__)


@dataclass(slots=True)
class CallResult:
    """A successful call: who answered, what, and how many attempts it took."""

    agent_id: str
    region: str
    endpoint: str
    status: int
    body: Any
    envelope: Envelope | None
    trace_id: str
    request: Envelope
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def payload(self) -> Any:
        """The response envelope's payload, or the raw body when the target is not envelope-aware."""
        return self.envelope.payload if self.envelope is not None else self.body


class ClientState(enum.Enum):
    """Where a :class:`ReachClient` is in its life; it is started once and closed once."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class ReachClient:
    """An agent's (or a plain caller's) connection to its region's registry node.

    Build it with keywords or from an agent TOML file (:mod:`node.agentconfig`)::

        ReachClient("http://127.0.0.1:7070", token=token, registration={...}, connect_timeout_ms=1000)
        ReachClient(config="agent.toml", load=current_load)

    Keywords beyond the named ones are :class:`ClientSettings` fields and override the file.
    ``clock`` (monotonic seconds), ``sleep`` and ``rng`` are injectable so tests can check the
    backoff and breaker without wall time. Without a ``registration`` it only calls others.
    """

    def __init__(self, node_url: str | None = None, *, token: str | None = None,
                 registration: Registration | Mapping[str, Any] | None = None,
                 config: AgentConfig | str | Path | None = None, settings: ClientSettings | None = None,
                 load: LoadCallback | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Sleep = asyncio.sleep, rng: random.Random | None = None, **options: Any) -> None:
        if isinstance(config, (str, Path)):
            config = load_agent_config(config)
        base = settings or (config.client if config is not None else ClientSettings())
        if options:
            try:
                base = ClientSettings.model_validate({**base.model_dump(), **options})
            except ValidationError as exc:
                key, problem = _first_problem(exc)
                raise AgentConfigError(f"client option {key}: {problem}", field=key) from exc
        self.settings = base
        url = node_url or (config.node.url if config is not None else None)
        if not url:
            raise AgentConfigError("give the node URL (node_url= or [node] url in the config)", field="node.url")
        self.node_url = url.rstrip("/")
        self.token = token or (config.resolve_token() if config is not None else None) or ""
        if not self.token:
            raise AgentConfigError("give a bearer token (token= or [node] token* in the config)", field="node.token")
        if registration is None and config is not None:
            registration = config.agent
        if registration is not None and not isinstance(registration, Registration):
            try:
                registration = Registration.model_validate(dict(registration))
            except ValidationError as exc:
                key, problem = _first_problem(exc)
                raise AgentConfigError(f"registration {key}: {problem}", field=key) from exc
        self.registration: Registration | None = registration
        self.load = load
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.retry_policy = self.settings.retry_policy()
        self.breakers = OutcomeTracker(failure_threshold=self.settings.breaker_failures,
                                       window_ms=self.settings.breaker_window_ms,
                                       cooldown_ms=self.settings.breaker_cooldown_ms)
        # the same breakers on this client's clock, remembering which targets it has seen
        self._target_breakers = ClientBreakers(self.breakers, now_ms=self._now_ms)
        self.state = ClientState.NEW
        self.registered: RegisterResponse | None = None
        self.backoffs_s: list[float] = []  # every wait call() slept, in order (observability and tests)
        self._status: Status | None = None
        self._session: aiohttp.ClientSession | None = None
        self._api: NodeApi | None = None
        self._heartbeater: Heartbeater | None = None
        self._reporter: Reporter | None = None
        self._tickets = TicketCache(clock=clock)

    @classmethod
    def from_config(cls, path: str | Path, **kwargs: Any) -> ReachClient:
        return cls(config=path, **kwargs)

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> ReachClient:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Open the session; with a registration, register (with backoff) and start heartbeats."""
        if self.state is not ClientState.NEW:
            return
        self.state = ClientState.STARTING
        try:
            self._session = aiohttp.ClientSession()
            self._api = NodeApi(self._session, self.node_url, self.token,
                                timeout_s=self.settings.node_timeout_ms / 1000)
            self._reporter = Reporter(self._api, batch_size=self.settings.report_batch_size,
                                      flush_interval_s=self.settings.report_flush_interval_ms / 1000,
                                      queue_limit=self.settings.report_queue_limit,
                                      flush_timeout_s=2 * self.settings.node_timeout_ms / 1000)
            self._reporter.start()
            if self.registration is not None:
                await self.register()
        except BaseException:
            await self.aclose()
            raise
        self.state = ClientState.RUNNING

    async def register(self) -> RegisterResponse:
        """Register (retrying until the node answers) and make sure heartbeats run."""
        if self.registration is None:
            raise AgentConfigError("this client has no registration", field="agent")
        registration = self.registration
        if self._status is not None:
            registration = registration.model_copy(update={"status": self._status})
        max_wait = self.settings.register_max_wait_ms
        self.registered = await register_with_backoff(
            self._require_api(), registration, self.retry_policy, rng=self.rng, sleep=self.sleep, clock=self.clock,
            max_wait_s=None if max_wait is None else max_wait / 1000,
            stopping=lambda: self.state in (ClientState.CLOSING, ClientState.CLOSED))
        if self._heartbeater is None:
            interval_ms = self.settings.heartbeat_interval_ms or self.registered.heartbeat_interval_ms
            self._heartbeater = Heartbeater(
                base_url=self.node_url, token=self.token, registration=self.registration,
                interval_s=interval_ms / 1000, node_timeout_s=min(self.settings.node_timeout_ms, interval_ms) / 1000,
                policy=self.retry_policy, load=self.load, status=lambda: self._status, rng=self.rng)
            if self.settings.heartbeat_in_thread:
                self._heartbeater.start_thread()
            else:
                self._heartbeater.start_task()
        return self.registered

    async def aclose(self) -> None:
        """Stop heartbeats, flush reports, deregister, close the session. Idempotent."""
        if self.state in (ClientState.CLOSING, ClientState.CLOSED):
            return
        self.state = ClientState.CLOSING
        try:
            if self._heartbeater is not None:
                await self._heartbeater.stop()
            if self._reporter is not None:
                await self._reporter.aclose()
            if self.registered is not None and self.registration is not None and self._api is not None:
                try:
                    await self._api.deregister(self.registration.agent_id)
                except UnknownAgent:
                    pass
                except NodeError as exc:
                    log.warning("could not deregister %s (its lease will lapse instead): %s",
                                self.registration.agent_id, exc.message)
        finally:
            if self._session is not None:
                await self._session.close()
            self.state = ClientState.CLOSED

    # -- status and observability ------------------------------------------------------------

    @property
    def agent_id(self) -> str | None:
        return self.registration.agent_id if self.registration is not None else None

    @property
    def heartbeat_stats(self) -> HeartbeatStats | None:
        return self._heartbeater.stats if self._heartbeater is not None else None

    @property
    def heartbeat_error(self) -> BaseException | None:
        """Why the heartbeat loop died, if it did (it is also logged at ERROR)."""
        return self._heartbeater.error if self._heartbeater is not None else None

    @property
    def reports_sent(self) -> int:
        return self._reporter.sent_reports if self._reporter is not None else 0

    @property
    def report_batches_sent(self) -> int:
        return self._reporter.sent_batches if self._reporter is not None else 0

    def set_status(self, status: Status | None, *, push: bool = True) -> None:
        """The status heartbeats carry from now on (thread-safe); ``push`` sends one at once."""
        self._status = status
        if push and self._heartbeater is not None:
            self._heartbeater.wake()

    def breaker_state(self, agent_id: str) -> BreakerState:
        """This client's breaker for one target."""
        return self._target_breakers.state(agent_id)

    async def flush_reports(self) -> None:
        """Send queued outcome reports now (they are otherwise sent every flush interval)."""
        if self._reporter is not None:
            await self._reporter.flush()

    # -- node queries ------------------------------------------------------------------------

    async def node_health(self) -> dict[str, Any]:
        """The node's ``/healthz`` answer (raises :class:`NodeUnreachable` if it does not answer)."""
        return await self._require_api().request("GET", "/healthz")

    async def policy(self) -> Policy:
        """The region's policy and what the node makes of this client's token (``GET /v1/policy``)."""
        return Policy.model_validate(await self._require_api().request("GET", "/v1/policy"))

    async def trace(self, trace_id: str) -> Trace:
        """Decisions, deliveries and outcomes recorded for one trace (``GET /v1/traces/{id}``)."""
        return Trace.model_validate(await self._require_api().request("GET", f"/v1/traces/{quote(trace_id)}"))

    async def resolve(self, capability: str | None = None, *, agent_id: str | None = None,
                      pattern: str | None = None, version: str | None = None, labels: Mapping[str, str] | None = None,
                      conversation_id: str | None = None, scope: Scope | str | None = None,
                      preferred_region: str | None = None, exclude: list[str] | None = None,
                      trace_id: str | None = None, fresh: bool = False) -> RouteTicket:
        """A route ticket, from the cache while it is valid (``fresh`` or ``exclude`` skip the cache).

        Raises :class:`NoAgentAvailable` (with the node's reason per stage), :class:`NodeUnreachable`.
        """
        request = self._route_request(capability=capability, agent_id=agent_id, pattern=pattern, version=version,
                                      labels=labels, conversation_id=conversation_id, scope=scope,
                                      preferred_region=preferred_region, exclude=exclude, trace_id=trace_id)
        return await self._resolve(request, fresh=fresh)

    # -- calls -------------------------------------------------------------------------------

    async def call(self, capability: str | None = None, payload: Any = None, *, operation: str | None = None,
                   agent_id: str | None = None, pattern: str | None = None, version: str | None = None,
                   labels: Mapping[str, str] | None = None, conversation_id: str | None = None,
                   scope: Scope | str | None = None, preferred_region: str | None = None,
                   idempotent: bool = False, trace_id: str | None = None, extensions: Mapping[str, Any] | None = None,
                   envelope: Envelope | None = None, timeout_ms: int | None = None,
                   connect_timeout_ms: int | None = None, read_timeout_ms: int | None = None) -> CallResult:
        """Resolve and call an agent directly; see the module docstring for the retry rules.

        ``envelope`` sends a prepared envelope (e.g. ``incoming.child(...)``, which carries the
        trace and hop count); otherwise one is built from ``payload``/``operation``. Raises
        :class:`CallFailed` (``CallRejected``, ``CallTimeout``), :class:`NoAgentAvailable`,
        :class:`NodeUnreachable`.
        """
        settings = self.settings
        overall_s = (timeout_ms or settings.request_timeout_ms) / 1000
        deadline = self.clock() + overall_s
        if envelope is None:
            envelope = Envelope(source_agent=self.agent_id, target_agent=agent_id or pattern,
                                operation=operation or capability, payload=payload,
                                expire_at_ms=epoch_ms() + int(overall_s * 1000), idempotent=idempotent,
                                extensions=dict(extensions or {}), **({"trace_id": trace_id} if trace_id else {}))
        elif capability is None and agent_id is None and pattern is None:
            # route a prepared envelope the way the proxy would: its target, else its operation
            target = envelope.target_agent
            if target and "*" in target:
                pattern = target
            elif target:
                agent_id = target
            capability = envelope.operation if not target or pattern else None
        if conversation_id is None and isinstance(envelope.extensions.get("conversation_id"), str):
            conversation_id = envelope.extensions["conversation_id"]
        if envelope.expired():
            raise EnvelopeExpired(f"envelope {envelope.id} expired at {envelope.expire_at_ms} ms; send a new one",
                                  field="expire_at_ms")
        if envelope.hop_count >= settings.max_hops:
            raise HopLimitExceeded(f"envelope {envelope.id} already made {envelope.hop_count} hops (the limit is "
                                   f"{settings.max_hops}): a loop between agents, or a chain too long",
                                   field="hop_count")
        envelope = envelope.forwarded()  # a direct call is a hop too, so A→B→A loops end here as in the proxy
        idempotent = envelope.idempotent or idempotent
        request = self._route_request(capability=capability, agent_id=agent_id, pattern=pattern, version=version,
                                      labels=labels, conversation_id=conversation_id, scope=scope,
                                      preferred_region=preferred_region, exclude=None, trace_id=envelope.trace_id)
        timeouts = aiohttp.ClientTimeout(sock_connect=(connect_timeout_ms or settings.connect_timeout_ms) / 1000,
                                         sock_read=(read_timeout_ms or settings.read_timeout_ms) / 1000)
        max_attempts = self.retry_policy.max_attempts if idempotent else 1
        failover = Failover(request, resolve=self._resolve, breakers=self._target_breakers)
        attempts: list[Attempt] = []
        last_error: AttemptError | None = None
        for attempt in range(max_attempts):
            if attempt > 0:
                delay = self.retry_policy.backoff_s(attempt - 1, self.rng)
                if self.clock() + delay >= deadline:
                    raise self._timeout(envelope, attempts, overall_s)
                self.backoffs_s.append(delay)
                await self.sleep(delay)
            pick = await failover.next()
            if pick is None:
                break
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise self._timeout(envelope, attempts, overall_s)
            started = time.perf_counter()
            try:
                status, body, response = await deliver(self._open_session(), pick.target, envelope, timeouts,
                                                       remaining)
            except AttemptError as failure:
                latency_ms = (time.perf_counter() - started) * 1000
                attempts.append(Attempt(pick.target.agent_id, pick.target.endpoint, failure.outcome, latency_ms,
                                        failure.status, str(failure)))
                self._after_attempt(pick, envelope, attempt, failure.outcome, latency_ms, failure.status,
                                    str(failure))
                if not failure.retryable:
                    raise CallRejected(f"{pick.target.agent_id} rejected {envelope.operation or 'the call'}: "
                                       f"{failure}", attempts=attempts, trace_id=envelope.trace_id,
                                       response_status=failure.status or 0, body=failure.body) from None
                last_error = failure
                self._tickets.evict(pick.target.agent_id)
                continue
            latency_ms = (time.perf_counter() - started) * 1000
            attempts.append(Attempt(pick.target.agent_id, pick.target.endpoint, Outcome.SUCCESS, latency_ms, status))
            self._after_attempt(pick, envelope, attempt, Outcome.SUCCESS, latency_ms, status, None)
            return CallResult(agent_id=pick.target.agent_id, region=pick.target.region,
                              endpoint=pick.target.endpoint, status=status, body=body, envelope=response,
                              trace_id=envelope.trace_id, request=envelope, attempts=attempts)
        why = "; ".join(f"{a.agent_id}: {a.error}" for a in attempts) or "no agent to try"
        retry_note = "" if idempotent else " (not retried: the operation is not marked idempotent)"
        raise CallFailed(f"{envelope.operation or 'call'} failed after {len(attempts)} attempt(s){retry_note}: {why}",
                         attempts=attempts, trace_id=envelope.trace_id) from last_error

    async def send(self, envelope: Envelope, *, delivery: str = "sync", version: str | None = None,
                   scope: Scope | str | None = None) -> SendResult:
        """Proxy mode: the node routes and delivers ``envelope`` itself (``POST /v1/send``).

        ``delivery="callback"`` returns at once (202); the result goes to this agent's
        registered ``callback_endpoint``. Raises the node's error (``hop_limit_exceeded``,
        ``envelope_expired``, ``delivery_failed`` …) as a :class:`NodeError`.
        """
        query = {"delivery": delivery}
        if version:
            query["version"] = version
        if scope:
            query["scope"] = Scope(scope).value
        timeout_s = self.settings.request_timeout_ms / 1000
        return await self._require_api().send(envelope, query=query, timeout_s=timeout_s)

    # -- internals ---------------------------------------------------------------------------

    def _require_api(self) -> NodeApi:
        if self._api is None or self.state in (ClientState.CLOSING, ClientState.CLOSED):
            raise ClientError("the client is not started: use 'async with ReachClient(...)' or await start()",
                              code="client_not_started")
        return self._api

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _route_request(self, **fields: Any) -> RouteRequest:
        data = {name: value for name, value in fields.items() if value is not None}
        if "labels" in data:
            data["labels"] = dict(data["labels"])
        try:
            return RouteRequest.model_validate(data)
        except ValidationError as exc:
            key, problem = _first_problem(exc)
            raise ValidationFailed(f"route request {key}: {problem}", field=key or None) from exc

    async def _resolve(self, request: RouteRequest, *, fresh: bool = False) -> RouteTicket:
        if not fresh and not request.exclude:
            cached = self._tickets.get(request)
            if cached is not None:
                return cached
        ticket = RouteTicket.model_validate(await self._require_api().request("POST", "/v1/resolve", request))
        if not request.exclude:  # a decision that excludes agents answers one call, not the next
            self._tickets.put(request, ticket)
        return ticket

    def _open_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise ClientError("the client is closed", code="client_not_started")
        return self._session

    def _after_attempt(self, pick: Pick, envelope: Envelope, attempt: int, outcome: Outcome, latency_ms: float,
                       status: int | None, error: str | None) -> None:
        self._target_breakers.record(pick.target.agent_id, outcome)
        reporter = self._reporter
        if reporter is None or not self.settings.report_outcomes:
            return
        reporter.put(OutcomeReport(signature=pick.ticket.signature, agent_id=pick.target.agent_id, outcome=outcome,
                                   latency_ms=round(latency_ms, 3)))
        if self.settings.record_traces:
            reporter.put(RouteEvent(event=RouteEventKind.DELIVERY, at_ms=epoch_ms(), trace_id=envelope.trace_id,
                                    mode="direct", caller=self.agent_id or pick.ticket.caller,
                                    envelope_id=envelope.id, agent_id=pick.target.agent_id,
                                    region=pick.target.region, endpoint=pick.target.endpoint, attempt=attempt,
                                    result=outcome.value, status=status, latency_ms=round(latency_ms, 3),
                                    detail=error[:1000] if error else None))

    def _timeout(self, envelope: Envelope, attempts: list[Attempt], overall_s: float) -> CallTimeout:
        return CallTimeout(f"{envelope.operation or 'call'} did not succeed within {overall_s:g}s "
                           f"({len(attempts)} attempt(s))", attempts=attempts, trace_id=envelope.trace_id)


def _first_problem(exc: ValidationError) -> tuple[str, str]:
    """The dotted location and message of the first error pydantic found."""
    first = exc.errors(include_url=False)[0]
    return ".".join(str(part) for part in first["loc"]), first["msg"]


__all__ = ["Attempt", "CallFailed", "CallRejected", "CallResult", "CallTimeout", "ClientError", "ClientState",
           "EnvelopeType", "HeartbeatStats", "NodeRejected", "NodeUnreachable", "ReachClient", "RetryPolicy",
           "SendResult", "node_error"]
