"""Singleton duties under a Redis leader lease: exactly one replica of a region runs them.

A replica holds the lease while it keeps renewing it (every ttl/3). Duties (the sweeper, the
prober, the federation publisher/consumer …) are async callables started when this replica
becomes leader and cancelled when it stops being one — including when Redis stops answering,
since a replica that cannot renew must assume another one took over.

The lease is one key under the region's hash tag, on the store's connections::

    {prefix}:{region}:leader  STRING  node id of the replica holding the singleton duties (PX: the ttl)

Taking or renewing it and giving it up are one script each (:data:`ACQUIRE`, :data:`RELEASE`):
a replica moves the lease only while it holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from ..core import StoreUnavailable, cancel_and_wait
from ..store import RedisErrors, RegionStore

log = logging.getLogger(__name__)

DEFAULT_LEADER_TTL_MS = 5_000

Duty = Callable[[], Awaitable[None]]

# KEYS: leader. ARGV: node id, ttl ms. Returns 1 when this node holds (or now took) the lease.
ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: leader. ARGV: node id. Gives the lease up only if this node holds it; returns 1 if it did.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def new_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


class LeaderLease:
    """The region's leader key in Redis: which replica holds the singleton duties.

    Every call raises :class:`StoreUnavailable` when Redis cannot be reached.
    """

    def __init__(self, redis: aioredis.Redis, *, key_base: str, region: str) -> None:
        self.redis = redis
        self.region = region
        self.key = f"{key_base}:leader"
        self._acquire = redis.register_script(ACQUIRE)
        self._release = redis.register_script(RELEASE)

    @classmethod
    def of(cls, store: RegionStore) -> LeaderLease:
        """The leader lease of ``store``'s region, on the store's connections."""
        return cls(store.redis, key_base=store.key_base, region=store.region)

    async def acquire(self, node_id: str, *, ttl_ms: int) -> bool:
        """Take the lease for ``ttl_ms`` if no replica holds it, or renew it if ``node_id`` does;
        whether ``node_id`` holds it now."""
        async with RedisErrors(self.region):
            return bool(await self._acquire(keys=[self.key], args=[node_id, ttl_ms]))

    async def release(self, node_id: str) -> None:
        """Give the lease up, if ``node_id`` holds it (another replica's lease is left alone)."""
        async with RedisErrors(self.region):
            await self._release(keys=[self.key], args=[node_id])

    async def holder(self) -> str | None:
        """The node id holding the lease, or None while no replica does."""
        async with RedisErrors(self.region):
            return await self.redis.get(self.key)


class Leadership:
    """Campaigns for the region's leader lease and runs duties while holding it."""

    def __init__(self, lease: LeaderLease, *, node_id: str, ttl_ms: int = DEFAULT_LEADER_TTL_MS) -> None:
        if ttl_ms < 300:
            raise ValueError("leader ttl_ms must be at least 300")
        self.lease = lease
        self.node_id = node_id
        self.ttl_ms = ttl_ms
        self.is_leader = False
        self.terms = 0
        self._duties: list[tuple[str, Duty]] = []
        self._running: list[asyncio.Task[None]] = []
        self._campaign: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    @classmethod
    def of(cls, store: RegionStore, *, node_id: str, ttl_ms: int = DEFAULT_LEADER_TTL_MS) -> Leadership:
        """Leadership of ``store``'s region, its lease on the store's connections."""
        return cls(LeaderLease.of(store), node_id=node_id, ttl_ms=ttl_ms)

    def add_duty(self, name: str, duty: Duty) -> None:
        """Run ``duty()`` while leader; it should loop until cancelled. Add before ``start``."""
        self._duties.append((name, duty))

    async def start(self) -> None:
        if self._campaign is None:
            self._campaign = asyncio.create_task(self._run(), name=f"leader-{self.lease.region}")

    async def aclose(self) -> None:
        if self._campaign is not None:
            await cancel_and_wait([self._campaign])
            self._campaign = None
        await self._stop_duties()
        if self.is_leader:
            self.is_leader = False
            with contextlib.suppress(StoreUnavailable):
                await self.lease.release(self.node_id)

    async def wait_changed(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    async def _run(self) -> None:
        interval = self.ttl_ms / 3000
        while True:
            try:
                holding = await self.lease.acquire(self.node_id, ttl_ms=self.ttl_ms)
            except StoreUnavailable as exc:
                log.warning("region %s: leader lease not renewable: %s", self.lease.region, exc)
                holding = False
            if holding and not self.is_leader:
                self.is_leader = True
                self.terms += 1
                log.info("region %s: %s is now the leader", self.lease.region, self.node_id)
                self._start_duties()
                self._changed.set()
            elif not holding and self.is_leader:
                self.is_leader = False
                log.warning("region %s: %s lost the leader lease", self.lease.region, self.node_id)
                await self._stop_duties()
                self._changed.set()
            self._restart_dead_duties()
            await asyncio.sleep(interval)

    def _start_duties(self) -> None:
        self._running = [asyncio.create_task(self._guard(name, duty), name=f"duty-{name}")
                         for name, duty in self._duties]

    def _restart_dead_duties(self) -> None:
        if not self.is_leader:
            return
        for position, task in enumerate(self._running):
            if task.done():
                name, duty = self._duties[position]
                log.warning("region %s: duty %s ended; restarting it", self.lease.region, name)
                self._running[position] = asyncio.create_task(self._guard(name, duty), name=f"duty-{name}")

    async def _guard(self, name: str, duty: Duty) -> None:
        try:
            await duty()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("region %s: duty %s failed", self.lease.region, name)

    async def _stop_duties(self) -> None:
        running, self._running = self._running, []
        await cancel_and_wait(running)
