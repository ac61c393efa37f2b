"""Commands packed for the wire by hiredis, on the store's connections.

redis-py's asyncio connection packs every command in Python, argument by argument, while its
synchronous one hands the whole command to ``hiredis.pack_command`` when hiredis is installed.
:func:`pack_with_hiredis` gives a pool's connections the synchronous client's way: the same bytes,
built in C. That matters where commands are long: a region's load sends ``ZMSCORE`` and ``HMGET``
with 2,000 agent ids per chunk (about 5 ms each to pack in Python), and every write batch is one
``EVALSHA`` of many arguments.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio.connection import ConnectionPool

__all__ = ["HiredisPacking", "pack_with_hiredis"]


class HiredisPacking:
    """Mixin for a redis-py asyncio connection class: ``pack_command`` by hiredis."""

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        # As redis-py does: a command name with a space ("CONFIG GET") is several arguments.
        if isinstance(first, str):
            if " " in first:
                args = (*first.encode().split(), *args[1:])
        elif b" " in first:
            args = (*first.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:  # a value hiredis does not take: redis-py packs it or names it (DataError)
            return super().pack_command(*args)  # type: ignore[misc]


def pack_with_hiredis(pool: ConnectionPool) -> None:
    """Make the connections ``pool`` opens from now on pack commands with hiredis (TCP, TLS or a
    Unix socket alike: the pool's own connection class, with :class:`HiredisPacking` first)."""
    base = pool.connection_class
    if not issubclass(base, HiredisPacking):
        pool.connection_class = type(f"Hiredis{base.__name__}", (HiredisPacking, base), {})
