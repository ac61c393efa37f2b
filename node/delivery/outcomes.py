"""What callers report about their calls: a decaying error rate and a circuit breaker per agent.

The error rate lowers an agent's routing weight (a soft penalty); the breaker takes it out of
routing entirely after ``failure_threshold`` failures within ``window_ms`` (open), lets one
trial ticket through after ``cooldown_ms`` (half-open), and closes on a successful trial or
re-opens on a failed one. Only the trial's own report (its ticket id) or trusted evidence moves a
half-open breaker: a caller who kept an older ticket cannot close it for everyone by reporting a
success, nor re-open it with a failure. State lives in the node's memory: each replica learns
from the reports it receives, which is what Envoy's outlier detection does per proxy.

No caller decides for everyone: a report names its ``reporter`` (the caller's token subject), and
each reporter's failures count for at most half of ``failure_threshold`` (rounded up) towards
the shared breaker, so with a threshold of 2 or more it opens on the word of two callers or more
(or of trusted evidence: ``reporter`` None, an admin's or a peer's reports). A reporter whose own failures reach the threshold ejects
the agent from its own routing only, for ``cooldown_ms`` (:meth:`OutcomeTracker.ejected_for`):
a single caller of a broken agent stops calling it, and one ticket holder's made-up failures no
longer take an agent out for every caller. Likewise one reporter's failures and rejections move
the shared error penalty at most that half-threshold many times per window.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.models import Outcome

DEFAULT_BREAKER_FAILURES = 10
DEFAULT_BREAKER_WINDOW_MS = 30_000
DEFAULT_BREAKER_COOLDOWN_MS = 10_000
DEFAULT_ERROR_HALF_LIFE_MS = 30_000
ERROR_EWMA_ALPHA = 0.2
MIN_ERROR_FACTOR = 0.1
ERROR_RECHECK_MS = 1_000
NEGLIGIBLE_ERROR_RATE = 0.01
MAX_REPORTERS = 64  # per agent: the reporters whose recent failures are held (the oldest go first)
MAX_PRIVATE_EJECTIONS = 10_000  # (reporter, agent) pairs held at once across the node


class BreakerState(str, enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(slots=True)
class AgentHealth:
    failures: deque[int] = field(default_factory=deque)  # trusted evidence (no reporter)
    by_reporter: dict[str, deque[int]] = field(default_factory=dict)  # each reporter's, within the window
    penalised_by: dict[str, deque[int]] = field(default_factory=dict)  # when a reporter's word moved error_rate
    error_rate: float = 0.0
    error_rate_at_ms: int = 0
    state: BreakerState = BreakerState.CLOSED
    opened_at_ms: int = 0
    trial_issued_at_ms: int = 0
    trial_ticket: str | None = None  # the half-open trial's ticket id: its report decides


class OutcomeTracker:
    """Per-agent error rates and breakers; all methods are O(1) amortised and never block."""

    def __init__(self, *, failure_threshold: int = DEFAULT_BREAKER_FAILURES,
                 window_ms: int = DEFAULT_BREAKER_WINDOW_MS, cooldown_ms: int = DEFAULT_BREAKER_COOLDOWN_MS,
                 error_half_life_ms: int = DEFAULT_ERROR_HALF_LIFE_MS) -> None:
        if failure_threshold < 1 or window_ms <= 0 or cooldown_ms <= 0 or error_half_life_ms <= 0:
            raise ValueError("breaker thresholds and durations must be positive")
        self.failure_threshold = failure_threshold
        self.window_ms = window_ms
        self.cooldown_ms = cooldown_ms
        self.error_half_life_ms = error_half_life_ms
        self._agents: dict[str, AgentHealth] = {}
        self._share = (failure_threshold + 1) // 2  # one reporter's part of a breaker: half, rounded up
        self._private: dict[str, dict[str, int]] = {}  # reporter -> {agent it ejected for itself: until ms}
        self.opened_total = 0
        # Bumped whenever a routing-relevant fact changes (a breaker moves, an error rate
        # moves), so the router knows its precomputed tables are out of date.
        self.generation = 0

    def record(self, agent_id: str, outcome: Outcome, *, now_ms: int, reporter: str | None = None,
               ticket_id: str | None = None) -> BreakerState:
        """One call's outcome; ``reporter``: the caller who reports it (None: trusted evidence);
        ``ticket_id``: the ticket it reports on (a half-open breaker heeds its trial's only)."""
        health = self._agents.setdefault(agent_id, AgentHealth())
        failed = outcome is not Outcome.SUCCESS
        if failed or health.error_rate or health.state is not BreakerState.CLOSED:
            self.generation += 1
        if not (failed and reporter is not None and self._spent(health, reporter, now_ms)):
            health.error_rate = (self._decayed(health, now_ms) * (1 - ERROR_EWMA_ALPHA)
                                 + (ERROR_EWMA_ALPHA if failed else 0.0))
            health.error_rate_at_ms = now_ms
        if outcome is Outcome.REJECTED:
            # A 429 says "too busy", not "broken": it lowers the weight but never trips the breaker.
            return health.state
        if health.state is BreakerState.HALF_OPEN and reporter is not None and ticket_id != health.trial_ticket:
            return health.state  # a call from before the trial: the trial decides
        if not failed:
            if health.state is BreakerState.HALF_OPEN:
                health.state = BreakerState.CLOSED
                health.failures.clear()
                health.by_reporter.clear()
            return health.state
        if health.state is BreakerState.HALF_OPEN:
            self._open(health, now_ms)
            return health.state
        if reporter is None:
            health.failures.append(now_ms)
        else:
            self._reported(health, agent_id, reporter, now_ms)
        if health.state is BreakerState.CLOSED and self._evidence(health, now_ms) >= self.failure_threshold:
            self._open(health, now_ms)
        return health.state

    def _spent(self, health: AgentHealth, reporter: str, now_ms: int) -> bool:
        """Whether ``reporter`` has moved the error penalty as often as one caller may within the
        window (its share of the breaker); if not, this report is counted as a move."""
        moves = _latest(health.penalised_by, reporter, self._share)
        if len(moves) == moves.maxlen and moves[0] > now_ms - self.window_ms:
            return True
        moves.append(now_ms)
        return False

    def _reported(self, health: AgentHealth, agent_id: str, reporter: str, now_ms: int) -> None:
        mine = _latest(health.by_reporter, reporter, self.failure_threshold)
        mine.append(now_ms)
        if len(mine) == self.failure_threshold and mine[0] > now_ms - self.window_ms:
            self._eject_for(reporter, agent_id, until_ms=now_ms + self.cooldown_ms)

    def _evidence(self, health: AgentHealth, now_ms: int) -> int:
        """The failures within the window that count for the shared breaker."""
        horizon = now_ms - self.window_ms
        while health.failures and health.failures[0] <= horizon:
            health.failures.popleft()
        counted = len(health.failures)
        for reporter, times in list(health.by_reporter.items()):
            while times and times[0] <= horizon:
                times.popleft()
            if not times:
                del health.by_reporter[reporter]
            counted += min(len(times), self._share)
        return counted

    def _eject_for(self, reporter: str, agent_id: str, *, until_ms: int) -> None:
        mine = self._private.setdefault(reporter, {})
        if agent_id not in mine and sum(map(len, self._private.values())) >= MAX_PRIVATE_EJECTIONS:
            oldest = next(who for who, agents in self._private.items() if agents)
            self._readmit(oldest, next(iter(self._private[oldest])))
        mine[agent_id] = until_ms

    def _readmit(self, reporter: str, agent_id: str) -> None:
        agents = self._private.get(reporter)
        if agents is not None:
            agents.pop(agent_id, None)
            if not agents:
                del self._private[reporter]

    def ejected_for(self, reporter: str, *, now_ms: int) -> frozenset[str]:
        """The agents ``reporter``'s own failures took out of its routing (empty for nearly every caller)."""
        agents = self._private.get(reporter)
        if not agents:
            return frozenset()
        for agent_id in [a for a, until in agents.items() if until <= now_ms]:
            self._readmit(reporter, agent_id)
        return frozenset(self._private.get(reporter, ()))

    def _open(self, health: AgentHealth, now_ms: int) -> None:
        health.state = BreakerState.OPEN
        health.opened_at_ms = now_ms
        health.failures.clear()
        health.by_reporter.clear()
        health.penalised_by.clear()
        self.opened_total += 1

    def state(self, agent_id: str, *, now_ms: int) -> BreakerState:
        health = self._agents.get(agent_id)
        if health is None:
            return BreakerState.CLOSED
        if health.state is BreakerState.OPEN and now_ms - health.opened_at_ms >= self.cooldown_ms:
            health.state = BreakerState.HALF_OPEN
            health.trial_issued_at_ms = 0
            health.trial_ticket = None
            self.generation += 1
        return health.state

    def admits(self, agent_id: str, *, now_ms: int) -> bool:
        """May this agent be routed to now? Half-open admits one trial per cool-down."""
        state = self.state(agent_id, now_ms=now_ms)
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN:
            return False
        health = self._agents[agent_id]
        return now_ms - health.trial_issued_at_ms >= self.cooldown_ms

    def issued(self, agent_id: str, *, now_ms: int, ticket_id: str | None = None) -> None:
        """A ticket names this agent as its target (marks the half-open trial)."""
        health = self._agents.get(agent_id)
        if health is not None and health.state is BreakerState.HALF_OPEN:
            health.trial_issued_at_ms = now_ms
            health.trial_ticket = ticket_id
            self.generation += 1

    def next_change_ms(self, agent_id: str) -> int | None:
        """When this agent's breaker next moves by itself (time passing), if ever.

        Error rates decay continuously; callers holding derived weights re-read
        :meth:`weight_factor` every ``ERROR_RECHECK_MS`` while it is below 1.
        """
        health = self._agents.get(agent_id)
        if health is None:
            return None
        if health.state is BreakerState.OPEN:
            return health.opened_at_ms + self.cooldown_ms
        if health.state is BreakerState.HALF_OPEN and health.trial_issued_at_ms:
            return health.trial_issued_at_ms + self.cooldown_ms
        return None

    def weight_factor(self, agent_id: str, *, now_ms: int) -> float:
        """1.0 for a clean agent down to ``MIN_ERROR_FACTOR`` for one that keeps failing."""
        health = self._agents.get(agent_id)
        if health is None:
            return 1.0
        return max(MIN_ERROR_FACTOR, 1.0 - self._decayed(health, now_ms))

    def _decayed(self, health: AgentHealth, now_ms: int) -> float:
        if health.error_rate == 0.0:
            return 0.0
        elapsed = max(0, now_ms - health.error_rate_at_ms)
        rate = health.error_rate * math.pow(0.5, elapsed / self.error_half_life_ms)
        if rate < NEGLIGIBLE_ERROR_RATE:
            health.error_rate = 0.0  # forgotten: weights stop being re-derived for it
            return 0.0
        return rate

    def tracked(self) -> list[str]:
        """The agents this tracker holds a breaker or an error rate for (the console shows them)."""
        return list(self._agents)

    def forget(self, agent_id: str) -> None:
        self._agents.pop(agent_id, None)
        for reporter in [reporter for reporter, agents in self._private.items() if agent_id in agents]:
            self._readmit(reporter, agent_id)

    def open_count(self, *, now_ms: int) -> int:
        return sum(1 for agent_id in self._agents if self.state(agent_id, now_ms=now_ms) is not BreakerState.CLOSED)


def _latest(held: dict[str, deque[int]], reporter: str, maxlen: int) -> deque[int]:
    """``reporter``'s times in ``held``, moved last (most recent); the least recent reporter goes
    beyond ``MAX_REPORTERS``."""
    times = held.pop(reporter, None) or deque(maxlen=maxlen)
    held[reporter] = times
    if len(held) > MAX_REPORTERS:
        del held[next(iter(held))]
    return times


class ClientBreakers:
    """This client's breaker per target (an :class:`OutcomeTracker` fed by its own calls' outcomes).

    It satisfies :class:`node.delivery.attempts.Breakers`, so the failover skips what it holds open.
    """

    def __init__(self, tracker: OutcomeTracker, *, now_ms: Callable[[], int]) -> None:
        self.tracker = tracker
        self._now_ms = now_ms
        self._seen: set[str] = set()  # every target an outcome was recorded for

    def admits(self, agent_id: str) -> bool:
        return self.tracker.admits(agent_id, now_ms=self._now_ms())

    def issued(self, agent_id: str) -> None:
        self.tracker.issued(agent_id, now_ms=self._now_ms())

    def record(self, agent_id: str, outcome: Outcome) -> None:
        self._seen.add(agent_id)
        self.tracker.record(agent_id, outcome, now_ms=self._now_ms())

    def state(self, agent_id: str) -> BreakerState:
        return self.tracker.state(agent_id, now_ms=self._now_ms())

    def open_agents(self) -> list[str]:
        """The targets seen so far whose breaker does not admit a call now."""
        now = self._now_ms()
        return [agent_id for agent_id in self._seen if not self.tracker.admits(agent_id, now_ms=now)]
