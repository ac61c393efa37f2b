"""node.core.tasks: owned background tasks stop for sure, even when a library swallows a cancel."""

from __future__ import annotations

import asyncio
import logging

import pytest

from node.core import cancel_and_wait, run_together
from node.core.tasks import awaiting

pytestmark = pytest.mark.unit


async def _stubborn(swallowed: list[int]) -> None:
    """Waits forever, swallowing the first cancel as aiokafka's consumer ``stop()`` does."""
    while True:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed.append(1)


async def test_an_owner_stops_even_when_a_child_swallows_its_cancel() -> None:
    swallowed: list[int] = []
    owner = asyncio.create_task(run_together({"stubborn": _stubborn(swallowed), "idle": asyncio.Event().wait()}))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    async with asyncio.timeout(10):  # a TaskGroup owner would wait here forever
        await cancel_and_wait([owner])
    assert owner.cancelled() and swallowed == [1]


async def test_the_first_loop_to_fail_stops_the_others_and_its_error_is_raised() -> None:
    stopped = asyncio.Event()

    async def idle() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    async def failing() -> None:
        await asyncio.sleep(0)
        raise ValueError("broken")

    with pytest.raises(ValueError, match="broken"):
        async with asyncio.timeout(10):
            await run_together({"idle": idle(), "failing": failing()})
    assert stopped.is_set()


async def test_a_task_that_will_not_stop_is_named_with_where_it_waits(caplog: pytest.LogCaptureFixture,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("node.core.tasks._STUCK_REPORT_S", 0.1)
    swallowed: list[int] = []
    release = asyncio.Event()

    async def deaf() -> None:  # ignores cancels until released
        while not release.is_set():
            try:
                await _stubborn(swallowed)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(deaf(), name="deaf-loop")
    await asyncio.sleep(0)
    stopping = asyncio.create_task(cancel_and_wait([task]))
    with caplog.at_level(logging.WARNING, logger="node.core.tasks"):
        async with asyncio.timeout(10):
            while not any("deaf-loop" in record.getMessage() for record in caplog.records):
                await asyncio.sleep(0.01)
    message = next(record.getMessage() for record in caplog.records if "deaf-loop" in record.getMessage())
    assert "has not stopped" in message and "in _stubborn" in message and "in deaf" in message, message
    release.set()
    async with asyncio.timeout(10):
        await stopping


async def test_awaiting_lists_the_whole_await_chain() -> None:
    async def leaf() -> None:
        await asyncio.Event().wait()

    async def middle() -> None:
        await leaf()

    task = asyncio.create_task(middle(), name="chain")
    await asyncio.sleep(0)
    text = awaiting(task)
    assert text.index("in middle") < text.index("in leaf") < text.index("\n  awaiting <"), text
    await cancel_and_wait([task])
