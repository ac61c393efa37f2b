"""Owning background tasks: stop them for sure.

``cancel_and_wait`` cancels until each task has really finished: some client libraries catch
a cancellation deep inside a socket operation and carry on (seen with redis-py's connection
handshake), and a single ``cancel()`` then leaves a loop running forever and its owner's
``aclose()`` hanging.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any

log = logging.getLogger(__name__)

_RECANCEL_INTERVAL_S = 0.05
_STUCK_REPORT_S = 5.0  # a task still running this long after its first cancel is named in the log


async def cancel_and_wait(tasks: Iterable[asyncio.Task[object]]) -> None:
    """Cancel ``tasks`` and wait until all are done; errors they ended with are logged."""
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    report_at = asyncio.get_running_loop().time() + _STUCK_REPORT_S
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=_RECANCEL_INTERVAL_S)
        if pending and asyncio.get_running_loop().time() >= report_at:
            report_at = float("inf")
            for task in pending:
                log.warning("task %s has not stopped %.0f s after it was cancelled; it awaits:\n%s",
                            task.get_name(), _STUCK_REPORT_S, awaiting(task))
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.warning("task %s ended with %r", task.get_name(), task.exception())


async def run_together(loops: dict[str, Coroutine[Any, Any, object]]) -> None:
    """Run ``loops`` (name → coroutine) as tasks until one ends, then stop the others for sure and
    re-raise what the first ended with.

    Unlike ``asyncio.TaskGroup`` — which cancels its children once when its owner is cancelled, so a
    child that swallows that one cancel (aiokafka does, inside a consumer's ``stop()``) keeps its
    owner waiting forever — every cancel of the owner reaches the children again
    (:func:`cancel_and_wait`).
    """
    tasks = [asyncio.create_task(loop, name=name) for name, loop in loops.items()]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(tasks)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def awaiting(task: asyncio.Task[object]) -> str:
    """Where ``task`` waits: every frame of its await chain, outermost first (``Task.print_stack``
    shows only the outermost frame of a suspended coroutine, which never says what hangs)."""
    lines = [repr(task)]
    step: object = task.get_coro()
    while step is not None:
        frame = getattr(step, "cr_frame", None) or getattr(step, "gi_frame", None) or getattr(step, "ag_frame", None)
        if frame is not None:
            lines.append(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno}, in {frame.f_code.co_name}')
        step = (getattr(step, "cr_await", None) or getattr(step, "gi_yieldfrom", None)
                or getattr(step, "ag_await", None))
        if step is not None and not any(hasattr(step, name) for name in ("cr_frame", "gi_frame", "ag_frame")):
            lines.append(f"  awaiting {step!r}")  # a future or a task: the end of this chain
            break
    return "\n".join(lines)
