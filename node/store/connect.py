"""How a region's Redis is reached: one factory (:func:`redis_client`) for every client the
project builds, whatever the operator runs.

URLs (:func:`parse_redis_url`)::

    redis://[user:password@]host[:6379][/db]      one server, or ANY node of a Redis Cluster
    rediss://…                                    the same over TLS
    unix:///path/to/redis.sock[?db=0]             a local socket
    redis+sentinel://[user:password@]host[:26379][,host[:26379]…]/<master name>[/<db>]
    rediss+sentinel://…                           the same, TLS to the sentinels and the servers

``user:password`` is a Redis ACL user (``default`` when only a password is given), for the data
servers; the sentinels are asked with ``redis_sentinel_password_file``'s password when they
require one (their ``requirepass``), else without credentials. Query options are redis-py's
(``socket_timeout``, ``ssl_check_hostname`` …); the TLS files and a password file are node settings
(:class:`RedisConnectSettings`).

Every key a region's client touches carries the region's hash tag (``node.store.region``), so
the whole region is ONE hash slot. That is what makes a cluster and a Sentinel the same problem:
all of a client's connections go to one server, found when a connection opens — the primary
the sentinels name (``SENTINEL get-master-addr-by-name``), or the node that owns the region's
slot (``CLUSTER SLOTS``, asked of the nodes the client knows; a server where cluster support is
disabled is used as it is, decided at its first connection). A connection that fails, or a
reply that says the data moved (``MOVED``, ``READONLY`` from a demoted primary, ``TRYAGAIN``,
``CLUSTERDOWN``, ``ASK`` while the slot migrates), drops the connection and forgets the address;
the retry opens a new one where the slot or the primary is now (:mod:`node.store.locate`, which
also catches a replaced primary that runs on). Everything the project sends —
Lua scripts (``EVALSHA`` on :class:`~node.store.script_line.ScriptLine`'s own connection), MULTI
pipelines, streams with ``XREAD BLOCK``, ``HSCAN``, pub/sub — works unchanged on those
connections, which redis-py's ``RedisCluster`` would not give (no pool to take a connection from,
no MULTI, per-node pub/sub). A ``SCAN`` of the keyspace would see one node only; nothing sends one.
An ``ASK`` is not followed: while the region's own slot migrates, writes answer 503 until it has.

The connections pack commands with hiredis (:func:`pack_with_hiredis`): redis-py's asyncio
connection packs every command in Python, argument by argument, while its synchronous one hands
the whole command to ``hiredis.pack_command``. That matters where commands are long: a region's
load sends ``ZMSCORE`` and ``HMGET`` with 2,000 agent ids per chunk (about 5 ms each to pack in
Python), and every write batch is one ``EVALSHA`` of many arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis
import redis.asyncio as aioredis
from pydantic import Field
from redis.asyncio.connection import (
    URL_QUERY_ARGUMENT_PARSERS,
    AbstractConnection,
    Connection,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.crc import key_slot
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..core import NodeError, Settings, StoreUnavailable
from .locate import (MOVED_ERRORS, Address, LocatedConnection, LocatedSSLConnection, Locator, SentinelLocator,
                     SlotLocator)

__all__ = ["HiredisPacking", "RedisConnectSettings", "RedisErrors", "RedisTarget", "RedisUrlError", "pack_with_hiredis",
           "parse_redis_url", "redis_client"]

DEFAULT_REDIS_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_POOL_TIMEOUT_S = 5.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
# A reply later than this fails the command (and is retried on a new connection): a server that
# accepts connections but never answers (a wrong port, a stalled proxy) ends the node's start in
# one line instead of hanging it. Every blocking read here (XREAD BLOCK) waits 1 s by default.
DEFAULT_SOCKET_TIMEOUT_S = 5.0
DEFAULT_WAIT_TIMEOUT_MS = 1_000
_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
_TLS_QUERY_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_password")
_POOL_OPTIONS = ("max_connections", "timeout")  # the pool's own bounds, not the URL's
_SETTING_OF = {"ssl_ca_certs": "redis_ca_file", "ssl_certfile": "redis_cert_file", "ssl_keyfile": "redis_key_file"}
_EXAMPLE = "'redis://host:6379/0' or 'redis+sentinel://host:26379,host:26379/mymaster/0'"


class RedisUrlError(NodeError, ValueError):
    """A Redis URL, or a Redis connection setting, that cannot work (said at start, with how to fix it)."""


class RedisConnectSettings(Settings):
    """How the node authenticates to its Redis, checks it over TLS, and how many replicas confirm a
    write (``NodeConfig`` inherits them through :class:`~node.store.StoreSettings`)."""

    redis_ca_file: str | None = Field(default=None, description="CA bundle (PEM) that signed the Redis servers' "
                                                                "(and sentinels') certificates; needs rediss://.")
    redis_cert_file: str | None = Field(default=None, description="Client certificate (PEM) for Redis servers that "
                                                                  "require one (mutual TLS); needs rediss://.")
    redis_key_file: str | None = Field(default=None, description="Private key (PEM) of redis_cert_file.")
    redis_password_file: str | None = Field(
        default=None, description="File holding the Redis password (of the URL's ACL user, or 'default'); "
                                  "keeps it out of the URL.")
    redis_sentinel_password_file: str | None = Field(
        default=None, description="File holding the password the sentinels require (their requirepass); needs a "
                                  "redis+sentinel:// URL. Unset: the sentinels are asked without one.")
    redis_wait_replicas: int = Field(
        default=0, ge=0, description="Replicas that must confirm each agent write (register, heartbeat, deregister, "
                                     "expiry) before it is acknowledged (Redis WAIT); 0 = acknowledged once the "
                                     "primary has it (a failover can lose the last writes: replication is "
                                     "asynchronous). A write not confirmed in time answers 503.")
    redis_wait_timeout_ms: int = Field(default=DEFAULT_WAIT_TIMEOUT_MS, ge=1,
                                       description="How long a write waits for redis_wait_replicas confirmations.")


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """What a Redis URL names: a server (or cluster node), a socket, or a Sentinel-managed primary."""

    kind: str  # "server", "unix" or "sentinel"
    tls: bool
    addresses: tuple[Address, ...] = ()  # the server, or the sentinels
    path: str | None = None
    master_name: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # redis-py connection keywords from the query


def parse_redis_url(url: str) -> RedisTarget:
    """The target ``url`` names; raises :class:`RedisUrlError` (one line, how to fix) otherwise."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise RedisUrlError(f"Redis URL {_masked(url)!r} has scheme {parts.scheme or 'none'!r}; use one of "
                            f"{', '.join(s + '://' for s in _SCHEMES)}, e.g. {_EXAMPLE}", field="redis_url")
    options = _query_options(url, parts.query)
    db = options.pop("db", 0)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")  # as redis-py reads it: user[:password], or :password
    credentials = {"username": unquote(username) or None, "password": unquote(password) or None}
    if scheme == "unix":
        if not parts.path:
            raise RedisUrlError(f"Redis URL {_masked(url)!r} names no socket: write 'unix:///path/to/redis.sock'",
                                field="redis_url")
        return RedisTarget("unix", False, path=unquote(parts.path), db=db, options=options, **credentials)
    sentinel = scheme.endswith("+sentinel")
    addresses = _addresses(url, hosts, DEFAULT_SENTINEL_PORT if sentinel else DEFAULT_REDIS_PORT,
                           several=sentinel)
    path = [unquote(piece) for piece in parts.path.split("/") if piece]
    master_name = None
    if sentinel:
        if not path:
            raise RedisUrlError(f"Redis URL {_masked(url)!r} names no master: write "
                                "'redis+sentinel://host:26379[,host:26379]/<master name>/<db>'", field="redis_url")
        master_name, path = path[0], path[1:]
    if len(path) > 1 or (path and not path[0].isdigit()):
        raise RedisUrlError(f"Redis URL {_masked(url)!r}: the database must be a number (e.g. '/0'), "
                            f"not {'/'.join(path)!r}", field="redis_url")
    if path:
        db = int(path[0])
    return RedisTarget("sentinel" if sentinel else "server", scheme.startswith("rediss"), addresses,
                       master_name=master_name, db=db, options=options, **credentials)


def redis_client(url: str, *, key_base: str, settings: RedisConnectSettings | None = None,
                 decode_responses: bool = True) -> aioredis.Redis:
    """A client for the keys under ``key_base`` (which holds their hash tag, e.g. ``ar:{eu}``), on a
    bounded pool of its own; ``aclose()`` closes it. No I/O until its first command.

    Raises :class:`RedisUrlError` for a URL or setting that cannot work.
    """
    settings = settings if settings is not None else RedisConnectSettings()
    target = parse_redis_url(url)
    kwargs = _connection_kwargs(target, settings)
    kwargs.update(decode_responses=decode_responses)
    if target.kind == "unix":
        connection_class: type[AbstractConnection] = UnixDomainSocketConnection
        kwargs["path"] = target.path
    else:
        probe_class = SSLConnection if target.tls else Connection
        probe = {key: value for key, value in kwargs.items() if key.startswith("ssl_") or key.startswith("socket_")}
        locator: Locator
        if target.kind == "sentinel":
            sentinel_password = _password_from(settings.redis_sentinel_password_file, "redis_sentinel_password_file")
            locator = SentinelLocator(target.addresses, str(target.master_name), probe_class,
                                       {**probe, **({"password": sentinel_password} if sentinel_password else {})})
        else:
            credentials = {key: kwargs[key] for key in ("username", "password") if key in kwargs}
            locator = SlotLocator(target.addresses[0], key_slot(key_base.encode()), probe_class,
                                   {**probe, **credentials})
        connection_class = LocatedSSLConnection if target.tls else LocatedConnection
        kwargs["locator"] = locator
    # A restarted Redis leaves pooled connections dead, a failover moves the primary: retry on a
    # fresh connection (looked up anew) instead of failing the request. Every script is safe to run
    # again (upserts, CAS, idempotent deletes). The pool is bounded and waits for a free connection
    # under bursts instead of failing with "Too many connections"; the retry policy goes to the
    # pool's connections (a client given a pool ignores its own).
    pool = aioredis.BlockingConnectionPool(
        connection_class=connection_class, max_connections=DEFAULT_MAX_CONNECTIONS, timeout=DEFAULT_POOL_TIMEOUT_S,
        health_check_interval=30, retry=Retry(ExponentialBackoff(cap=0.5, base=0.01), retries=2),
        retry_on_error=[RedisConnectionError, RedisTimeoutError, *MOVED_ERRORS], **kwargs)
    pack_with_hiredis(pool)
    return aioredis.Redis(connection_pool=pool)


def _connection_kwargs(target: RedisTarget, settings: RedisConnectSettings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"socket_connect_timeout": DEFAULT_CONNECT_TIMEOUT_S,
                              "socket_timeout": DEFAULT_SOCKET_TIMEOUT_S, "socket_keepalive": True,
                              **target.options, "db": target.db}
    files = {"ssl_ca_certs": settings.redis_ca_file, "ssl_certfile": settings.redis_cert_file,
             "ssl_keyfile": settings.redis_key_file}
    for option, path in files.items():
        if path is None:
            continue
        if not target.tls:
            raise RedisUrlError(f"{_SETTING_OF[option]} is set but the Redis URL is not TLS: use rediss:// "
                                "(or rediss+sentinel://), or drop the setting", field=_SETTING_OF[option])
        if not Path(path).is_file():
            raise RedisUrlError(f"{_SETTING_OF[option]} {path!r} is not a readable file: give the PEM file's path",
                                field=_SETTING_OF[option])
        kwargs[option] = path
    if "ssl_keyfile" in kwargs and "ssl_certfile" not in kwargs:
        raise RedisUrlError("redis_key_file is set without redis_cert_file: give both (the client certificate "
                            "and its key)", field="redis_cert_file")
    if settings.redis_sentinel_password_file is not None and target.kind != "sentinel":
        raise RedisUrlError("redis_sentinel_password_file is set but the Redis URL names no sentinels: use "
                            "redis+sentinel:// (or rediss+sentinel://), or drop the setting",
                            field="redis_sentinel_password_file")
    password = _password_from(settings.redis_password_file, "redis_password_file") or target.password
    if password is not None:
        kwargs["password"] = password
    if target.username is not None:
        kwargs["username"] = target.username
    return kwargs


def _password_from(path: str | None, setting: str) -> str | None:
    """The password in the file ``path`` names (``setting``'s value); None without one."""
    if path is None:
        return None
    try:
        password = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise RedisUrlError(f"{setting} {path!r} cannot be read: {exc}", field=setting) from None
    if not password:
        raise RedisUrlError(f"{setting} {path!r} is empty: write the password in it", field=setting)
    return password


def _query_options(url: str, query: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for name, values in parse_qs(query, keep_blank_values=True).items():
        parser = URL_QUERY_ARGUMENT_PARSERS.get(name)
        if parser is None and name not in _TLS_QUERY_OPTIONS:
            known = ", ".join(sorted({*URL_QUERY_ARGUMENT_PARSERS, *_TLS_QUERY_OPTIONS} - set(_POOL_OPTIONS)))
            raise RedisUrlError(f"Redis URL {_masked(url)!r}: unknown option {name!r} (known: {known})",
                                field="redis_url")
        try:
            options[name] = parser(values[-1]) if parser is not None else values[-1]
        except (TypeError, ValueError):
            raise RedisUrlError(f"Redis URL {_masked(url)!r}: option {name}={values[-1]!r} is not valid",
                                field="redis_url") from None
    for pool_option in _POOL_OPTIONS:
        options.pop(pool_option, None)
    return options


def _addresses(url: str, hosts: str, default_port: int, *, several: bool) -> tuple[Address, ...]:
    pieces = hosts.split(",") if several else [hosts]
    addresses = []
    for piece in pieces:
        parts = urlsplit(f"//{piece}")
        try:
            port = parts.port
        except ValueError:
            port = -1
        if not parts.hostname or port == -1 or (port is not None and port == 0):
            raise RedisUrlError(f"Redis URL {_masked(url)!r}: {piece!r} is not host[:port] (e.g. '10.0.0.5:"
                                f"{default_port}')", field="redis_url")
        addresses.append((unquote(parts.hostname), port or default_port))
    return tuple(addresses)


def _masked(url: str) -> str:
    """``url`` with its password replaced, for error messages."""
    head, at, tail = url.partition("@")
    if not at:
        return url
    scheme, sep, userinfo = head.partition("://")
    user = userinfo.partition(":")[0]
    return f"{scheme}{sep}{user}:…@{tail}" if ":" in userinfo else f"{scheme}{sep}…@{tail}"


# -- errors -----------------------------------------------------------------------------------


class RedisErrors:
    """``async with RedisErrors(region):`` around every call to a region's Redis: redis-py's errors
    become :class:`~node.core.errors.StoreUnavailable` (503) here, in one place, for every module
    that talks to a region's Redis (the store, the load feed, the federation replica)."""

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


# -- packing ----------------------------------------------------------------------------------


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
