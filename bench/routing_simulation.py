"""The discrete-event simulation of the routing benchmark (:mod:`bench.routing`): the real
:class:`node.routing.router.Router` over a real :class:`AgentIndex` and :class:`OutcomeTracker`, with a
stand-in for the Redis-backed ``RegionCache``, simulated agents and SDK callers."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from dataclasses import dataclass, field

from node.client._tickets import TICKET_EXPIRY_MARGIN
from node.core import NoAgentAvailable
from node.core.models import AgentRecord, Capability, Load, Outcome, RouteRequest, Status, TokenClaims, TokenRole
from node.delivery import OutcomeTracker
from node.routing import Decision, Router
from node.routing.router import WeightFactor
from node.trust import Signer
from node.view import AgentIndex

from .routing_workload import (
    BACKOFF_MULTIPLIER,
    CALLERS,
    CAPABILITY,
    DEADLINE_MS,
    FAILURE_MS,
    FLAKY_FAILURE_RATE,
    FLAKY_WINDOW,
    INITIAL_BACKOFF_MS,
    JITTER_RATIO,
    LEASE_TTL_MS,
    MAX_ATTEMPTS,
    NETWORK_MS,
    QUEUE_LIMIT_PER_WORKER,
    REGION,
    REPORT_FLUSH_MS,
    AgentSpec,
    Arrival,
    SimConfig,
)

__all__ = ["PolicyResult", "SimClock", "SimRegionCache", "Simulation"]

# -- the node side: a stand-in for RegionCache over a real AgentIndex -----------------------

class SimClock:
    """Simulated milliseconds; the router reads them through ``now_ms`` (its ``clock``)."""

    def __init__(self) -> None:
        self.now = 0.0

    def now_ms(self) -> int:
        return int(self.now)


class SimRegionCache:
    """What the router reads of a RegionCache, over a real index; leases are exact here."""

    def __init__(self, clock: SimClock, region: str = REGION) -> None:
        self.index = AgentIndex(region)
        self.preserving = False
        self._clock = clock

    def routable_now_ms(self) -> int:
        return self._clock.now_ms()


# -- the simulation -------------------------------------------------------------------------

@dataclass(slots=True, eq=False)
class _Request:
    arrival: Arrival
    deadline_ms: float
    picks: deque[str] = field(default_factory=deque)
    tried: list[str] = field(default_factory=list)
    current: _Attempt | None = None
    finished_ms: float | None = None
    succeeded: bool = False


@dataclass(slots=True, eq=False)
class _Attempt:
    request: _Request
    agent: _Agent
    number: int
    waiting: bool = True  # the caller still waits for this attempt's answer


@dataclass(slots=True, eq=False)
class _Agent:
    spec: AgentSpec
    busy: int = 0
    queue: deque[_Attempt] = field(default_factory=deque)
    attempts: int = 0


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """What one routing policy achieved on one arrival sequence."""

    policy: str
    requests: int
    succeeded: int
    mean_ms: float
    p50_ms: float
    p99_ms: float
    p99_success_ms: float
    failed_attempts: dict[str, int]
    retried: int
    breaker_opens: int
    share: dict[str, float]

    @property
    def success_rate(self) -> float:
        return self.succeeded / self.requests if self.requests else 0.0

    def beats(self, other: PolicyResult) -> bool:
        """The main metric: lower censored p99; at equal p99 (both at the deadline), higher success."""
        if self.p99_ms != other.p99_ms:
            return self.p99_ms < other.p99_ms
        return self.success_rate > other.success_rate


_ARRIVE, _RETRY, _DONE, _ANSWER, _DEADLINE, _HEARTBEAT, _REPORT, _LOAD = range(8)


class Simulation:
    """One policy over one arrival sequence; :meth:`run` returns its :class:`PolicyResult`."""

    def __init__(self, config: SimConfig, factors: WeightFactor, traffic: list[Arrival], *, name: str) -> None:
        self.config = config
        self.name = name
        self.traffic = traffic
        self.clock = SimClock()
        self.cache = SimRegionCache(self.clock)
        self.outcomes = OutcomeTracker()
        self.router = Router(self.cache, Signer(b"bench-routing-secret-0123456789"), self.outcomes,
                             factors=factors, rng=random.Random(f"router-{config.seed}"), clock=self.clock.now_ms)
        self.agents = {spec.agent_id: _Agent(spec) for spec in config.fleet}
        self.caller = TokenClaims(sub="sim.caller.any", role=TokenRole.CALLER, exp=2**40, iat=0)
        self.request = RouteRequest(capability=CAPABILITY)
        self.flaky_from = FLAKY_WINDOW[0] * config.duration_ms
        self.flaky_until = FLAKY_WINDOW[1] * config.duration_ms
        self.version = itertools.count(1)
        self.events: list[tuple[float, int, int, object]] = []
        self.sequence = itertools.count()
        self.requests: list[_Request] = []
        self.failed_attempts = {outcome.value: 0 for outcome in (Outcome.FAILURE, Outcome.TIMEOUT, Outcome.REJECTED)}
        self.retried = 0
        phases = random.Random(f"phases-{config.seed}")
        self.report_phase = [phases.uniform(0, REPORT_FLUSH_MS) for _ in range(CALLERS)]
        self.heartbeat_phase = {agent_id: phases.uniform(0, config.heartbeat_ms) for agent_id in self.agents}
        self.load_phase = {agent_id: phases.uniform(0, config.load_report_ms or 1) for agent_id in self.agents}
        self.tickets: dict[int, tuple[Decision, float]] = {}  # per caller: its cached ticket, until when
        self.draw = random.Random(f"draw-{config.seed}")

    def _at(self, at_ms: float, kind: int, payload: object) -> None:
        heapq.heappush(self.events, (at_ms, next(self.sequence), kind, payload))

    def run(self) -> PolicyResult:
        for agent in self.agents.values():
            self._register(agent.spec)
            self._at(self.heartbeat_phase[agent.spec.agent_id], _HEARTBEAT, agent)
            if config_load := self.config.load_report_ms:
                self._at(self.load_phase[agent.spec.agent_id] + config_load, _LOAD, agent)
        for arrival in self.traffic:
            self._at(arrival.at_ms, _ARRIVE, arrival)
        end = self.config.duration_ms + DEADLINE_MS + REPORT_FLUSH_MS
        handlers = (self._arrive, self._retry, self._done, self._answer, self._deadline,
                    self._heartbeat, self._deliver_report, self._load_report)
        while self.events:
            at, _, kind, payload = heapq.heappop(self.events)
            if at > end:
                break
            self.clock.now = at
            handlers[kind](payload)
        return self._result()

    # -- agents ------------------------------------------------------------------------------

    def _register(self, spec: AgentSpec) -> None:
        self.cache.index.put(AgentRecord(
            agent_id=spec.agent_id, region=REGION, capabilities=[Capability(name=CAPABILITY)],
            endpoints={"primary": f"http://{spec.name}.sim:8080"}, weight=spec.weight,
            max_concurrency=spec.max_concurrency, status=spec.status, version=next(self.version),
            lease_ttl_ms=LEASE_TTL_MS, lease_expires_at_ms=LEASE_TTL_MS))

    def _record(self, agent: _Agent) -> AgentRecord:
        record = self.cache.index.get(agent.spec.agent_id)
        if record is None:
            raise RuntimeError(f"{agent.spec.agent_id} left the index; the simulation never removes agents")
        return record

    def _heartbeat(self, agent: _Agent) -> None:
        now = self.clock.now
        record = self._record(agent)
        load = record.load if self.config.load_report_ms else Load(inflight=agent.busy, queued=len(agent.queue))
        status = self._status(agent)
        if load != record.load or status is not record.status:
            # What the node does with a heartbeat that changes load or status: a new version.
            self.cache.index.put(record.model_copy(update={
                "load": load, "status": status, "version": next(self.version), "updated_at_ms": int(now),
                "lease_expires_at_ms": int(now) + LEASE_TTL_MS}))
        else:
            record.lease_expires_at_ms = int(now) + LEASE_TTL_MS  # as RegionCache.touch_lease
        self._at(now + self.config.heartbeat_ms, _HEARTBEAT, agent)

    def _status(self, agent: _Agent) -> Status:
        if agent.spec.reports_busy:
            return Status.BUSY if len(agent.queue) > agent.spec.workers else Status.READY
        return agent.spec.status

    def _load_report(self, agent: _Agent) -> None:
        """The light load report: the router's record gets the load; no version, no lease."""
        record = self._record(agent)
        load = Load(inflight=agent.busy, queued=len(agent.queue))
        if load != record.load:
            self.cache.index.put(record.model_copy(update={"load": load}))
        self._at(self.clock.now + self.config.load_report_ms, _LOAD, agent)

    def _start_service(self, agent: _Agent, attempt: _Attempt) -> None:
        now = self.clock.now
        agent.busy += 1
        spec = agent.spec
        failing = (spec.fails and self.flaky_from <= now < self.flaky_until
                   and attempt.request.arrival.failure_draws[attempt.number] < FLAKY_FAILURE_RATE)
        duration = FAILURE_MS if failing else spec.service_ms * spec.slowdown * attempt.request.arrival.size
        self._at(now + duration, _DONE, (attempt, failing))

    def _done(self, payload: object) -> None:
        attempt, failing = payload  # type: ignore[misc]
        agent = attempt.agent
        agent.busy -= 1
        if agent.queue:
            self._start_service(agent, agent.queue.popleft())
        self._at(self.clock.now + NETWORK_MS, _ANSWER, (attempt, Outcome.FAILURE if failing else Outcome.SUCCESS))

    def _answer(self, payload: object) -> None:
        attempt, outcome = payload  # type: ignore[misc]
        if attempt.waiting:
            self._finish_attempt(attempt, outcome)

    # -- callers -----------------------------------------------------------------------------

    def _arrive(self, arrival: Arrival) -> None:
        request = _Request(arrival, arrival.at_ms + DEADLINE_MS)
        self.requests.append(request)
        self._at(request.deadline_ms, _DEADLINE, request)
        decision = self._ticket(arrival.caller)
        if decision is None:
            self._fail(request)
            return
        request.picks.extend(self._first_drawn(decision))
        self._attempt(request, request.picks.popleft())

    def _ticket(self, caller: int) -> Decision | None:
        """The caller's ticket: its cached one for ``ticket_reuse_ms`` (not with ``fresh``)."""
        cached = self.tickets.get(caller)
        if cached is not None and cached[1] > self.clock.now and self.config.sdk != "fresh":
            return cached[0]
        try:
            decision = self.router.decide_exact(self.request, self.caller)
        except NoAgentAvailable:
            self.tickets.pop(caller, None)
            return None
        life_ms = TICKET_EXPIRY_MARGIN * (decision.expires_at_ms - decision.issued_at_ms)
        self.tickets[caller] = (decision, self.clock.now + min(self.config.ticket_reuse_ms, life_ms))
        return decision

    def _first_drawn(self, decision: Decision) -> list[str]:
        """The ticket's agents in the order the SDK tries them (``Failover._first_drawn``)."""
        order = [decision.target, *decision.alternates]
        if self.config.sdk == "drawn" and decision.drawn > 1:
            drawn = order[:decision.drawn]
            first = self.draw.choices(range(len(drawn)), weights=[c.weight for c in drawn])[0]
            order.insert(0, order.pop(first))
        return [candidate.agent_id for candidate in order]

    def _evict(self, caller: int, agent_id: str) -> None:
        """A failed attempt drops the caller's ticket if it names that agent (``TicketCache.evict``)."""
        cached = self.tickets.get(caller)
        if cached is not None and agent_id in (cached[0].target.agent_id, *(c.agent_id for c in cached[0].alternates)):
            del self.tickets[caller]

    def _next_target(self, request: _Request) -> str | None:
        while request.picks:
            agent_id = request.picks.popleft()
            if agent_id not in request.tried:
                return agent_id
        try:
            decision = self.router.decide_exact(
                RouteRequest(capability=CAPABILITY, exclude=list(request.tried)), self.caller)
        except NoAgentAvailable:
            return None
        request.picks.extend(c.agent_id for c in decision.alternates)
        return decision.target.agent_id

    def _attempt(self, request: _Request, agent_id: str) -> None:
        agent = self.agents[agent_id]
        attempt = _Attempt(request, agent, len(request.tried))
        request.tried.append(agent_id)
        request.current = attempt
        agent.attempts += 1
        if len(agent.queue) >= QUEUE_LIMIT_PER_WORKER * agent.spec.workers:
            self._at(self.clock.now + 2 * NETWORK_MS, _ANSWER, (attempt, Outcome.REJECTED))
        elif agent.busy < agent.spec.workers:
            self._start_service(agent, attempt)
        else:
            agent.queue.append(attempt)

    def _finish_attempt(self, attempt: _Attempt, outcome: Outcome) -> None:
        now = self.clock.now
        request = attempt.request
        attempt.waiting = False
        request.current = None
        self._report(attempt.agent.spec.agent_id, outcome, request.arrival.caller)
        if outcome is Outcome.SUCCESS:
            request.succeeded = True
            request.finished_ms = now
            return
        self.failed_attempts[outcome.value] += 1
        self._evict(request.arrival.caller, attempt.agent.spec.agent_id)
        retry = len(request.tried)
        if retry >= MAX_ATTEMPTS:
            self._fail(request)
            return
        delay = (min(INITIAL_BACKOFF_MS * BACKOFF_MULTIPLIER ** (retry - 1), 8_000)
                 * (1.0 + JITTER_RATIO * (2.0 * request.arrival.jitter_draws[retry - 1] - 1.0)))
        if now + delay >= request.deadline_ms:
            self._fail(request)  # the SDK gives up rather than sleep past the deadline
            return
        if retry == 1:
            self.retried += 1
        self._at(now + delay, _RETRY, request)

    def _retry(self, request: _Request) -> None:
        if request.finished_ms is not None:
            return
        agent_id = self._next_target(request)
        if agent_id is None:
            self._fail(request)
        else:
            self._attempt(request, agent_id)

    def _deadline(self, request: _Request) -> None:
        if request.finished_ms is not None:
            return
        attempt = request.current
        if attempt is not None:
            attempt.waiting = False  # the agent still runs it: it cannot know the caller left
            self.failed_attempts[Outcome.TIMEOUT.value] += 1
            self._report(attempt.agent.spec.agent_id, Outcome.TIMEOUT, request.arrival.caller)
        self._fail(request)

    def _fail(self, request: _Request) -> None:
        request.current = None
        request.finished_ms = self.clock.now

    def _report(self, agent_id: str, outcome: Outcome, caller: int) -> None:
        # The SDK batches reports and flushes each caller's batch every REPORT_FLUSH_MS.
        phase = self.report_phase[caller]
        flush = phase + math.ceil((self.clock.now - phase) / REPORT_FLUSH_MS) * REPORT_FLUSH_MS
        self._at(max(flush, self.clock.now), _REPORT, (agent_id, outcome))

    def _deliver_report(self, payload: object) -> None:
        agent_id, outcome = payload  # type: ignore[misc]
        self.outcomes.record(agent_id, outcome, now_ms=self.clock.now_ms())

    # -- results -----------------------------------------------------------------------------

    def _result(self) -> PolicyResult:
        censored: list[float] = []
        successes: list[float] = []
        for request in self.requests:
            if request.succeeded and request.finished_ms is not None:
                latency = request.finished_ms - request.arrival.at_ms
                successes.append(latency)
                censored.append(latency)
            else:
                censored.append(float(DEADLINE_MS))
        censored.sort()
        successes.sort()
        total_attempts = sum(agent.attempts for agent in self.agents.values()) or 1
        return PolicyResult(
            policy=self.name, requests=len(self.requests), succeeded=len(successes),
            mean_ms=sum(censored) / len(censored) if censored else 0.0,
            p50_ms=_percentile(censored, 0.50), p99_ms=_percentile(censored, 0.99),
            p99_success_ms=_percentile(successes, 0.99), failed_attempts=dict(self.failed_attempts),
            retried=self.retried, breaker_opens=self.outcomes.opened_total,
            share={agent.spec.name: agent.attempts / total_attempts for agent in self.agents.values()})


def _percentile(ordered: list[float], quantile: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 when empty)."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(quantile * len(ordered)) - 1))]
