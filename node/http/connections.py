"""Who holds the node's connections, so one client cannot take them all.

The node caps its open connections (``max_connections``); without more, one client that opens
that many sockets and idles on keep-alive locks every other client out for as long as it likes,
and an agent whose heartbeats cannot connect loses its lease. :class:`ConnectionTable` keeps:

* every open connection, by source address (the peer's IP; a Unix socket counts as one source),
  and once a request on it authenticated, by tenant (the token's role and subject);
* the idle ones — answered, waiting on keep-alive — oldest first.

and decides for each new connection (:meth:`admit`):

1. a source that holds ``max_connections_per_source`` already gives up its oldest idle
   connection for the new one, or the new one is refused (a source cannot grow past its share);
2. at the global cap, the oldest idle connection of the source holding the most goes to make
   room; only when no connection is idle is the new one refused.

and, when a request authenticates (:meth:`authenticated`), whether its connection may count
towards the token's tenant: one that holds ``max_connections_per_tenant`` already gives up its
oldest idle connection, or the request is refused (503) and its connection closed — so behind a
load balancer, where every connection has the balancer's address, one token still cannot hold
them all.

An idle keep-alive connection costs its client nothing to reopen, while a refused one costs a
client its request: idle connections are what is cut. Connections in a request, or streaming
(``/v1/watch``), are never cut here. Behind a load balancer every connection comes from the
balancer's address: set ``max_connections_per_source`` to 0 (no share) or to what it may hold.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field

__all__ = ["Admission", "ConnectionTable", "Refusal", "source_of"]


class Refusal(enum.Enum):
    """Why a connection is not admitted."""

    SOURCE_FULL = "source_full"  # its source holds its whole share, none of it idle
    TENANT_FULL = "tenant_full"  # the token's tenant holds its whole share, none of it idle
    NODE_FULL = "node_full"  # the node holds max_connections, none of them idle


@dataclass(frozen=True, slots=True)
class Admission:
    """What to do with a new connection: ``refused`` (why), else admit it after closing ``evict``."""

    refused: Refusal | None = None
    evict: Hashable | None = None


@dataclass(slots=True)
class _Source:
    open: int = 0
    idle: dict[Hashable, None] = field(default_factory=dict)  # insertion order: oldest first


def source_of(peername: object) -> str:
    """The source address of a transport's ``peername`` (an IP), or ``"local"`` (a Unix socket)."""
    if isinstance(peername, tuple) and peername:
        return str(peername[0])
    return "local"


class ConnectionTable:
    """Open and idle connections by source; the caller closes what :meth:`admit` says to evict."""

    def __init__(self, *, max_connections: int, max_per_source: int, max_per_tenant: int = 0) -> None:
        if max_connections < 1 or max_per_source < 0 or max_per_tenant < 0:
            raise ValueError("max_connections must be positive, max_per_source and max_per_tenant not negative")
        self.max_connections = max_connections
        self.max_per_source = max_per_source  # 0: no share per source
        self.max_per_tenant = max_per_tenant  # 0: no share per tenant
        self.evicted = 0
        self._sources: dict[str, _Source] = {}
        self._source_of: dict[Hashable, str] = {}
        self._tenants: dict[str, _Source] = {}
        self._tenant_of: dict[Hashable, str] = {}
        self._idle: dict[Hashable, None] = {}  # every source's idle connections, oldest first

    def __len__(self) -> int:
        return len(self._source_of)

    def holds(self, source: str) -> int:
        """Connections open from ``source`` now."""
        entry = self._sources.get(source)
        return entry.open if entry is not None else 0

    def admit(self, source: str) -> Admission:
        """Whether a new connection from ``source`` may open, and which idle one must go for it.
        Nothing is recorded: call :meth:`opened` for an admitted connection."""
        entry = self._sources.get(source)
        if self.max_per_source and entry is not None and entry.open >= self.max_per_source:
            if not entry.idle:
                return Admission(refused=Refusal.SOURCE_FULL)
            return Admission(evict=next(iter(entry.idle)))
        if len(self._source_of) < self.max_connections:
            return Admission()
        victim = self._idle_of_the_largest_source()
        return Admission(refused=Refusal.NODE_FULL) if victim is None else Admission(evict=victim)

    def authenticated(self, connection: Hashable, tenant: str) -> Admission:
        """A request on ``connection`` (busy) authenticated as ``tenant``: count the connection towards
        it, after closing ``evict`` (one of the tenant's idle connections), or ``refused``: close it."""
        if not self.max_per_tenant or self._tenant_of.get(connection) == tenant or connection not in self._source_of:
            return Admission()
        entry = self._tenants.get(tenant)
        evict = None
        if entry is not None and entry.open >= self.max_per_tenant:
            if not entry.idle:
                return Admission(refused=Refusal.TENANT_FULL)
            evict = next(iter(entry.idle))
        self._forget_tenant(connection)
        self._tenant_of[connection] = tenant
        self._tenants.setdefault(tenant, _Source()).open += 1
        return Admission(evict=evict)

    def opened(self, connection: Hashable, source: str) -> None:
        self._source_of[connection] = source
        self._sources.setdefault(source, _Source()).open += 1

    def closed(self, connection: Hashable) -> None:
        """``connection`` is gone (or is being closed for another): forget it. Idempotent."""
        source = self._source_of.pop(connection, None)
        if source is None:
            return
        self._idle.pop(connection, None)
        entry = self._sources[source]
        entry.idle.pop(connection, None)
        entry.open -= 1
        if entry.open == 0:
            del self._sources[source]
        self._forget_tenant(connection)

    def _forget_tenant(self, connection: Hashable) -> None:
        tenant = self._tenant_of.pop(connection, None)
        if tenant is None:
            return
        entry = self._tenants[tenant]
        entry.idle.pop(connection, None)
        entry.open -= 1
        if entry.open == 0:
            del self._tenants[tenant]

    def evicting(self, connection: Hashable) -> None:
        """``connection`` is being closed to make room: forget it now (its close comes later)."""
        self.evicted += 1
        self.closed(connection)

    def idle(self, connection: Hashable) -> None:
        """``connection`` answered its request and waits on keep-alive."""
        source = self._source_of.get(connection)
        if source is not None:
            self._idle[connection] = None
            self._sources[source].idle[connection] = None
            tenant = self._tenant_of.get(connection)
            if tenant is not None:
                self._tenants[tenant].idle[connection] = None

    def busy(self, connection: Hashable) -> None:
        """The next request on ``connection`` began."""
        source = self._source_of.get(connection)
        if source is not None and connection in self._idle:
            del self._idle[connection]
            self._sources[source].idle.pop(connection, None)
            tenant = self._tenant_of.get(connection)
            if tenant is not None:
                self._tenants[tenant].idle.pop(connection, None)

    def _idle_of_the_largest_source(self) -> Hashable | None:
        if not self._idle:
            return None
        largest = max((entry for entry in self._sources.values() if entry.idle), key=lambda entry: entry.open)
        return next(iter(largest.idle))
