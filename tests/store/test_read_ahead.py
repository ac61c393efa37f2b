"""node.store.read_ahead: items in order, a source's error after the items before it, and a consumer
that leaves early stops the reading task."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from node.store.read_ahead import read_ahead

pytestmark = pytest.mark.unit


async def _source(items: list[int], *, fail_after: int | None = None, log: list[str] | None = None):
    for n, item in enumerate(items):
        if fail_after is not None and n == fail_after:
            raise ConnectionError("the store went away")
        if log is not None:
            log.append(f"read {item}")
        yield item
    if log is not None:
        log.append("read all")


async def test_items_come_in_order_and_the_reader_runs_ahead() -> None:
    log: list[str] = []
    seen = []
    async for item in read_ahead(_source(list(range(5)), log=log), depth=1):
        await asyncio.sleep(0)  # the consumer lets the loop run: the reader gets ahead
        log.append(f"used {item}")
        seen.append(item)
    assert seen == [0, 1, 2, 3, 4]
    # Item 1 was read before item 0 was used up: reading overlapped the work on the item before.
    assert log.index("read 1") < log.index("used 0")


async def test_an_error_of_the_source_comes_after_the_items_before_it() -> None:
    seen = []
    with pytest.raises(ConnectionError, match="went away"):
        async for item in read_ahead(_source([1, 2, 3, 4], fail_after=2)):
            seen.append(item)
    assert seen == [1, 2]


async def test_leaving_early_stops_the_reader() -> None:
    before = asyncio.all_tasks()
    async with contextlib.aclosing(read_ahead(_source(list(range(100))))) as items:
        async for item in items:
            if item == 3:
                break
    assert asyncio.all_tasks() - before == set()  # closed: the reading task is gone at once
