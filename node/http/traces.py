"""The trace log: what happened to a collaboration's envelopes, per ``trace_id``, in the region's Redis.

Proxy mode appends every decision, delivery attempt, outcome, duplicate, refusal and callback;
a direct resolve that names a ``trace_id`` appends its decision; SDK clients add the deliveries
of their direct calls (``POST /v1/traces``). ``GET /v1/traces/{trace_id}`` reads a trace back,
so a caller whose answer was lost can find out what happened, and ``GET
/v1/traces/{trace_id}/result`` gives it the final answer of its own proxied delivery (sync, or the
result its callback carried), kept as long as the trace, at most ``result_max_bytes`` of it.

A trace is kept per writer, so that nobody's events push out anybody else's: the node's own
records in one list, each caller's posts in a list of that caller's, at most
``trace_max_callers`` callers per trace. Keys (under the region's hash tag, next to
:mod:`node.store`'s; a ``/`` never occurs in a trace id, so no trace's keys name another's)::

    {prefix}:{region}:trace:{trace_id}/node        LIST  the node's records, oldest first (TTL, capped)
    {prefix}:{region}:trace:{trace_id}/by/{caller} LIST  what that caller posted (TTL, capped)
    {prefix}:{region}:trace:{trace_id}/callers     ZSET  caller -> its last post (ms)
    {prefix}:{region}:trace:{trace_id}/result/{caller} STRING the final answer of that caller's send (TTL)
    {prefix}:{region}:trace:{trace_id}             LIST  before the per-writer lists: read, never written

Each list keeps its newest ``trace_max_events`` and expires ``trace_ttl_ms`` after its writer's
last event. What a caller posted is shown to that caller (and admins), never to an agent it
names: only the node's own records say that an agent took part.

The log belongs to the node's app: :func:`install_trace_routes` builds it once from
``NodeConfig.proxy`` (``trace_ttl_ms``, ``trace_max_events``, ``trace_max_callers``) and keeps it
under :data:`TRACES_KEY`; route modules reach it as ``request.app[TRACES_KEY]``.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Literal

from aiohttp import web
from pydantic import ValidationError
from redis import asyncio as aioredis

from ..core import (
    TRACE_ID_PATTERN,
    Conflict,
    Forbidden,
    NotFound,
    RateLimited,
    RouteEvent,
    RouteEvents,
    StoreUnavailable,
    Trace,
    TraceEvent,
    TraceResult,
    ValidationFailed,
    now_ms,
)
from ..core.models import TokenClaims, TokenRole, compat
from ..routing import WITHHELD
from ..service import RegistryNode
from ..store import RedisErrors, RegionStore
from ..trust import mask_secrets, tenant_of
from .plumbing import CALLER, json_response, parse_body

log = logging.getLogger(__name__)

_TRACE_RE = re.compile(TRACE_ID_PATTERN)
_MAX_OVER_QUOTA = 10_000  # tenants remembered as past their quota (the oldest forgotten first)

# KEYS: the poster's quota hash, then (callers zset, caller's list) per group; ARGV: now_ms, ttl_ms,
# max_events, max_callers, quota_bytes (0: none), this post's bytes, the quota's slice (ms), then per
# group its caller, its number of events and the events. Admits every group or none: a caller new to
# a trace whose live callers are already max_callers fails the batch, answering its group's number
# (1-based); a post that would take the poster past quota_bytes within ttl_ms answers -(ms until
# its oldest slice expires) - 1; 0 when all was written. A member older than the TTL has lost its list.
# The quota hash holds bytes posted per slice of ttl/24: a slice that ended before the TTL is dropped.
# QUOTA: the functions both scripts count a tenant's bytes with: what it holds within the TTL (and
# the ms until its oldest slice expires), and a charge of ``size`` bytes now.
QUOTA = """
local function quota_held(key, now, ttl, slice)
  local first, held, oldest = math.floor((now - ttl) / slice), 0, nil
  local slices = redis.call('HGETALL', key)
  for i = 1, #slices, 2 do
    local at = tonumber(slices[i])
    if at < first then
      redis.call('HDEL', key, slices[i])
    else
      held = held + tonumber(slices[i + 1])
      if not oldest or at < oldest then oldest = at end
    end
  end
  return held, (oldest or first) * slice + slice + ttl - now
end
local function quota_charge(key, now, ttl, slice, size)
  redis.call('HINCRBY', key, math.floor(now / slice), size)
  redis.call('PEXPIRE', key, ttl + slice)
end
"""
POST = QUOTA + """
local now, ttl, cap, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local quota, size, slice = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local groups, added, pos = {}, {}, 8
for i = 2, #KEYS, 2 do
  local zset, caller, n = KEYS[i], ARGV[pos], tonumber(ARGV[pos + 1])
  groups[#groups + 1] = {zset, KEYS[i + 1], caller, pos + 2, pos + 1 + n}
  pos = pos + 2 + n
  redis.call('ZREMRANGEBYSCORE', zset, '-inf', now - ttl)
  local mine = added[zset] or {count = 0, callers = {}}
  added[zset] = mine
  if not redis.call('ZSCORE', zset, caller) and not mine.callers[caller] then
    mine.callers[caller] = true
    mine.count = mine.count + 1
    if redis.call('ZCARD', zset) + mine.count > most then return #groups end
  end
end
if quota > 0 then
  local held, freed_in = quota_held(KEYS[1], now, ttl, slice)
  if held + size > quota then return -freed_in - 1 end
  quota_charge(KEYS[1], now, ttl, slice, size)
end
for _, g in ipairs(groups) do
  redis.call('ZADD', g[1], now, g[3])
  redis.call('PEXPIRE', g[1], ttl)
  redis.call('RPUSH', g[2], unpack(ARGV, g[4], g[5]))
  redis.call('LTRIM', g[2], -cap, -1)
  redis.call('PEXPIRE', g[2], ttl)
end
return 0
"""

# KEYS: the tenant's quota hash, then the node's list of each trace; ARGV: now_ms, ttl_ms, max_events,
# quota_bytes, these records' bytes, the quota's slice (ms), then per trace its number of records and
# the records. Writes them all (the request they record was served) and charges their bytes to the
# tenant; answers the ms until the tenant is below its quota again when it is past it, else 0.
APPEND = QUOTA + """
local now, ttl, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local quota, size, slice, pos = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), 7
for i = 2, #KEYS do
  local n = tonumber(ARGV[pos])
  redis.call('RPUSH', KEYS[i], unpack(ARGV, pos + 1, pos + n))
  redis.call('LTRIM', KEYS[i], -cap, -1)
  redis.call('PEXPIRE', KEYS[i], ttl)
  pos = pos + 1 + n
end
local held, freed_in = quota_held(KEYS[1], now, ttl, slice)
quota_charge(KEYS[1], now, ttl, slice, size)
if held + size >= quota then return freed_in + 1 end
return 0
"""

# KEYS: the tenant's quota hash, the result's key; ARGV: now_ms, ttl_ms, quota_bytes, the result's
# bytes, the quota's slice (ms), the result. Keeps it (the request it answers was served) and
# charges its bytes like APPEND; answers the ms until the tenant is below its quota, else 0.
KEEP = QUOTA + """
local now, ttl, quota, size, slice = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]),
  tonumber(ARGV[5])
redis.call('SET', KEYS[2], ARGV[6], 'PX', ttl)
local held, freed_in = quota_held(KEYS[1], now, ttl, slice)
quota_charge(KEYS[1], now, ttl, slice, size)
if held + size >= quota then return freed_in + 1 end
return 0
"""


@dataclass
class StoredTrace:
    """One trace as Redis holds it, by writer: who wrote an event decides who is shown it."""

    node: list[TraceEvent] = field(default_factory=list)
    posted: dict[str, list[TraceEvent]] = field(default_factory=dict)  # caller -> what it posted
    legacy: list[TraceEvent] = field(default_factory=list)  # the single list of older versions

    def every(self) -> list[TraceEvent]:
        """Every writer's events, the node's before callers' (what an admin is shown)."""
        return [*self.legacy, *self.node, *(event for posted in self.posted.values() for event in posted)]


class TraceLog:
    """Route events per trace_id and writer: capped lists with a TTL, on the region store's Redis connection."""

    def __init__(self, redis: aioredis.Redis, *, key_base: str, region: str, ttl_ms: int, max_events: int,
                 max_callers: int, caller_bytes: int = 0) -> None:
        self.redis = redis
        self.prefix = f"{key_base}:trace:"
        self.region = region
        self.ttl_ms = ttl_ms
        self.max_events = max_events
        self.max_callers = max_callers
        self.caller_bytes = caller_bytes
        self._post = redis.register_script(POST)
        self._append = redis.register_script(APPEND)
        self._keep = redis.register_script(KEEP)
        self._over: dict[str, float] = {}  # tenant -> monotonic time its quota frees (as last learnt)

    @classmethod
    def of(cls, store: RegionStore, *, ttl_ms: int, max_events: int, max_callers: int,
           caller_bytes: int = 0) -> TraceLog:
        """The trace log beside ``store``: its connection, its key base, its region."""
        return cls(store.redis, key_base=store.key_base, region=store.region, ttl_ms=ttl_ms, max_events=max_events,
                   max_callers=max_callers, caller_bytes=caller_bytes)

    def key(self, trace_id: str) -> str:
        """The key of the node's own records of ``trace_id``."""
        return f"{self.prefix}{trace_id}/node"

    def caller_key(self, trace_id: str, caller: str) -> str:
        return f"{self.prefix}{trace_id}/by/{caller}"

    def quota_key(self, tenant: str) -> str:
        """Bytes ``tenant`` (role:subject) posted or had recorded per slice of the TTL (a ``/`` never
        occurs in a trace id: no trace's key)."""
        return f"{self.prefix}/quota/{tenant}"

    def callers_key(self, trace_id: str) -> str:
        return f"{self.prefix}{trace_id}/callers"

    def legacy_key(self, trace_id: str) -> str:
        return self.prefix + trace_id

    def result_key(self, trace_id: str, caller: str) -> str:
        return f"{self.prefix}{trace_id}/result/{caller}"

    async def keep_result(self, result: TraceResult, *, charge: str | None = None) -> None:
        """Keep the final answer of a delivery for its caller for ``ttl_ms`` (a later one of the same
        trace and caller replaces it); Redis being down is logged, never raised: the send stands.

        ``charge``: the tenant whose ``caller_bytes`` quota the kept answer counts against, as its
        trace events do (None: an admin's, not counted).
        """
        key, kept = self.result_key(result.trace_id, result.caller), result.model_dump_json(exclude_none=True)
        try:
            async with RedisErrors(self.region):
                if charge is None or not self.caller_bytes:
                    await self.redis.set(key, kept, px=self.ttl_ms)
                    return
                args = [now_ms(), self.ttl_ms, self.caller_bytes, len(kept.encode()), self._quota_slice_ms, kept]
                self._note_over(charge, int(await self._keep(keys=[self.quota_key(charge), key], args=args)))
        except StoreUnavailable as exc:
            log.warning("could not keep the result of trace %s: %s", result.trace_id, exc.message)

    async def result(self, trace_id: str, caller: str) -> TraceResult | None:
        """The result kept for ``caller`` in ``trace_id`` (None: none, or expired); raises :class:`StoreUnavailable`."""
        async with RedisErrors(self.region):
            raw = await self.redis.get(self.result_key(trace_id, caller))
        if raw is None:
            return None
        try:
            return compat.read_json(TraceResult, raw)
        except ValidationError:
            log.warning("skipping an unreadable result of trace %s in %s", trace_id, self.region)
            return None

    async def append(self, events: list[RouteEvent], *, charge: str | None = None) -> None:
        """Append the node's own records (one round trip); Redis being down is logged, never raised: the send stands.

        ``charge``: the tenant (``node.trust.tenant_of``) whose request they record, whose
        ``caller_bytes`` quota they count against (None: an admin's, not counted). Past the quota,
        :meth:`refuse_if_over` refuses the tenant's next traced request here until it is below again.
        """
        if not events:
            return
        grouped: dict[str, list[str]] = {}
        for event in events:
            grouped.setdefault(event.trace_id, []).append(event.model_dump_json(exclude_none=True))
        try:
            async with RedisErrors(self.region):
                if charge is not None and self.caller_bytes:
                    await self._append_charged(grouped, charge)
                    return
                async with self.redis.pipeline(transaction=False) as pipe:
                    for trace_id, items in grouped.items():
                        key = self.key(trace_id)
                        pipe.rpush(key, *items)
                        pipe.ltrim(key, -self.max_events, -1)
                        pipe.pexpire(key, self.ttl_ms)
                    await pipe.execute()
        except StoreUnavailable as exc:
            log.warning("could not record %d route events: %s", len(events), exc.message)

    async def _append_charged(self, grouped: dict[str, list[str]], tenant: str) -> None:
        size = sum(len(item) for items in grouped.values() for item in items)  # ASCII: JSON escapes the rest
        keys = [self.quota_key(tenant)]
        args: list[str | int] = [now_ms(), self.ttl_ms, self.max_events, self.caller_bytes, size,
                                 self._quota_slice_ms]
        for trace_id, items in grouped.items():
            keys.append(self.key(trace_id))
            args += [len(items), *items]
        self._note_over(tenant, int(await self._append(keys=keys, args=args)))

    @property
    def _quota_slice_ms(self) -> int:
        return max(1, self.ttl_ms // 24)

    def _note_over(self, tenant: str, freed_in_ms: int) -> None:
        """Remember that ``tenant`` is past its quota for ``freed_in_ms - 1`` ms (0: it is not)."""
        if freed_in_ms:
            self._over[tenant] = time.monotonic() + (freed_in_ms - 1) / 1000
            if len(self._over) > _MAX_OVER_QUOTA:
                self._over.pop(next(iter(self._over)))

    def refuse_if_over(self, tenant: str | None) -> None:
        """Raise :class:`RateLimited` (429 ``trace_quota``) when ``tenant``'s records took it past its
        quota (as this process last learnt: each process learns it from its own next record)."""
        until = self._over.get(tenant) if tenant is not None else None
        if until is None:
            return
        left_ms = int((until - time.monotonic()) * 1000)
        if left_ms <= 0:
            del self._over[tenant]  # type: ignore[arg-type]
            return
        raise RateLimited(f"{tenant!r} holds its quota of {self.caller_bytes:,} bytes of trace events within "
                          f"trace_ttl_ms ({self.ttl_ms:,} ms; trace_caller_bytes): the node's records of its "
                          "traced requests count, as its posts do; send without a trace_id to resolve, or wait "
                          "until older events expire", field="trace_id", code="trace_quota",
                          details={"retry_after_ms": left_ms})

    async def post(self, events: list[RouteEvent], *, poster: str | None) -> None:
        """Append what callers posted, each event to its caller's list: all or nothing, in one script.

        ``poster``: the tenant posting (:func:`charged`), whose ``caller_bytes`` quota the events
        count against (None: an admin, not counted). Raises :class:`Conflict` (409, ``trace_full``) naming the trace
        when a caller new to it would exceed ``max_callers``, :class:`RateLimited` (429,
        ``trace_quota``) past the poster's quota, and :class:`StoreUnavailable` (503).
        """
        grouped: dict[tuple[str, str], list[str]] = {}
        for event in events:
            grouped.setdefault((event.trace_id, event.caller), []).append(event.model_dump_json(exclude_none=True))
        size = sum(len(item.encode()) for items in grouped.values() for item in items)
        quota = 0 if poster is None else self.caller_bytes
        keys: list[str] = [self.quota_key(poster or "")]
        args: list[str | int] = [now_ms(), self.ttl_ms, self.max_events, self.max_callers, quota, size,
                                 self._quota_slice_ms]
        for (trace_id, caller), items in grouped.items():
            keys += [self.callers_key(trace_id), self.caller_key(trace_id, caller)]
            args += [caller, len(items), *items]
        async with RedisErrors(self.region):
            refused = int(await self._post(keys=keys, args=args))
        if refused < 0:
            raise RateLimited(f"{poster!r} would pass its quota of {self.caller_bytes:,} bytes of trace events "
                              f"within trace_ttl_ms ({self.ttl_ms:,} ms; trace_caller_bytes); its older posts free it "
                              "as they expire", field="events", code="trace_quota",
                              details={"retry_after_ms": -refused - 1})
        if refused:
            trace_id, caller = list(grouped)[refused - 1]
            raise Conflict(f"trace {trace_id} already holds the events of {self.max_callers} callers; "
                           f"{caller!r} cannot add its own (use a trace id of your own)",
                           field="events.trace_id", code="trace_full")

    async def read(self, trace_id: str, *, caller: str | None = None) -> StoredTrace:
        """The trace's events by writer, each oldest first: only ``caller``'s posts when given, else every
        live caller's. Raises :class:`StoreUnavailable` (503)."""
        async with RedisErrors(self.region):
            callers = [caller] if caller is not None else await self._live_callers(trace_id)
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.lrange(self.key(trace_id), 0, -1)
                pipe.lrange(self.legacy_key(trace_id), 0, -1)
                for name in callers:
                    pipe.lrange(self.caller_key(trace_id, name), 0, -1)
                node, legacy, *posted = await pipe.execute()
        return StoredTrace(node=self._parsed(trace_id, node, "node"), legacy=self._parsed(trace_id, legacy, None),
                           posted={name: self._parsed(trace_id, raw, "client")
                                   for name, raw in zip(callers, posted) if raw})

    async def _live_callers(self, trace_id: str) -> list[str]:
        return await self.redis.zrangebyscore(self.callers_key(trace_id), now_ms() - self.ttl_ms, "+inf")

    def _parsed(self, trace_id: str, raw: list[bytes], recorded_by: Literal["node", "client"] | None
                ) -> list[TraceEvent]:
        events = []
        for item in raw:
            try:
                event = compat.read_json(TraceEvent, item)
            except ValidationError:
                log.warning("skipping an unreadable event of trace %s in %s", trace_id, self.region)
                continue
            event.recorded_by = recorded_by  # the list it was read from says who wrote it
            events.append(event)
        return events


TRACES_KEY = web.AppKey("traces", TraceLog)


def charged(caller: TokenClaims) -> str | None:
    """The tenant whose trace quota a request of ``caller``'s counts against; None for an admin."""
    return None if caller.role is TokenRole.ADMIN else tenant_of(caller)
def _trace_id(request: web.Request) -> str:
    trace_id = request.match_info["trace_id"]
    if not _TRACE_RE.match(trace_id):
        raise ValidationFailed("trace_id must be 1-100 characters of [A-Za-z0-9_.:-]", field="trace_id")
    return trace_id


class TraceRoutes:
    """``GET /v1/traces/{trace_id}`` and ``POST /v1/traces`` over one node's trace log."""

    def __init__(self, node: RegistryNode, traces: TraceLog) -> None:
        self.node = node
        self.traces = traces

    async def handle_trace(self, request: web.Request) -> web.Response:
        caller: TokenClaims = request[CALLER]
        trace_id = _trace_id(request)
        admin = caller.role is TokenRole.ADMIN
        stored = await self.traces.read(trace_id, caller=None if admin else caller.sub)
        events = stored.every() if admin else self._shown(caller, stored)
        if not events:
            raise NotFound(f"region {self.node.region} has no events of trace {trace_id} that you took part in "
                           "(traces expire; events go to the region that handled the send)",
                           field="trace_id", code="unknown_trace")
        events.sort(key=lambda event: event.at_ms)  # stable: the node's records first at the same instant
        return json_response(Trace(trace_id=trace_id, region=self.node.region, count=len(events), events=events))

    def _shown(self, caller: TokenClaims, stored: StoredTrace) -> list[TraceEvent]:
        """What a non-admin sees: the node's records it took part in (as the caller or the agent), and its own
        posts; an event naming an agent the caller may not see is not shown, and of a record it took part in
        as the agent only, the caller's name and the detail (the alternates it names) are withheld."""
        recorded = [event for event in (*stored.legacy, *stored.node) if caller.sub in (event.caller, event.agent_id)]
        own = stored.posted.get(caller.sub, [])
        return [event if event.caller == caller.sub else event.model_copy(update={"caller": WITHHELD, "detail": None})
                for event in (*recorded, *own) if self._may_see_agent(caller, event.agent_id)]

    def _may_see_agent(self, caller: TokenClaims, agent_id: str | None) -> bool:
        record = self.node.find(agent_id) if agent_id else None
        return record is None or self.node.visible(record, caller)

    async def handle_result(self, request: web.Request) -> web.Response:
        """The final answer of the caller's own delivery in a trace: nobody else's, admins' included."""
        caller: TokenClaims = request[CALLER]
        trace_id = _trace_id(request)
        kept = await self.traces.result(trace_id, caller.sub)
        if kept is None:
            raise NotFound(f"region {self.node.region} keeps no result of trace {trace_id} for {caller.sub!r}: only "
                           "the answer to a send of yours through this region's proxy is kept (POST /v1/send), until "
                           "the trace expires", field="trace_id", code="unknown_result")
        return json_response(kept)

    async def handle_trace_events(self, request: web.Request) -> web.Response:
        caller: TokenClaims = request[CALLER]
        batch = await parse_body(request, RouteEvents)
        for event in batch.events:
            if caller.role is not TokenRole.ADMIN and event.caller != caller.sub:
                raise Forbidden(f"a token for {caller.sub!r} may only record its own calls, not {event.caller!r}",
                                field="events.caller")
        await self.traces.post([event.model_copy(update={"mode": "direct", "extensions": mask_secrets(
            event.extensions) if event.extensions else None}) for event in batch.events], poster=charged(caller))
        return json_response({"accepted": len(batch.events)})


def install_trace_routes(app: web.Application, node: RegistryNode) -> TraceLog:
    """The app's trace log (built on first call) and its two routes. Idempotent."""
    if TRACES_KEY in app:
        return app[TRACES_KEY]
    settings = node.config.proxy
    traces = TraceLog.of(node.store, ttl_ms=settings.trace_ttl_ms, max_events=settings.trace_max_events,
                         max_callers=settings.trace_max_callers, caller_bytes=settings.trace_caller_bytes)
    app[TRACES_KEY] = traces
    routes = TraceRoutes(node, traces)
    app.router.add_get("/v1/traces/{trace_id}", routes.handle_trace)
    app.router.add_get("/v1/traces/{trace_id}/result", routes.handle_result)
    app.router.add_post("/v1/traces", routes.handle_trace_events)
    return traces


__all__ = ["TRACES_KEY", "StoredTrace", "charged", "TraceLog", "TraceRoutes", "install_trace_routes"]
