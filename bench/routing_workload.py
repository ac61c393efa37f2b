"""The workload of the routing benchmark (:mod:`bench.routing`): the simulated fleet, the
caller's retry policy and deadline, and the bursty arrivals every policy sees (common random
numbers: the same config and seed give the same arrivals and per-request draws)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from node.client._config import DEFAULT_TICKET_REUSE_MS
from node.core.models import Status

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
