"""The lease sweeper: removes agents whose lease passed and appends their tombstones.

Runs as a leader duty. Self-preservation (Eureka's lesson): a sweep that would expire more than
``max_expire_fraction`` of the region at once, in a region of at least ``protect_min_agents``,
is far more likely a node or network fault (this node paused, agents cut off from Redis) than
half the fleet dying in one interval — so it is held back, logged and counted, for at most
``protection_max_hold_ms``, after which the expiry goes through.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from ..core import StoreUnavailable, now_ms
from ..store import RegionStore
from ..view import DEFAULT_PRESERVE_MIN_AGENTS

log = logging.getLogger(__name__)

DEFAULT_SWEEP_INTERVAL_MS = 1_000
DEFAULT_MAX_EXPIRE_FRACTION = 0.5
DEFAULT_PROTECTION_MAX_HOLD_MS = 60_000
SWEEP_BATCH = 500


@dataclass(slots=True)
class SweepStats:
    sweeps: int = 0
    expired: int = 0
    held_back: int = 0
    holding_since_ms: int = 0


class Sweeper:
    """Expires passed leases every ``interval_ms``; one instance per region leader."""

    def __init__(self, store: RegionStore, *, interval_ms: int = DEFAULT_SWEEP_INTERVAL_MS,
                 max_expire_fraction: float = DEFAULT_MAX_EXPIRE_FRACTION,
                 protect_min_agents: int = DEFAULT_PRESERVE_MIN_AGENTS,
                 protection_max_hold_ms: int = DEFAULT_PROTECTION_MAX_HOLD_MS) -> None:
        if interval_ms <= 0 or not 0 < max_expire_fraction <= 1:
            raise ValueError("interval_ms must be positive and max_expire_fraction in (0, 1]")
        self.store = store
        self.interval_ms = interval_ms
        self.max_expire_fraction = max_expire_fraction
        self.protect_min_agents = protect_min_agents
        self.protection_max_hold_ms = protection_max_hold_ms
        self.stats = SweepStats()

    async def run(self) -> None:
        """Sweep forever (until cancelled); Redis outages are logged and retried."""
        while True:
            try:
                await self.sweep_once()
            except StoreUnavailable as exc:
                log.warning("region %s: sweep failed: %s", self.store.region, exc)
            await asyncio.sleep(self.interval_ms / 1000)

    async def sweep_once(self) -> int:
        """One pass; returns how many agents it expired."""
        now = now_ms()
        self.stats.sweeps += 1
        total = await self.store.count()
        due = await self.store.expired_ids(now_ms=now, limit=max(total, 1))
        if not due:
            self.stats.holding_since_ms = 0
            return 0
        if self._should_hold(len(due), total, now):
            return 0
        expired = 0
        for start in range(0, len(due), SWEEP_BATCH):
            expired += len(await self.store.expire(due[start:start + SWEEP_BATCH], at_ms=now))
        self.stats.expired += expired
        if expired:
            log.info("region %s: expired %d lease(s)", self.store.region, expired)
        return expired

    def _should_hold(self, due: int, total: int, now: int) -> bool:
        if total < self.protect_min_agents or due <= self.max_expire_fraction * total:
            self.stats.holding_since_ms = 0
            return False
        if not self.stats.holding_since_ms:
            self.stats.holding_since_ms = now
        held_for = now - self.stats.holding_since_ms
        if held_for >= self.protection_max_hold_ms:
            log.warning("region %s: mass expiry of %d/%d held for %d ms; letting it through",
                        self.store.region, due, total, held_for)
            self.stats.holding_since_ms = 0
            return False
        self.stats.held_back += 1
        log.warning("region %s: sweep would expire %d of %d agents at once; held back (self-preservation)",
                    self.store.region, due, total)
        return True
