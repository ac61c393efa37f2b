"""Reading the next items while the current ones are worked on.

:func:`read_ahead` runs an async iterator in a task of its own, a bounded number of items ahead
of whoever consumes it. A region's load reads Redis in chunks and parses each chunk for tens of
milliseconds in the event loop; read in turn, every chunk's round trips (the scan, then the
chunk's leases and loads) waited for the parse before, and the parse for them after. Read ahead,
the next chunk's commands are in flight while this one parses, whenever the parser lets the loop
run (``await asyncio.sleep(0)`` between slices of the chunk).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

from ..core import cancel_and_wait

__all__ = ["read_ahead"]

T = TypeVar("T")
_END = object()


async def read_ahead(source: AsyncIterator[T], *, depth: int = 1) -> AsyncIterator[T]:
    """The items of ``source`` in order, read by a task of its own up to ``depth`` items ahead.

    An error of ``source`` is raised here, after the items before it. Closing this iterator
    (``contextlib.aclosing``, or cancelling its consumer) stops the reading task.
    """
    ready: asyncio.Queue[object] = asyncio.Queue(maxsize=depth)

    async def read() -> None:
        async for item in source:
            await ready.put(item)
        await ready.put(_END)

    reader = asyncio.create_task(read(), name="read-ahead")
    try:
        while True:
            waiting = asyncio.ensure_future(ready.get())
            await asyncio.wait({waiting, reader}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():  # the reader ended without a next item: it failed
                waiting.cancel()
                reader.result()
            item = waiting.result()
            if item is _END:
                return
            yield item  # type: ignore[misc]
    finally:
        if not reader.done():  # a reader that failed has had its error raised here: not logged again
            await cancel_and_wait([reader])
