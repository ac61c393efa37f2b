"""Singleton duties under a Redis leader lease: exactly one replica of a region runs them.

A replica holds the lease while it keeps renewing it (every ttl/3). Duties (the sweeper, the
prober, the federation publisher/consumer …) are async callables started when this replica
becomes leader and cancelled when it stops being one — including when Redis stops answering,
since a replica that cannot renew must assume another one took over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable

from ..core import StoreUnavailable, cancel_and_wait
from ..store import RegionStore

log = logging.getLogger(__name__)

DEFAULT_LEADER_TTL_MS = 5_000

Duty = Callable[[], Awaitable[None]]


def new_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


class Leadership:
    """Campaigns for the region's leader lease and runs duties while holding it."""

    def __init__(self, store: RegionStore, *, node_id: str, ttl_ms: int = DEFAULT_LEADER_TTL_MS) -> None:
        if ttl_ms < 300:
            raise ValueError("leader ttl_ms must be at least 300")
        self.store = store
        self.node_id = node_id
        self.ttl_ms = ttl_ms
        self.is_leader = False
        self.terms = 0
        self._duties: list[tuple[str, Duty]] = []
        self._running: list[asyncio.Task[None]] = []
        self._campaign: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    def add_duty(self, name: str, duty: Duty) -> None:
        """Run ``duty()`` while leader; it should loop until cancelled. Add before ``start``."""
        self._duties.append((name, duty))

    async def start(self) -> None:
        if self._campaign is None:
            self._campaign = asyncio.create_task(self._run(), name=f"leader-{self.store.region}")

    async def aclose(self) -> None:
        if self._campaign is not None:
            await cancel_and_wait([self._campaign])
            self._campaign = None
        await self._stop_duties()
        if self.is_leader:
            self.is_leader = False
            with contextlib.suppress(StoreUnavailable):
                await self.store.release_leadership(self.node_id)

    async def wait_changed(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    async def _run(self) -> None:
        interval = self.ttl_ms / 3000
        while True:
            try:
                holding = await self.store.acquire_leadership(self.node_id, ttl_ms=self.ttl_ms)
            except StoreUnavailable as exc:
                log.warning("region %s: leader lease not renewable: %s", self.store.region, exc)
                holding = False
            if holding and not self.is_leader:
                self.is_leader = True
                self.terms += 1
                log.info("region %s: %s is now the leader", self.store.region, self.node_id)
                self._start_duties()
                self._changed.set()
            elif not holding and self.is_leader:
                self.is_leader = False
                log.warning("region %s: %s lost the leader lease", self.store.region, self.node_id)
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
                log.warning("region %s: duty %s ended; restarting it", self.store.region, name)
                self._running[position] = asyncio.create_task(self._guard(name, duty), name=f"duty-{name}")

    async def _guard(self, name: str, duty: Duty) -> None:
        try:
            await duty()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("region %s: duty %s failed", self.store.region, name)

    async def _stop_duties(self) -> None:
        running, self._running = self._running, []
        await cancel_and_wait(running)
