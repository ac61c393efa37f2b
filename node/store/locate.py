"""Where a region's data is: the address its connections open to (:class:`Locator`), and the
connection class that asks it (:class:`LocatedConnection`). :mod:`node.store.connect` builds them
from the Redis URL.

The address is looked up once and kept while it serves. A connection that fails, or a reply
that says the data moved (``MOVED``, ``READONLY`` …), drops the connection and forgets the address,
so the retry looks again. One sign says neither: a primary the sentinels replaced while it ran
on — cut off from them by a partition, or demoted later than the promotion (Sentinel converts an
old primary only seconds after it sees it again) — takes every write and confirms none to a
replica. With ``redis_wait_replicas`` such a write's WAIT falls short; the writer then asks again
(:func:`primary_moved`). When the sentinels (or the cluster) name another address, every
connection open to the old one is stale (:attr:`Locator.epoch`) and reconnects before its next
command, and the write runs again where the data is now: the old primary drops it when it is
demoted. Without ``redis_wait_replicas`` nothing shows the split until the old primary is demoted
(its clients are disconnected then); that is the trade ``tests/store/test_failover.py`` shows.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AskError, ClusterDownError, ReadOnlyError, RedisError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["LOCATE_TIMEOUT_S", "MOVED_ERRORS", "Address", "LocatedConnection", "LocatedSSLConnection", "Locator",
           "SentinelLocator", "SlotLocator", "as_moved", "is_stale", "primary_moved"]

LOCATE_TIMEOUT_S = 1.0  # one sentinel or cluster node asked where the data is; then the next
# Replies that say the region's data is now elsewhere (or about to be): reconnect and look again.
MOVED_ERRORS: tuple[type[RedisError], ...] = (ReadOnlyError, AskError, TryAgainError, ClusterDownError)

Address = tuple[str, int]


class Locator:
    """The address a region's connections open to, looked up once and kept until a connection
    to it fails or is told the data moved (:meth:`forget`), or a recheck finds it elsewhere."""

    def __init__(self) -> None:
        self._address: Address | None = None
        self._lock = asyncio.Lock()  # concurrent connects share one lookup
        self.epoch = 0  # moves found by :meth:`recheck`; a connection opened in an older one is stale

    async def locate(self) -> Address:
        address = self._address
        if address is None:
            async with self._lock:
                address = self._address
                if address is None:
                    address = self._address = await self._find()
        return address

    def forget(self, address: Address) -> None:
        if self._address == address:
            self._address = None

    async def recheck(self, address: Address | None = None) -> bool:
        """Ask again where the data is, on a sign that ``address`` (default: the one in use) may
        have stopped holding it although it answers. True when it is elsewhere now: the new address
        is used from here on and every connection opened before is stale."""
        address = address if address is not None else self._address
        if address is None:  # nothing in use: the next connection looks anyway
            return False
        try:
            found = await self._find_latest()
        except (RedisError, OSError):  # no answer is no evidence: keep what serves
            return False
        if found == address:
            return False
        self._address = found
        self.epoch += 1
        return True

    async def _find(self) -> Address:
        raise NotImplementedError

    async def _find_latest(self) -> Address:
        """Where the data is by the newest word there is (a recheck may come while the news spreads)."""
        return await self._find()


class SentinelLocator(Locator):
    """The primary the sentinels name for ``master_name``; sentinels asked in turn."""

    def __init__(self, sentinels: Sequence[Address], master_name: str, probe_class: type[Connection],
                 probe: dict[str, Any]) -> None:
        super().__init__()
        self._sentinels = list(sentinels)
        self._master_name = master_name
        self._probe_class, self._probe = probe_class, probe

    async def _find(self) -> Address:
        problems = []
        for sentinel in list(self._sentinels):
            try:
                reply = await _ask(self._probe_class, self._probe, sentinel,
                                   "SENTINEL", "get-master-addr-by-name", self._master_name)
            except (RedisError, OSError) as exc:
                problems.append(f"{sentinel[0]}:{sentinel[1]}: {self._refusal(exc)}")
                continue
            if reply:
                self._sentinels.remove(sentinel)  # the one that answered is asked first next time
                self._sentinels.insert(0, sentinel)
                return str(reply[0]), int(reply[1])
            problems.append(f"{sentinel[0]}:{sentinel[1]} knows no master {self._master_name!r}")
        raise RedisConnectionError(f"no sentinel names the primary of {self._master_name!r} "
                                   f"({'; '.join(problems)})")

    async def _find_latest(self) -> Address:
        """The primary of the highest configuration epoch any sentinel knows: right after a failover
        only some of them have heard of it (the others learn within seconds)."""
        replies = await asyncio.gather(*(_ask(self._probe_class, self._probe, sentinel, "SENTINEL", "MASTER",
                                              self._master_name) for sentinel in self._sentinels),
                                       return_exceptions=True)
        views = [reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2], strict=True))
                 for reply in replies if isinstance(reply, (dict, list))]  # RESP3 gives a map, RESP2 pairs
        if not views:  # no evidence either way; asking them one by one again would say no more
            raise RedisConnectionError(f"no sentinel described the primary of {self._master_name!r}")
        # The newest epoch; within it a sentinel amid a failover (it names the old primary until it
        # is done) yields to one that has switched, then the address most of them name.
        def rank(view: dict[str, Any]) -> tuple[int, bool]:
            return int(view.get("config-epoch", 0)), "failover_in_progress" not in str(view.get("flags", ""))
        best = max(rank(view) for view in views)
        named = Counter((str(view["ip"]), int(view["port"])) for view in views if rank(view) == best)
        return named.most_common(1)[0][0]

    def _refusal(self, error: Exception) -> str:
        """``error`` said plainly when it is the sentinel refusing to talk without (the right) password."""
        text = str(error)
        if "WRONGPASS" in text or "invalid password" in text or "invalid username-password" in text:
            return "refused the password of redis_sentinel_password_file"
        if "NOAUTH" in text or "must be called with the client already authenticated" in text:
            return "requires a password: set redis_sentinel_password_file"
        return text


class SlotLocator(Locator):
    """The server of the URL, or, on a Redis Cluster, the node owning ``slot`` (from ``CLUSTER SLOTS``)."""

    def __init__(self, seed: Address, slot: int, probe_class: type[Connection], probe: dict[str, Any]) -> None:
        super().__init__()
        self._seed = seed
        self._slot = slot
        self._cluster: bool | None = None  # unknown until the first connection
        self._nodes = [seed]  # every cluster node seen, the last that answered first
        self._probe_class, self._probe = probe_class, probe

    async def _find(self) -> Address:
        if self._cluster is False:
            return self._seed
        problems = []
        for node in list(self._nodes):
            try:
                slots = await _ask(self._probe_class, self._probe, node, "CLUSTER", "SLOTS")
            except ResponseError as exc:
                if self._cluster is None:  # "cluster support disabled", or an ACL user without CLUSTER
                    self._cluster = False
                    return self._seed
                problems.append(f"{node[0]}:{node[1]}: {exc}")
                continue
            except (RedisError, OSError) as exc:
                if self._cluster is None:
                    raise
                problems.append(f"{node[0]}:{node[1]}: {exc}")
                continue
            self._cluster = True
            self._nodes.remove(node)
            self._nodes.insert(0, node)
            owner = self._learn(node, slots)
            if owner is not None:
                return owner
            problems.append(f"{node[0]}:{node[1]} names no primary for slot {self._slot}")
        raise RedisConnectionError(f"no node of the Redis Cluster names the primary of slot {self._slot} "
                                   f"({'; '.join(problems)})")

    def _learn(self, asked: Address, slots: list[Any]) -> Address | None:
        """Remember every node of a ``CLUSTER SLOTS`` reply; the primary of our slot, if one."""
        owner = None
        for start, end, *nodes in slots:
            for index, (host, port, *_) in enumerate(nodes):
                address = (str(host) or asked[0], int(port))
                if address not in self._nodes:
                    self._nodes.append(address)
                if index == 0 and int(start) <= self._slot <= int(end):
                    owner = address
        return owner


async def _ask(connection_class: type[Connection], probe: dict[str, Any], address: Address, *command: str) -> Any:
    """One command on a connection of its own to ``address`` (closed after)."""
    connection = connection_class(host=address[0], port=address[1], **{
        **probe, "socket_connect_timeout": LOCATE_TIMEOUT_S, "socket_timeout": LOCATE_TIMEOUT_S,
        "decode_responses": True, "retry": Retry(NoBackoff(), 0)})
    try:
        await connection.connect()
        await connection.send_command(*command)
        return await connection.read_response()
    finally:
        await connection.disconnect(nowait=True)


class LocatedConnection(Connection):
    """A connection that opens to where its locator says the region's data is, and makes the
    locator look again when it fails or hears the data moved (the pool's retry then reconnects).
    Opened before the locator found the data elsewhere (:meth:`Locator.recheck`), it reconnects
    before its next command (so a ``WATCH`` would not carry over to its ``EXEC``: nothing here
    sends one; a subscription is made again by redis-py's connect callback)."""

    def __init__(self, *, locator: Locator, **kwargs: Any) -> None:
        self.locator = locator
        self.epoch = locator.epoch
        super().__init__(**kwargs)

    async def _connect(self) -> None:
        self.epoch = self.locator.epoch
        self.host, self.port = await self.locator.locate()
        await super()._connect()

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if self.epoch != self.locator.epoch and self.is_connected:
            await self.disconnect(nowait=True)  # open to a server the data has left: the send reconnects
        await super().send_packed_command(command, check_health)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except ResponseError as exc:
            raise as_moved(exc) from None

    async def disconnect(self, nowait: bool = False, error: Exception | None = None, failure_count: int | None = None,
                         health_check_failed: bool = False) -> None:
        if error is not None or health_check_failed:
            self.locator.forget((self.host, self.port))
        await super().disconnect(nowait=nowait, error=error, failure_count=failure_count,
                                 health_check_failed=health_check_failed)


def is_stale(connection: object) -> bool:
    """Whether ``connection`` (of :func:`node.store.connect.redis_client`) was opened before its
    locator found the region's data elsewhere; a connection that is not located never is."""
    return isinstance(connection, LocatedConnection) and connection.epoch != connection.locator.epoch


async def primary_moved(where: aioredis.Redis | Connection) -> bool:
    """After a WAIT that fell short on ``where`` (a connection, or a client's pool): True when the
    region's data turned out to be elsewhere, so the write should run again there."""
    if isinstance(where, aioredis.Redis):
        locator = where.connection_pool.connection_kwargs.get("locator")
        return isinstance(locator, Locator) and await locator.recheck()
    if isinstance(where, LocatedConnection):
        return await where.locator.recheck((where.host, where.port))
    return False


def as_moved(error: Exception) -> Exception:
    """``error``, or — a script's write refused by a demoted primary (``Error running script …
    -READONLY …``) — the :class:`ReadOnlyError` it is, so the retry reconnects to the new primary."""
    if type(error) is ResponseError and "-READONLY " in str(error):
        return ReadOnlyError(str(error))
    return error


class LocatedSSLConnection(LocatedConnection, SSLConnection):
    """:class:`LocatedConnection` over TLS."""
