"""Owning background tasks: stop them for sure.

``cancel_and_wait`` cancels until each task has really finished: some client libraries catch
a cancellation deep inside a socket operation and carry on (seen with redis-py's connection
handshake), and a single ``cancel()`` then leaves a loop running forever and its owner's
``aclose()`` hanging.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

log = logging.getLogger(__name__)

_RECANCEL_INTERVAL_S = 0.05


async def cancel_and_wait(tasks: Iterable[asyncio.Task[object]]) -> None:
    """Cancel ``tasks`` and wait until all are done; errors they ended with are logged."""
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=_RECANCEL_INTERVAL_S)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.warning("task %s ended with %r", task.get_name(), task.exception())
