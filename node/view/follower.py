"""A view in memory kept current with Redis: load a snapshot, tail a stream, reload at a gap.

Two views work this way: the region cache (``node.cache.RegionCache`` tails the region's
change stream) and the federation replica of the peers (``federation.replica.PeerCatalog``
tails the replica feed). :class:`StreamFollower` is what they share: the state, the listeners,
the owned tail task and the loop itself. A subclass says how to load its snapshot, read the
stream after a position, number an entry and apply one.

The entries of a stream are numbered consecutively from 1 (a change's region version, a feed
sequence number). The view holds ``position``, the number of the last entry it applied; an
entry that does not follow on from it — the capped stream was trimmed past the view, an entry
did not parse, Redis lost data — means the view missed something, and only a reload of the
whole snapshot can tell what. Changes are announced to listeners entry by entry, as they are
applied, so a reload half-way through a batch loses none of the changes applied before it
(the reload announces only how the snapshot differs from the view, and those are in the
view already).
"""

from __future__ import annotations

import abc
import asyncio
import enum
import logging
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, ClassVar, Generic, Self, TypeVar

from ..core import StoreUnavailable, cancel_and_wait
from ..core.models import ChangeEvent

log = logging.getLogger(__name__)

DEFAULT_RETRY_DELAY_MS = 500

ChangeListener = Callable[[ChangeEvent], None]
Entry = TypeVar("Entry")


class FollowerState(enum.Enum):
    """NEW → RUNNING ⇄ DISCONNECTED (serving from memory while Redis is unreachable) → CLOSED;
    FAILED when a background task died."""

    NEW = "new"
    RUNNING = "running"
    DISCONNECTED = "disconnected"
    FAILED = "failed"
    CLOSED = "closed"


class StreamFollower(abc.ABC, Generic[Entry]):
    """Loads a snapshot, then tails the stream after it; an async context manager.

    Listeners are called synchronously, in the event loop, for every applied change (including
    the ones a reload reports); they must be quick. One that raises is logged and the others
    still hear the change. ``aclose()`` is idempotent and stops every task the view owns.
    """

    stream_name: ClassVar[str]
    """What is tailed, for log lines ("change stream", "replica feed")."""

    def __init__(self, *, region: str, task_name: str, retry_delay_ms: int = DEFAULT_RETRY_DELAY_MS) -> None:
        self.region = region
        self.position = 0
        self.reloads = 0
        self.state = FollowerState.NEW
        self.retry_delay_ms = retry_delay_ms
        self._task_name = task_name
        self._listeners: list[ChangeListener] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._loaded = asyncio.Event()

    # -- what a subclass provides ------------------------------------------------------------

    @abc.abstractmethod
    async def _load(self) -> tuple[int, Iterable[ChangeEvent]]:
        """Swap in the snapshot Redis holds now; its position and the changes from the old view
        (iterated at once, before any other change: they may be made as they are iterated)."""

    @abc.abstractmethod
    async def _read(self, *, after: int) -> Sequence[Entry]:
        """The entries after ``after``, waiting a bounded time for the first (``[]`` if none came)."""

    @abc.abstractmethod
    def _number(self, entry: Entry) -> int:
        """The entry's place in the stream."""

    @abc.abstractmethod
    async def _apply(self, entry: Entry) -> Sequence[ChangeEvent]:
        """Apply one entry; the changes it made (none when the view held it already)."""

    @abc.abstractmethod
    async def _lost_data(self) -> bool:
        """With nothing to read: has the stream gone back behind ``position`` (Redis lost data)?"""

    def _background(self) -> dict[str, Coroutine[Any, Any, None]]:
        """Further loops the view runs while it runs, by task name."""
        return {}

    # -- public ------------------------------------------------------------------------------

    def subscribe(self, listener: ChangeListener) -> Callable[[], None]:
        """Call ``listener`` for every applied change; returns the unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    async def wait_loaded(self) -> None:
        """Return once the first snapshot is in (``start()`` finished)."""
        await self._loaded.wait()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Load the first snapshot (raises StoreUnavailable if Redis is down), then tail."""
        if self.state is not FollowerState.NEW:
            return
        await self.reload()
        self.state = FollowerState.RUNNING
        self._loaded.set()
        loops = {self._task_name: self._tail(), **self._background()}
        self._tasks = [asyncio.create_task(loop, name=name) for name, loop in loops.items()]
        for task in self._tasks:
            task.add_done_callback(self._task_done)

    async def aclose(self) -> None:
        if self.state is FollowerState.CLOSED:
            return
        self.state = FollowerState.CLOSED
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(tasks)

    async def reload(self) -> None:
        """Replace the view with the snapshot in Redis and tail on from its position."""
        self.position, changes = await self._load()
        self.reloads += 1
        self._emit(changes)

    # -- the tail ----------------------------------------------------------------------------

    async def _tail(self) -> None:
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except StoreUnavailable as exc:
                self._set_reachable(False)
                log.warning("region %s: cannot tail the %s: %s", self.region, self.stream_name, exc)
                await asyncio.sleep(self.retry_delay_ms / 1000)

    async def _follow(self) -> None:
        """One read: apply and announce each entry that follows on; at a gap, reload."""
        entries = await self._read(after=self.position)
        self._set_reachable(True)
        if not entries and await self._lost_data():
            log.warning("region %s: the %s went back behind %d (Redis lost data?); reloading", self.region,
                        self.stream_name, self.position)
            await self.reload()
            return
        for entry in entries:
            number = self._number(entry)
            if number != self.position + 1:
                log.warning("region %s: %s gap (have %d, next %d); reloading", self.region, self.stream_name,
                            self.position, number)
                await self.reload()
                return
            self._emit(await self._apply(entry))
            self.position = number

    # -- helpers -----------------------------------------------------------------------------

    def _emit(self, changes: Iterable[ChangeEvent]) -> None:
        for change in changes:
            for listener in list(self._listeners):
                try:
                    listener(change)
                except Exception:  # a broken listener must not stop the view
                    log.exception("region %s: listener %r of the %s failed", self.region, listener,
                                  self.stream_name)

    def _set_reachable(self, reachable: bool) -> None:
        if reachable and self.state is FollowerState.DISCONNECTED:
            log.info("region %s: Redis answers again", self.region)
            self.state = FollowerState.RUNNING
        elif not reachable and self.state is FollowerState.RUNNING:
            self.state = FollowerState.DISCONNECTED

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self.state is FollowerState.CLOSED:
            return
        exc = task.exception()
        if exc is not None:
            log.error("region %s: task %s died: %r", self.region, task.get_name(), exc)
            self.state = FollowerState.FAILED
