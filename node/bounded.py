"""Reading an HTTP answer of a party that may be hostile, with a bound on its size.

Shared by the SDK's deliveries (an agent's answer), the credential verifier (the node's key set)
and federation (a peer's key set): ``response.read()`` would hold whatever the other side sends.
"""

from __future__ import annotations

import aiohttp

__all__ = ["BodyTooLarge", "read_bounded"]


class BodyTooLarge(Exception):
    """An answer grew past the limit its reader set (``limit`` bytes)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer exceeds {limit} bytes")
        self.limit = limit


async def read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body, counted as it arrives; raises :class:`BodyTooLarge` past ``limit`` bytes.

    aiohttp's stream reader pauses the socket while its buffer is full, so at most ``limit`` plus
    one chunk is ever held; the caller's context exit then closes the connection.
    """
    declared = response.content_length
    if declared is not None and declared > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)
