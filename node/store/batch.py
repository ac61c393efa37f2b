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
    is their ratio).
    """

    def __init__(self, flush: Flush[T, R], *, max_batch: int = DEFAULT_MAX_BATCH, name: str = "coalescer") -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._flush = flush
        self.max_batch = max_batch
        self.name = name
        self.batches = 0
        self.items = 0
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._task is None:
            self._task = asyncio.create_task(self._drain(), name=self.name)
        return await future

    async def submit_many(self, items: list[T]) -> list[R | BaseException]:
        """Submit ``items`` at once (one caller's batch); one result or exception per item, in order."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[R]] = [loop.create_future() for _ in items]
        self._pending.extend(zip(items, futures))
        if self._task is None:
            self._task = asyncio.create_task(self._drain(), name=self.name)
        results: list[R | BaseException] = []
        for future in futures:  # the batch lands at once: after the first, each is already done
            try:
                results.append(await future)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the item's own failure, given back with the others
                results.append(exc)
        return results

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
                await self._send(batch)
        finally:
            self._task = None

    async def _send(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        self.batches += 1
        self.items += len(batch)
        try:
            results = await self._flush([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{self.name}: flush answered {len(results)} of {len(batch)} items")
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # the whole batch failed (e.g. Redis unreachable): each caller sees it
            results = [exc] * len(batch)
        for (_, future), result in zip(batch, results):
            if future.done():  # the caller gave up (its request was cancelled)
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
