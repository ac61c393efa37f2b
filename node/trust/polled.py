"""``PolledList``: a list the region keeps in its Redis that every node holds in memory and reads
again when its version moves — what the token deny list (:mod:`.revocation`) and the ACL rules
(:mod:`.acl`) share.

Each node reads the list's version every ``poll_interval_ms`` and the whole list only when it
moved (a subclass's :meth:`PolledList.refresh`); a change through this node holds at once. Every
change is also appended to the list's log (a stream, id ``<version>-0``), which the federation's
relays read. While Redis cannot be reached the last list read stays in force.
"""

from __future__ import annotations

import asyncio
import enum
import logging

import redis.asyncio as aioredis

from ..core import StoreUnavailable, cancel_and_wait
from ..store import RedisErrors

__all__ = ["PollState", "PolledList"]

log = logging.getLogger(__name__)


class PollState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


class PolledList:
    """The poll, the change signal and the log position of a region-wide list; ``async with`` (or
    ``start()``/``aclose()``) runs the poll. ``what`` names the list in log lines."""

    what = "list"

    def __init__(self, redis: aioredis.Redis, *, region: str, key_log: str, poll_interval_ms: int) -> None:
        if poll_interval_ms <= 0:
            raise ValueError("poll_interval_ms must be positive")
        self.redis = redis
        self.region = region
        self.key_log = key_log
        self.poll_interval_ms = poll_interval_ms
        self.state = PollState.NEW
        self._task: asyncio.Task[None] | None = None
        self._unreachable = False
        self._changed = asyncio.Event()

    async def __aenter__(self) -> PolledList:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Load the list and start polling; raises :class:`StoreUnavailable` if Redis cannot be reached."""
        if self.state is not PollState.NEW:
            return
        await self.refresh()
        self.state = PollState.RUNNING
        self._task = asyncio.create_task(self._poll(), name=f"{self.what}-{self.region}")

    async def aclose(self) -> None:
        if self.state is PollState.CLOSED:
            return
        self.state = PollState.CLOSED
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    async def refresh(self) -> None:
        """Read the list again if its version moved; raises :class:`StoreUnavailable`."""
        raise NotImplementedError

    async def wait_changed(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a change this node made or read; True when one came (and
        the next call waits for the next one)."""
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except TimeoutError:
            return False
        self._changed.clear()
        return True

    async def log_position(self) -> str:
        """The id of the log's last entry ("0-0" for an empty log); raises :class:`StoreUnavailable`."""
        async with RedisErrors(self.region):
            last = await self.redis.xrevrange(self.key_log, count=1)
        return str(last[0][0]) if last else "0-0"

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_ms / 1000)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except StoreUnavailable as exc:
                if not self._unreachable:
                    log.warning("region %s: cannot read the %s (%s); the last one read stays in force", self.region,
                                self.what, exc)
                self._unreachable = True
            except Exception:  # the poll must outlive a surprise, or changes would stop arriving
                log.exception("region %s: reading the %s failed", self.region, self.what)
            else:
                if self._unreachable:
                    log.info("region %s: the %s is read again", self.region, self.what)
                self._unreachable = False
