"""One Lua script, run batch after batch over a connection of its own.

A :class:`~node.batch.Coalescer` has one batch in flight at a time, so its flush needs no
connection pool: :class:`ScriptLine` keeps one connection out of the client's pool for as long as
it lives and sends each batch as one ``EVALSHA`` (packed by hiredis on the store's pool,
``node.redis_wire``). Measured on this project's 2-core machine, a 74-argument call (a heartbeat
batch of nine) cost 79 µs of the node's CPU through ``AsyncScript`` (redis-py packs every
argument in Python, checks a connection out and back in, and records its telemetry), 49 µs with
hiredis packing alone, and 25 µs this way.

What redis-py's client does for a command still holds: the same retry policy (the pool's
connections carry it: reconnect and back off on a connection error or timeout), the periodic
health check, a script Redis does not know (a restarted or replaced server) loaded and sent again,
a reply that is an error raised as redis-py's exception, and a call cancelled or failed mid-reply
leaves no half-read reply for the next batch (tests/test_batching.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError

__all__ = ["ScriptLine"]

Arg = str | bytes | int | float


class ScriptLine:
    """``await line(keys, args)``: the script's reply, one call at a time (callers serialise)."""

    def __init__(self, redis: aioredis.Redis, source: str) -> None:
        self._script = redis.register_script(source)  # its sha, and SCRIPT LOAD when Redis lacks it
        self._pool = redis.connection_pool
        self._connection: AbstractConnection | None = None

    async def __call__(self, keys: Sequence[str], args: Sequence[Arg]) -> object:
        command = ("EVALSHA", self._script.sha, len(keys), *keys, *args)
        try:
            return await self._send(command)
        except NoScriptError:  # the sha is the source's: once loaded, the same command runs it
            await self._script.registered_client.script_load(self._script.script)
            return await self._send(command)

    async def _send(self, command: tuple[Arg, ...]) -> object:
        connection = self._connection
        if connection is None:
            connection = self._connection = await self._pool.get_connection()
        packed = connection.pack_command(*command)  # once, for every attempt
        # redis-py's connection drops its socket when a send or a read fails or is cancelled, so
        # no half-read reply is left for the next batch; the retry reconnects.
        return await connection.retry.call_with_retry(lambda: self._once(connection, packed),
                                                      lambda error: connection.disconnect())

    @staticmethod
    async def _once(connection: AbstractConnection, packed: list[bytes]) -> object:
        await connection.send_packed_command(packed)
        return await connection.read_response()

    async def aclose(self) -> None:
        """Give the connection back to the pool (the pool's own close then ends it)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await self._pool.release(connection)
