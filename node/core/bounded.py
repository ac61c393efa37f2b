"""Reading an HTTP answer of a party that may be hostile, with a bound on its size.

Shared by the SDK's deliveries (an agent's answer), the credential verifier (the node's key set)
and federation (a peer's key set, a forwarded answer; a snapshot read as it arrives, through
:func:`at_most`): ``response.read()`` would hold whatever the other side sends.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable

import aiohttp

__all__ = ["BodyTooLarge", "at_most", "read_bounded"]


class BodyTooLarge(Exception):
    """An answer grew past the limit its reader set (``limit`` bytes)."""

    def __init__(self, limit: int, message: str | None = None) -> None:
        super().__init__(message or f"the answer exceeds {limit} bytes")
        self.limit = limit


async def read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, counted as it arrives; raises :class:`BodyTooLarge` past ``limit`` bytes.

    aiohttp's stream reader pauses the socket while its buffer is full, so at most ``limit`` plus
    one chunk is ever held; the caller's context exit then closes the connection.
    """
    declared = response.content_length
    if declared is not None and declared > limit:
        raise BodyTooLarge(limit)
    return b"".join([chunk async for chunk in at_most(response.content.iter_any(), limit)])


async def at_most(chunks: AsyncIterable[bytes], limit: int, *,
                  too_large: Callable[[int], BodyTooLarge] = BodyTooLarge) -> AsyncIterator[bytes]:
    """``chunks`` as they come, counted; raises ``too_large(limit)`` once they pass ``limit`` bytes."""
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        yield chunk
