"""Per-caller token buckets: ``rate_per_s`` sustained, ``burst`` at once; 0 disables limiting."""

from __future__ import annotations

import time
from collections import OrderedDict

MAX_TRACKED_CALLERS = 100_000


class RateLimiter:
    """In-memory token buckets by caller; O(1) per request, bounded memory (LRU)."""

    def __init__(self, *, rate_per_s: float, burst: int, clock=time.monotonic) -> None:
        if rate_per_s < 0 or burst < 1:
            raise ValueError("rate_per_s must be >= 0 and burst >= 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def allow(self, caller: str) -> bool:
        if self.rate_per_s == 0:
            return True
        now = self._clock()
        tokens, last = self._buckets.pop(caller, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.rate_per_s)
        allowed = tokens >= 1.0
        self._buckets[caller] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > MAX_TRACKED_CALLERS:
            self._buckets.popitem(last=False)
        return allowed
