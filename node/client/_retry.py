"""Trying again: the backoff formula, registration with backoff, and the client-side breaker.

Only transient node errors are retried (:func:`retryable_node_error`). Which *agent* a call
tries next is :mod:`node.client.delivery`'s business (the failover order the proxy shares).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..errors import Conflict, NodeError, RateLimited, StoreUnavailable
from ..models import Outcome, RegisterResponse
from ..outcomes import BreakerState, OutcomeTracker
from ._errors import NodeUnreachable

log = logging.getLogger("node.client")  # the SDK logs under one name, whichever module it is in

DEFAULT_RETRY_INITIAL_BACKOFF_MS = 500
DEFAULT_RETRY_MAX_BACKOFF_MS = 8_000
DEFAULT_RETRY_MULTIPLIER = 2.0
DEFAULT_JITTER_RATIO = 0.2
DEFAULT_MAX_ATTEMPTS = 3
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter: ``min(max, initial × multiplier^attempt) ± jitter``.

    ``attempt`` counts retries from 0 (the wait before the first retry). With the defaults the
    waits are 0.5 s, 1 s, 2 s, 4 s, 8 s, 8 s … each scaled by a uniform factor in [0.8, 1.2].
    """

    initial_backoff_s: float = DEFAULT_RETRY_INITIAL_BACKOFF_MS / 1000
    multiplier: float = DEFAULT_RETRY_MULTIPLIER
    max_backoff_s: float = DEFAULT_RETRY_MAX_BACKOFF_MS / 1000
    jitter_ratio: float = DEFAULT_JITTER_RATIO
    max_attempts: int = DEFAULT_MAX_ATTEMPTS

    def __post_init__(self) -> None:
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("backoffs must satisfy 0 <= initial_backoff_s <= max_backoff_s")
        if self.multiplier < 1.0 or not 0.0 <= self.jitter_ratio < 1.0 or self.max_attempts < 1:
            raise ValueError("need multiplier >= 1, 0 <= jitter_ratio < 1 and max_attempts >= 1")

    def base_backoff_s(self, attempt: int) -> float:
        """The wait before retry number ``attempt`` (0-based), without jitter."""
        if attempt < 0:
            raise ValueError("attempt counts from 0")
        # Cap the exponent so a long retry loop never overflows a float.
        return min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** min(attempt, 64))

    def backoff_s(self, attempt: int, rng: random.Random) -> float:
        """The jittered wait; draws exactly one ``rng.random()``."""
        return self.base_backoff_s(attempt) * (1.0 + self.jitter_ratio * (2.0 * rng.random() - 1.0))


def retryable_node_error(exc: NodeError) -> bool:
    """Transient: the node could not answer now (not: the request is wrong)."""
    return isinstance(exc, (NodeUnreachable, StoreUnavailable, RateLimited, Conflict)) or exc.status >= 500


async def register_with_backoff(register: Callable[[], Awaitable[RegisterResponse]], *, agent_id: str,
                                policy: RetryPolicy, rng: random.Random, sleep: Sleep, clock: Callable[[], float],
                                max_wait_s: float | None, stopping: Callable[[], bool] = lambda: False
                                ) -> RegisterResponse:
    """``register()`` (one request to the node), retrying transient failures with backoff.

    Raises the node's error at once for a rejection, and the last transient error once
    ``max_wait_s`` has passed (``0``: one try only).
    """
    started = clock()
    attempt = 0
    while True:
        try:
            return await register()
        except NodeError as exc:
            if not retryable_node_error(exc) or stopping():
                raise
            delay = policy.backoff_s(attempt, rng)
            if max_wait_s is not None and clock() - started + delay > max_wait_s:
                raise
            log.warning("registering %s: %s; retrying in %.2fs", agent_id, exc.message, delay)
            attempt += 1
            await sleep(delay)


class ClientBreakers:
    """This client's breaker per target (an :class:`OutcomeTracker` fed by its own calls' outcomes).

    It satisfies :class:`node.client.delivery.Breakers`, so the failover skips what it holds open.
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


__all__ = ["ClientBreakers", "RetryPolicy", "Sleep", "register_with_backoff", "retryable_node_error"]
