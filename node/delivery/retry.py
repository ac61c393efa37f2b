"""Trying again: the one backoff formula of the SDK and the proxy (:class:`RetryPolicy`).

Which *agent* a call tries next is :mod:`node.delivery.attempts`'s business (the failover order
the SDK and the proxy share); which node errors the SDK retries is the client's
(``node.client._registration``).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

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


__all__ = ["DEFAULT_JITTER_RATIO", "DEFAULT_MAX_ATTEMPTS", "DEFAULT_RETRY_INITIAL_BACKOFF_MS",
           "DEFAULT_RETRY_MAX_BACKOFF_MS", "DEFAULT_RETRY_MULTIPLIER", "RetryPolicy", "Sleep"]
