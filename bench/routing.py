"""Does the routing blend earn its place? Each weight factor alone vs all of them, same traffic.

A deterministic discrete-event simulation (seeded RNGs, a simulated clock, no sleeps, no
network) drives the real :class:`node.router.Router` over a real :class:`AgentIndex` and a real
:class:`OutcomeTracker`. Only the Redis-backed ``RegionCache`` is replaced, by a stand-in that
exposes what the router reads (``index``, ``preserving``, ``routable_now_ms()``), and the
router is given the simulated clock (``Router(clock=...)``).

The fleet is one capability served by twelve agents of unequal capacity. Operators set some
registered weights in proportion to capacity and left others at the default (a new big box
3× under-weighted, two small ones 4–6× over-weighted, two without ``max_concurrency`` so the
load factor assumes 10). One agent runs 3× slow and says ``degraded`` (its weight still the
healthy one); one says ``busy`` when its queue is longer than its worker count; one fails 30 %
of its calls (fast HTTP 503s) for the middle 30 % of the run and then recovers. Agents queue FIFO behind their worker pool and
answer 429 once ``QUEUE_LIMIT_PER_WORKER`` × workers are waiting; abandoned calls still run.

Load arrives as Poisson traffic at 55 % of the fleet's true capacity, with bursts at 95 %
(3–6 s long, one every ~20 s on average). Leases are 10 s; agents heartbeat (lease and status)
every third of it, 3.3 s, each at its own phase, and send their inflight/queued every second
through the light load report (``PUT /v1/agents/{id}/load``, which touches no stream), so the
router sees load up to a second late and status up to 3.3 s late. ``--load-report-ms 0`` is the
node before the light report: load travels with the heartbeats only.

Callers behave like ``ReachClient.call`` with ``idempotent=True``: they keep one route ticket
per caller for 1 s (the SDK's ticket cache: ``ticket_reuse_ms``, at most 90 % of the ticket's
10 s life; ``--ticket-reuse-ms 9000`` is the cache before), draw each call's first target
among the ticket's target and the alternates of its level by the weights the node gave them
(``--sdk drawn``, the SDK now; ``pinned``: the SDK before, every call to the ticket's target;
``fresh``: a decision per call, no cache), then fail over to the other targets and to a fresh
decision excluding what was tried, at most 3 attempts, backoff 0.5 s × 2^n ± 20 %, one overall
deadline; a failed attempt evicts the caller's ticket if it names that agent. They report
every attempt's outcome in batches flushed every second (the SDK default), which is when the
node's OutcomeTracker learns of it. The breaker is not a weight factor: the router applies it
under every policy, uniform included.

The main metric is decided up front: **p99 of time-to-success, where a request that never
succeeded counts as the deadline** (it cost the caller at least that). It folds the success
rate into the latency tail without an arbitrary weighting; when two policies both sit at the
deadline (more than 1 % of requests failed), the success rate breaks the tie.

Every policy sees the same arrivals, job sizes and failure draws (common random numbers), so
differences come from routing, not from luck of the draw.

Run from the repository root: `make bench-routing` or `.venv/bin/python -m bench.routing` (`--help`
for duration, seeds, pairs).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from node.cache import AgentIndex
from node.client._config import DEFAULT_TICKET_REUSE_MS
from node.client._tickets import TICKET_EXPIRY_MARGIN
from node.errors import NoAgentAvailable
from node.models import (
    AgentRecord,
    Capability,
    Load,
    Outcome,
    RouteRequest,
    Status,
    TokenClaims,
    TokenRole,
)
from node.outcomes import OutcomeTracker
from node.router import ALL_WEIGHT_FACTORS, Decision, Router, WeightFactor
from node.security import Signer

REGION = "sim"
CAPABILITY = "sim.work"
DEFAULT_DURATION_S = 180
DEFAULT_SEED = 1
LEASE_TTL_MS = 10_000
DEFAULT_HEARTBEAT_MS = LEASE_TTL_MS // 3   # the SDK's default: a third of the lease
DEFAULT_LOAD_REPORT_MS = 1_000             # the light load report's cadence
SDK_MODES = ("drawn", "pinned", "fresh")
REPORT_FLUSH_MS = 1_000          # the SDK's report_flush_interval_ms default
DEADLINE_MS = 2_000              # the caller's timeout_ms for one call
MAX_ATTEMPTS = 3                 # the SDK's RetryPolicy defaults from here down
INITIAL_BACKOFF_MS = 500
BACKOFF_MULTIPLIER = 2.0
JITTER_RATIO = 0.2
NETWORK_MS = 1.0                 # an answer's trip back to the caller; a 429 costs a round trip
FAILURE_MS = 20.0                # a failing agent answers 503 this fast
QUEUE_LIMIT_PER_WORKER = 10      # an agent answers 429 beyond this many waiting per worker
SIZE_SIGMA = 0.5                 # job sizes: lognormal with mean 1
CALLERS = 16
BASE_UTILIZATION = 0.55
BURST_UTILIZATION = 0.95
BURST_EVERY_MS = 20_000
BURST_LENGTH_MS = (3_000, 6_000)
FLAKY_WINDOW = (0.35, 0.65)      # fraction of the run during which the flaky agent fails
FLAKY_FAILURE_RATE = 0.3


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """One simulated agent: what it really is, and what its operator registered."""

    name: str
    workers: int
    service_ms: float
    weight: int
    max_concurrency: int | None
    slowdown: float = 1.0
    status: Status = Status.READY
    reports_busy: bool = False
    fails: bool = False

    @property
    def agent_id(self) -> str:
        return f"sim.worker.{self.name}"

    @property
    def capacity_rps(self) -> float:
        return self.workers * 1000.0 / (self.service_ms * self.slowdown)


# Registered weight is 2 × capacity in rps where the operator got it right.
FLEET: tuple[AgentSpec, ...] = (
    AgentSpec("big1", 16, 200, 160, 16),
    AgentSpec("big2", 16, 200, 160, 16),
    AgentSpec("mid1", 8, 200, 80, 8),
    AgentSpec("mid2", 8, 200, 80, 8),
    AgentSpec("mid3", 8, 200, 100, None),           # default weight (a bit high), no max_concurrency
    AgentSpec("mid4", 8, 200, 80, 8),
    AgentSpec("huge", 32, 200, 100, 32),            # new big box left at the default: 3× too low
    AgentSpec("tiny", 2, 250, 100, 2),              # default weight: ~6× too high
    AgentSpec("small", 4, 300, 100, None),          # default weight: ~4× too high, no max_concurrency
    AgentSpec("slow", 8, 200, 80, 8, slowdown=3.0, status=Status.DEGRADED),  # says so, weight not updated
    AgentSpec("flaky", 8, 200, 80, 8, fails=True),  # 30 % fast 503s mid-run, then recovers
    AgentSpec("busy", 4, 250, 32, 4, reports_busy=True),  # says busy when its queue > workers
)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What one run simulates; the same config and seed give the same arrivals."""

    duration_ms: int = DEFAULT_DURATION_S * 1000
    seed: int = DEFAULT_SEED
    heartbeat_ms: int = DEFAULT_HEARTBEAT_MS
    load_report_ms: int = DEFAULT_LOAD_REPORT_MS  # 0: load only with the heartbeats
    sdk: str = SDK_MODES[0]
    ticket_reuse_ms: int = DEFAULT_TICKET_REUSE_MS
    fleet: tuple[AgentSpec, ...] = FLEET

    def __post_init__(self) -> None:
        if self.duration_ms <= 0 or self.heartbeat_ms <= 0 or self.load_report_ms < 0 or not self.fleet:
            raise ValueError("duration_ms and heartbeat_ms must be positive, load_report_ms not negative and the "
                             "fleet non-empty")
        if self.sdk not in SDK_MODES:
            raise ValueError(f"sdk must be one of {', '.join(SDK_MODES)}")


@dataclass(frozen=True, slots=True)
class Arrival:
    """One caller request, with every random draw it may need fixed in advance."""

    at_ms: float
    size: float
    caller: int
    failure_draws: tuple[float, ...]
    jitter_draws: tuple[float, ...]


def arrivals(config: SimConfig) -> list[Arrival]:
    """Bursty Poisson arrivals (a two-state modulated process) with their per-request draws."""
    rng = random.Random(f"arrivals-{config.seed}")
    capacity_per_ms = sum(spec.capacity_rps for spec in config.fleet) / 1000.0
    bursts: list[tuple[float, float]] = []
    at = rng.expovariate(1.0 / BURST_EVERY_MS)
    while at < config.duration_ms:
        length = rng.uniform(*BURST_LENGTH_MS)
        bursts.append((at, at + length))
        at += length + rng.expovariate(1.0 / BURST_EVERY_MS)
    mu = -SIZE_SIGMA**2 / 2
    result: list[Arrival] = []
    at, burst = 0.0, 0
    while True:
        # Thinning against the burst rate keeps the process exact across regime switches.
        at += rng.expovariate(BURST_UTILIZATION * capacity_per_ms)
        if at >= config.duration_ms:
            return result
        while burst < len(bursts) and bursts[burst][1] <= at:
            burst += 1
        in_burst = burst < len(bursts) and bursts[burst][0] <= at
        keep = rng.random()
        size = rng.lognormvariate(mu, SIZE_SIGMA)
        draws = tuple(rng.random() for _ in range(MAX_ATTEMPTS))
        jitters = tuple(rng.random() for _ in range(MAX_ATTEMPTS - 1))
        caller = rng.randrange(CALLERS)
        if in_burst or keep < BASE_UTILIZATION / BURST_UTILIZATION:
            result.append(Arrival(at, size, caller, draws, jitters))


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


# -- policies, table, verdict ---------------------------------------------------------------

UNIFORM = "uniform"
BLEND = "blend"
SINGLES = ("weight", "status", "load", "errors")


def policies(*, pairs: bool = False, leave_one_out: bool = True) -> dict[str, WeightFactor]:
    """Uniform, each factor alone, optionally pairs and the blend minus one, and the blend."""
    chosen: dict[str, WeightFactor] = {UNIFORM: WeightFactor(0)}
    chosen.update({name: WeightFactor.from_names([name]) for name in SINGLES})
    if pairs:
        chosen.update({f"{a}+{b}": WeightFactor.from_names([a, b]) for a, b in itertools.combinations(SINGLES, 2)})
    if leave_one_out:
        chosen.update({f"blend-{name}": ALL_WEIGHT_FACTORS & ~WeightFactor.from_names([name]) for name in SINGLES})
    chosen[BLEND] = ALL_WEIGHT_FACTORS
    return chosen


def run_policies(config: SimConfig, chosen: dict[str, WeightFactor]) -> dict[str, PolicyResult]:
    """Every policy over the same arrival sequence."""
    traffic = arrivals(config)
    return {name: Simulation(config, factors, traffic, name=name).run() for name, factors in chosen.items()}


def losses(results: dict[str, PolicyResult], rivals: tuple[str, ...] = (UNIFORM, *SINGLES)) -> list[str]:
    """The rivals the blend does not beat on the main metric (empty: the blend earns its place)."""
    blend = results[BLEND]
    return [name for name in rivals if name in results and not blend.beats(results[name])]


def table(results: dict[str, PolicyResult]) -> str:
    header = (f"{'policy':<14} {'success':>8} {'mean':>7} {'p50':>6} {'p99':>6} {'p99 ok':>7} "
              f"{'503':>6} {'timeout':>7} {'429':>6} {'retried':>7} {'breaker':>7}")
    lines = [header, "-" * len(header)]
    for result in results.values():
        failed = result.failed_attempts
        lines.append(
            f"{result.policy:<14} {100 * result.success_rate:>7.2f}% {result.mean_ms:>7.0f} {result.p50_ms:>6.0f} "
            f"{result.p99_ms:>6.0f} {result.p99_success_ms:>7.0f} {failed['failure']:>6} {failed['timeout']:>7} "
            f"{failed['rejected']:>6} {result.retried:>7} {result.breaker_opens:>7}")
    return "\n".join(lines)


def shares(results: dict[str, PolicyResult], fleet: tuple[AgentSpec, ...]) -> str:
    """Each agent's share of attempts per policy, next to its share of the fleet's capacity."""
    total = sum(spec.capacity_rps for spec in fleet)
    lines = [f"{'agent':<8} {'capacity':>8} " + " ".join(f"{name:>9}" for name in results)]
    for spec in fleet:
        lines.append(f"{spec.name:<8} {100 * spec.capacity_rps / total:>7.1f}% "
                     + " ".join(f"{100 * r.share[spec.name]:>8.1f}%" for r in results.values()))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=int, default=DEFAULT_DURATION_S, help="simulated seconds per run")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--seeds", type=int, default=2, help="also check the verdict on this many further seeds")
    parser.add_argument("--heartbeat-ms", type=int, default=DEFAULT_HEARTBEAT_MS, help="lease and status")
    parser.add_argument("--load-report-ms", type=int, default=DEFAULT_LOAD_REPORT_MS,
                        help="the light load report's cadence (0: load only with heartbeats)")
    parser.add_argument("--sdk", choices=SDK_MODES, default=SDK_MODES[0],
                        help="drawn: per call among the ticket's targets; pinned: the ticket's target; fresh: no cache")
    parser.add_argument("--ticket-reuse-ms", type=int, default=DEFAULT_TICKET_REUSE_MS,
                        help="how long a caller reuses a ticket (the SDK's ticket_reuse_ms; 9000: before)")
    parser.add_argument("--pairs", action="store_true", help="also run every pair of factors")
    args = parser.parse_args()

    def config_of(seed: int) -> SimConfig:
        return SimConfig(duration_ms=args.duration_s * 1000, seed=seed, heartbeat_ms=args.heartbeat_ms,
                         load_report_ms=args.load_report_ms, sdk=args.sdk, ticket_reuse_ms=args.ticket_reuse_ms)

    config = config_of(args.seed)
    traffic = arrivals(config)
    capacity = sum(spec.capacity_rps for spec in config.fleet)
    print(f"{len(config.fleet)} agents, true capacity {capacity:.0f} req/s; {len(traffic)} requests over "
          f"{args.duration_s} simulated s (mean {len(traffic) / args.duration_s:.0f} req/s, base "
          f"{BASE_UTILIZATION:.0%} / bursts {BURST_UTILIZATION:.0%} of capacity); lease {LEASE_TTL_MS} ms, "
          f"heartbeat {args.heartbeat_ms} ms, load report {args.load_report_ms or 'with heartbeats'} ms, "
          f"SDK {args.sdk} reusing tickets {args.ticket_reuse_ms} ms, deadline {DEADLINE_MS} ms, seed {args.seed}")
    started = time.perf_counter()
    results = run_policies(config, policies(pairs=args.pairs))
    print(f"\nlatencies in ms; a request that never succeeded counts as the {DEADLINE_MS} ms deadline "
          f"(p99 ok = successes only); 503/timeout/429 = failed attempts\n")
    print(table(results))
    print("\nshare of attempts per agent\n")
    print(shares(results, config.fleet))
    lost = losses(results)
    saturated = all(result.p99_ms >= DEADLINE_MS for result in results.values())
    how = (" (censored p99 is at the deadline for every policy: the success rate decided)" if saturated else "")
    print(f"\nseed {args.seed}: " + ("the blend beats uniform and every single factor" if not lost
                                        else f"the blend does NOT beat: {', '.join(lost)}") + how)
    verdicts = [not lost]
    for seed in range(args.seed + 1, args.seed + 1 + args.seeds):
        other = run_policies(config_of(seed), policies(leave_one_out=True))
        lost = losses(other)
        verdicts.append(not lost)
        p99s = "  ".join(f"{name} {r.p99_ms:.0f}/{100 * r.success_rate:.2f}%" for name, r in other.items())
        print(f"seed {seed}: p99/success  {p99s}\n         " + ("blend beats every single factor" if not lost
                                                                else f"blend does NOT beat: {', '.join(lost)}"))
    print(f"\n{sum(verdicts)} of {len(verdicts)} seeds: blend beats uniform and each factor alone "
          f"({time.perf_counter() - started:.1f} s wall)")
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
