"""node.store.connect: commands packed by hiredis are the bytes redis-py's own packing sends."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import DataError

from node.store.connect import HiredisPacking, pack_with_hiredis

pytestmark = pytest.mark.unit

COMMANDS = [
    ("SET", "k", "plain"),
    ("SET", "k", "héllo 世界"),
    ("SET", b"k", b"\x00\xff\r\n"),
    ("ZADD", "leases", 1764600600123, "a.b.c", 0.1, "d.e.f", -3, "g.h.i"),
    ("SET", "k", 2**62), ("SET", "k", 1e20), ("SET", "k", float("inf")),
    ("CONFIG GET", "maxmemory"), (b"CLIENT LIST",),
    ("EVALSHA", "a" * 40, 2, "k1", "k2", *("x" * 500 for _ in range(300))),
    ("SET", "k", memoryview(b"viewed")),  # hiredis refuses it: redis-py packs it
]


class _Packed(HiredisPacking, Connection):
    pass


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: str(command[0]))
def test_the_bytes_are_redis_pys(command: tuple[object, ...]) -> None:
    assert b"".join(_Packed().pack_command(*command)) == b"".join(Connection().pack_command(*command))


@pytest.mark.parametrize("value", [True, None, object()])
def test_a_value_redis_cannot_take_is_refused_as_redis_py_refuses_it(value: object) -> None:
    with pytest.raises(DataError):
        _Packed().pack_command("SET", "k", value)


@pytest.mark.parametrize("base", [Connection, SSLConnection, UnixDomainSocketConnection])
def test_a_pool_keeps_its_kind_of_connection(base: type) -> None:
    class Pool:
        connection_class = base

    pool = Pool()
    pack_with_hiredis(pool)  # type: ignore[arg-type]
    assert issubclass(pool.connection_class, base) and issubclass(pool.connection_class, HiredisPacking)
    first = pool.connection_class
    pack_with_hiredis(pool)  # type: ignore[arg-type]
    assert pool.connection_class is first  # not wrapped twice
