"""Coalescing concurrent writes into one round trip, without waiting to fill a batch.

A :class:`Coalescer` collects the items its callers :meth:`~Coalescer.submit` while one batch
is on its way to Redis and sends them together as the next batch as soon as that one is back
(group commit). An idle node sends a lone item at once (one event-loop turn later), so batching
adds no latency at low load and at high load turns N round trips into about N / (requests in
flight) of them. Each caller gets its own result or its own exception: the flush function
answers per item, and a flush that raises fails only the batch it was given.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["Coalescer", "DEFAULT_MAX_BATCH"]

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_MAX_BATCH = 256  # items per round trip: bounds a script's run inside Redis (about 1 ms)

Flush = Callable[[list[T]], Awaitable[list["R | BaseException"]]]


class Coalescer(Generic[T, R]):
    """Items submitted concurrently, flushed in batches of at most ``max_batch``.

    ``flush(items)`` returns one result per item, in order: a value, or an exception that the
    item's caller then raises. ``batches`` and ``items`` count what was flushed (the mean batch
    is their ratio). What waits is kept by submission (a caller's items and one future for them):
    a session's frame of 1,000 renewals waits on a handful of futures, not on 1,000.
    """

    def __init__(self, flush: Flush[T, R], *, max_batch: int = DEFAULT_MAX_BATCH, name: str = "coalescer") -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._flush = flush
        self.max_batch = max_batch
        self.name = name
        self.batches = 0
        self.items = 0
        self._pending: deque[tuple[list[T], asyncio.Future[list[R | BaseException]]]] = deque()
        self._task: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        (result,) = await self._enqueue([item])
        if isinstance(result, BaseException):
            raise result
        return result

    async def submit_many(self, items: list[T]) -> list[R | BaseException]:
        """Submit ``items`` at once (one caller's batch); one result or exception per item, in order."""
        step = self.max_batch
        futures = [self._enqueue(items[start:start + step]) for start in range(0, len(items), step)]
        results: list[R | BaseException] = []
        for future in futures:  # the parts land one batch after another
            results += await future
        return results

    def _enqueue(self, items: list[T]) -> asyncio.Future[list[R | BaseException]]:
        future: asyncio.Future[list[R | BaseException]] = asyncio.get_running_loop().create_future()
        self._pending.append((items, future))
        if self._task is None:
            self._task = asyncio.create_task(self._drain(), name=self.name)
        return future

    async def _drain(self) -> None:
        try:
            pending = self._pending
            while pending:
                batch = [pending.popleft()]  # whole submissions, as many as fit (at least one)
                size = len(batch[0][0])
                while pending and size + len(pending[0][0]) <= self.max_batch:
                    size += len(pending[0][0])
                    batch.append(pending.popleft())
                await self._send(batch, size)
        finally:
            self._task = None

    async def _send(self, batch: list[tuple[list[T], asyncio.Future[list[R | BaseException]]]], size: int) -> None:
        self.batches += 1
        self.items += size
        try:
            results = await self._flush([item for items, _ in batch for item in items] if len(batch) > 1 else batch[0][0])
            if len(results) != size:
                raise RuntimeError(f"{self.name}: flush answered {len(results)} of {size} items")
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # the whole batch failed (e.g. Redis unreachable): each caller sees it
            results = [exc] * size
        offset = 0
        for items, future in batch:
            if not future.done():  # else the caller gave up (its request was cancelled)
                future.set_result(results[offset:offset + len(items)])
            offset += len(items)
