"""SIGINT/SIGTERM for a command: the first asks for a graceful stop, a second for a quick one.

Only the command line installs signal handlers (never a library). A command wraps whatever may
take a while (starting a cluster, a node's start-up) in :meth:`StopSignals.run`, so a signal
that arrives meanwhile cancels it instead of waiting for it::

    async with StopSignals() as signals:
        try:
            await signals.run(cluster.start())
        except Interrupted:
            ...  # stop what was started
        await signals.stopping.wait()
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable
from types import TracebackType
from typing import Self, TypeVar

__all__ = ["Interrupted", "StopSignals"]

T = TypeVar("T")
log = logging.getLogger(__name__)
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """A stop signal arrived before the awaited operation finished (it was cancelled)."""


class StopSignals:
    """Handlers for SIGINT and SIGTERM on the running loop while in ``async with``.

    ``stopping`` is set by the first signal, ``hurry`` by any later one; ``received`` names
    the first.
    """

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.hurry = asyncio.Event()
        self.received: signal.Signals | None = None

    async def __aenter__(self) -> Self:
        loop = asyncio.get_running_loop()
        for signum in _SIGNALS:
            loop.add_signal_handler(signum, self._on_signal, signum)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        loop = asyncio.get_running_loop()
        for signum in _SIGNALS:
            loop.remove_signal_handler(signum)

    def _on_signal(self, signum: signal.Signals) -> None:
        if self.stopping.is_set():
            self.hurry.set()
            return
        self.received = signum
        self.stopping.set()

    async def run(self, operation: Awaitable[T]) -> T:
        """Await ``operation`` unless a stop signal comes first (or came already).

        Then the operation is cancelled and awaited (its cleanup runs) and
        :class:`Interrupted` is raised. Errors of the operation propagate unchanged.
        """
        task = asyncio.ensure_future(operation)
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            stop.cancel()
        if task.done() and not self.stopping.is_set():
            return task.result()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we were cancelled ourselves, not just the operation
        except Exception as exc:  # its cleanup failed; the stop request matters more
            log.debug("an interrupted operation failed while cancelled: %s", exc)
        name = self.received.name if self.received is not None else "a stop signal"
        raise Interrupted(f"interrupted by {name}")
