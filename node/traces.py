"""The trace log: what happened to a collaboration's envelopes, per ``trace_id``, in the region's Redis.

Proxy mode appends every decision, delivery attempt, outcome, duplicate, refusal and callback;
a direct resolve that names a ``trace_id`` appends its decision; SDK clients add the deliveries
of their direct calls (``POST /v1/traces``). ``GET /v1/traces/{trace_id}`` reads a trace back,
so a caller whose answer was lost can find out what happened. Key (under the region's hash
tag, next to :mod:`node.store`'s)::

    {prefix}:{region}:trace:{trace_id}   LIST   route events, oldest first (TTL, capped)

The log belongs to the node's app: :func:`install_trace_routes` builds it once from
``NodeConfig.proxy`` (``trace_ttl_ms``, ``trace_max_events``) and keeps it under
:data:`TRACES_KEY`; route modules reach it as ``request.app[TRACES_KEY]``.
"""

from __future__ import annotations

import logging
import re

from aiohttp import web
from pydantic import ValidationError
from redis import asyncio as aioredis

from .envelope import TRACE_ID_PATTERN, RouteEvent, RouteEvents, Trace
from .errors import Forbidden, NotFound, StoreUnavailable, ValidationFailed
from .http import CALLER, json_response, parse_body
from .models import TokenClaims, TokenRole, compat
from .service import RegistryNode
from .store import RedisErrors, RegionStore

log = logging.getLogger(__name__)

_TRACE_RE = re.compile(TRACE_ID_PATTERN)


class TraceLog:
    """Route events per trace_id: a capped list with a TTL, on the region store's Redis connection."""

    def __init__(self, redis: aioredis.Redis, *, key_base: str, region: str, ttl_ms: int, max_events: int) -> None:
        self.redis = redis
        self.prefix = f"{key_base}:trace:"
        self.region = region
        self.ttl_ms = ttl_ms
        self.max_events = max_events

    @classmethod
    def of(cls, store: RegionStore, *, ttl_ms: int, max_events: int) -> TraceLog:
        """The trace log beside ``store``: its connection, its key base, its region."""
        return cls(store.redis, key_base=store.key_base, region=store.region, ttl_ms=ttl_ms, max_events=max_events)

    def key(self, trace_id: str) -> str:
        return self.prefix + trace_id

    async def append(self, events: list[RouteEvent]) -> None:
        """Append events (one pipeline); Redis being down is logged, never raised: the send stands."""
        if not events:
            return
        grouped: dict[str, list[str]] = {}
        for event in events:
            grouped.setdefault(event.trace_id, []).append(event.model_dump_json(exclude_none=True))
        try:
            async with RedisErrors(self.region):
                async with self.redis.pipeline(transaction=False) as pipe:
                    for trace_id, items in grouped.items():
                        key = self.key(trace_id)
                        pipe.rpush(key, *items)
                        pipe.ltrim(key, -self.max_events, -1)
                        pipe.pexpire(key, self.ttl_ms)
                    await pipe.execute()
        except StoreUnavailable as exc:
            log.warning("could not record %d route events: %s", len(events), exc.message)

    async def read(self, trace_id: str) -> list[RouteEvent]:
        """The trace's events, oldest first; raises :class:`StoreUnavailable` (503)."""
        async with RedisErrors(self.region):
            raw = await self.redis.lrange(self.key(trace_id), 0, -1)
        events = []
        for item in raw:
            try:
                events.append(compat.read_json(RouteEvent, item))
            except ValidationError:
                log.warning("skipping an unreadable event in %s", self.key(trace_id))
        return events


TRACES_KEY = web.AppKey("traces", TraceLog)


class TraceRoutes:
    """``GET /v1/traces/{trace_id}`` and ``POST /v1/traces`` over one node's trace log."""

    def __init__(self, node: RegistryNode, traces: TraceLog) -> None:
        self.node = node
        self.traces = traces

    async def handle_trace(self, request: web.Request) -> web.Response:
        caller: TokenClaims = request[CALLER]
        trace_id = request.match_info["trace_id"]
        if not _TRACE_RE.match(trace_id):
            raise ValidationFailed("trace_id must be 1-100 characters of [A-Za-z0-9_.:-]", field="trace_id")
        events = await self.traces.read(trace_id)
        if caller.role is not TokenRole.ADMIN:
            events = [event for event in events
                      if caller.sub in (event.caller, event.agent_id) and self._may_see_agent(caller, event.agent_id)]
        if not events:
            raise NotFound(f"region {self.node.region} has no events of trace {trace_id} that you took part in "
                           "(traces expire; events go to the region that handled the send)",
                           field="trace_id", code="unknown_trace")
        return json_response(Trace(trace_id=trace_id, region=self.node.region, count=len(events), events=events))

    def _may_see_agent(self, caller: TokenClaims, agent_id: str | None) -> bool:
        """An event naming an agent whose ``allowed_callers`` exclude the caller is not shown."""
        record = self.node.find(agent_id) if agent_id else None
        return record is None or self.node.visible(record, caller)

    async def handle_trace_events(self, request: web.Request) -> web.Response:
        caller: TokenClaims = request[CALLER]
        batch = await parse_body(request, RouteEvents)
        for event in batch.events:
            if caller.role is not TokenRole.ADMIN and event.caller != caller.sub:
                raise Forbidden(f"a token for {caller.sub!r} may only record its own calls, not {event.caller!r}",
                                field="events.caller")
        await self.traces.append([event.model_copy(update={"mode": "direct"}) for event in batch.events])
        return json_response({"accepted": len(batch.events)})


def install_trace_routes(app: web.Application, node: RegistryNode) -> TraceLog:
    """The app's trace log (built on first call) and its two routes. Idempotent."""
    if TRACES_KEY in app:
        return app[TRACES_KEY]
    settings = node.config.proxy
    traces = TraceLog.of(node.store, ttl_ms=settings.trace_ttl_ms, max_events=settings.trace_max_events)
    app[TRACES_KEY] = traces
    routes = TraceRoutes(node, traces)
    app.router.add_get("/v1/traces/{trace_id}", routes.handle_trace)
    app.router.add_post("/v1/traces", routes.handle_trace_events)
    return traces


__all__ = ["TRACES_KEY", "TraceLog", "TraceRoutes", "install_trace_routes"]
