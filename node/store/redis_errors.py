"""``async with RedisErrors(region):`` around every call to a region's Redis.

redis-py's errors become :class:`~node.core.errors.StoreUnavailable` (503) here, in one place, for every
module that talks to a region's Redis (the store, the load feed, the federation replica).
"""

from __future__ import annotations

from redis.exceptions import RedisError, ResponseError

from ..core import StoreUnavailable

__all__ = ["RedisErrors"]


class RedisErrors:
    """Turns redis-py errors raised in the block into :class:`StoreUnavailable`."""

    __slots__ = ("region",)

    def __init__(self, region: str) -> None:
        self.region = region

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is None or not isinstance(exc, RedisError):
            return False
        if isinstance(exc, ResponseError):
            raise StoreUnavailable(f"Redis of region {self.region} refused a command: {exc}") from exc
        raise StoreUnavailable(f"Redis of region {self.region} cannot be reached: {exc}") from exc

