"""Owning background tasks: stop them for sure.

``cancel_and_wait`` cancels until each task has really finished: some client libraries catch
a cancellation deep inside a socket operation and carry on (seen with redis-py's connection
handshake), and a single ``cancel()`` then leaves a loop running forever and its owner's
``aclose()`` hanging.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Iterable

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
                            task.get_name(), _STUCK_REPORT_S, _stack(task))
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.warning("task %s ended with %r", task.get_name(), task.exception())


def _stack(task: asyncio.Task[object]) -> str:
    out = io.StringIO()
    task.print_stack(file=out)
    return out.getvalue()
