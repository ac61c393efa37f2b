"""``GET /v1/watch``: one watcher's server-sent event stream, fed by the node's
:class:`~node.view.watch.WatchHub`.

The stream opens with ``hello`` (the region and its version), replays the change stream after
``since=`` when asked, then sends each change the watcher asked for (capability, pattern) and
may see (the record's audience), with ``: keep-alive`` comments while idle. A watcher that falls
behind gets ``overflow`` and the end of the stream; so does every watcher when the app shuts
down (:func:`end_watches`). A stream whose token is revoked meanwhile (``node.trust.revocation``) gets
``revoked`` and ends at its next event or keep-alive; one whose token expires meanwhile gets
``expired`` and ends at that instant. A watcher that stops reading is cut (its connection
aborted) when a write waits longer than ``watch_write_timeout_ms``: a write waits while the
socket's buffers are full, and before, such a stream — and its connection, its place in the
caller's share and the events it was sent — was held for ever, past its token's expiry. A replay
is read a page at a time as it is sent. The events are documented in ``node.http.openapi.watch_events``.

A lease renewal is no change (no version, no event), so a watcher that keeps records learns of
it only when asked: with ``leases=true`` the stream also sends ``leases`` about every
:data:`LEASE_EVENT_INTERVAL_S`, the lease ends (ms) of this region's agents the watcher may see
whose lease moved since the last one (all of them the first time), with the node's clock
(``now_ms``) to compare them to. Each costs one pass over the region's records (in slices of
5,000, the loop free between them): ~0.2 s for 100,000 records on a busy 2-core machine, so a
stream waits at least :data:`LEASE_SCAN_SHARE` ⁻¹ times its last pass before the next one (a
stream takes at most about 5 % of the loop; 100,000 records: a leases event every ~4 s, which
leases of 6 s and more outlast). The console reads its leases from these, as the API does; before,
a healthy agent turned "not routable" in the page when the lease of the last change it saw passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from ..core import StoreUnavailable, ValidationFailed, now_ms
from ..core.models import INT64_MAX, AgentRecord, ChangeEvent
from ..trust import may_see, tenant_of
from .plumbing import CALLER, NODE_KEY, query_flag, query_pattern

if TYPE_CHECKING:
    from ..service import RegistryNode

SSE_KEEPALIVE_S = 15.0
LEASE_EVENT_INTERVAL_S = 1.0
LEASE_SCAN_SHARE = 0.05  # of the event loop's time one leases stream may take
_LEASE_SCAN_SLICE = 5_000
_IDLE = object()  # no event within SSE_KEEPALIVE_S
WATCH_REPLAY_MAX = 10_000
# Change events read from Redis at a time during a replay: one event can hold a record of ~250 KB
# (64 capabilities of long descriptions), and the whole replay read at once held up to 10,000.
WATCH_REPLAY_PAGE = 200


class _Stuck(Exception):
    """The watcher took no write within the hub's ``write_timeout_ms``: it stopped reading."""


async def watch(request: web.Request) -> web.StreamResponse:
    """``GET /v1/watch``: ``hello``, then ``event: change`` per ChangeEvent the caller may see;
    ``since=N`` replays the stream after version N first (a Redis outage then is a 503)."""
    node = request.app[NODE_KEY]
    accept = _watch_filter(request)
    since = _since(request)
    leases = _Leases(node, request) if query_flag(request, "leases") else None
    subscription = node.watch.subscribe(accept, owner=tenant_of(request[CALLER]))
    # The node's server says when the watcher's connection goes, so its stream (and its place in
    # the caller's share) ends then, not at the next keep-alive.
    when_lost = getattr(request.protocol, "when_lost", None)
    forget = when_lost(lambda: subscription.end("gone")) if when_lost is not None else None
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    write_timeout_s = node.watch.write_timeout_ms / 1000

    async def send(data: bytes) -> None:
        try:
            await asyncio.wait_for(response.write(data), write_timeout_s)
        except TimeoutError:
            raise _Stuck() from None

    try:
        # The replay's first page is read before the stream opens, so a Redis outage is a clean 503,
        # not a cut stream; the rest a page at a time as it is sent.
        page = await _replay_page(node, since, 0) if since is not None else []
        await response.prepare(request)
        await send(_sse("hello", {"region": node.region, "version": node.cache.index.version}))
        replayed_to = await _replay(node, page, accept, send)
        live, last = replayed_to is not None, replayed_to or 0
        expires_at_s = request[CALLER].exp
        while live:
            try:
                # Woken at the token's expiry too: the stream ends with it, as a request would be refused.
                timeout_s = min(SSE_KEEPALIVE_S, max(0.0, expires_at_s - time.time()))
                if leases is not None:
                    timeout_s = min(timeout_s, leases.due_in_s())
                event = await asyncio.wait_for(subscription.queue.get(), timeout=timeout_s)
            except TimeoutError:
                event = _IDLE
            if _revoked(node, request):
                await send(_sse("revoked", {"message": "the token was revoked"}))
                break
            if time.time() >= expires_at_s:
                await send(_sse("expired", {"message": "the token has expired; issue a new one"}))
                break
            if leases is not None and leases.due_in_s() <= 0:
                await send(_sse("leases", await leases.moved()))
                if event is _IDLE:
                    continue
            if event is _IDLE:
                await send(b": keep-alive\n\n")
                continue
            if event is None:
                if subscription.end_reason == "overflow":
                    await send(_sse("overflow", {"message": "watcher fell behind; reconnect with since="}))
                break
            if event.region == node.region and event.version <= last:
                continue  # already sent by the replay
            await send(_sse("change", event.model_dump(mode="json"), event_id=event.version))
    except ConnectionResetError:
        pass  # the watcher went away
    except _Stuck:  # it stopped reading: the node holds neither its connection nor its events
        node.watch.cut += 1
        if request.transport is not None:
            request.transport.abort()
        return response
    finally:
        subscription.close()
        if forget is not None:
            forget()
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()
    return response


async def _replay(node: RegistryNode, page: list[ChangeEvent], accept: Callable[[ChangeEvent], bool],
                  send: Callable[[bytes], Awaitable[None]]) -> int | None:
    """Send the replay from its first ``page`` on; the last version replayed (0: none), or None when
    the store stopped answering after the first page (the stream then ends with ``overflow``)."""
    last = replayed = 0
    while page:
        for event in page:
            if accept(event):
                await send(_sse("change", event.model_dump(mode="json"), event_id=event.version))
            last = event.version
        replayed += len(page)
        if len(page) < WATCH_REPLAY_PAGE:
            break
        try:
            page = await _replay_page(node, last, replayed)
        except StoreUnavailable:
            await send(_sse("overflow", {"message": "the region's store stopped answering during the replay; "
                                                    "reconnect with since="}))
            return None
    return last


async def _replay_page(node: RegistryNode, after: int, replayed: int) -> list[ChangeEvent]:
    """The next page of a replay: events after version ``after``, none past ``WATCH_REPLAY_MAX`` in all."""
    count = min(WATCH_REPLAY_PAGE, WATCH_REPLAY_MAX - replayed)
    return await node.store.read_changes(after_version=after, count=count) if count > 0 else []


class _Leases:
    """What one ``leases=true`` watcher was last told of each lease, and when it is told again."""

    def __init__(self, node: RegistryNode, request: web.Request) -> None:
        self.node = node
        self.caller = request[CALLER]
        self.pattern = query_pattern(request)
        self.capability = request.query.get("capability")
        self.sent: dict[str, int] = {}
        self.next_at = time.monotonic()  # the first goes out with the first wait

    def due_in_s(self) -> float:
        return max(0.0, self.next_at - time.monotonic())

    async def moved(self) -> dict[str, object]:
        """The ``leases`` event: the leases that moved since the last one (every one the first
        time) of this region's records the watcher asked for and may see; read in slices, letting
        requests run between them."""
        started = time.monotonic()
        records = list(self.node.cache.index)
        moved: dict[str, int] = {}
        for start in range(0, len(records), _LEASE_SCAN_SLICE):
            if start:
                await asyncio.sleep(0)
            for record in records[start:start + _LEASE_SCAN_SLICE]:
                lease = record.lease_expires_at_ms
                if self.sent.get(record.agent_id) != lease and self._wanted(record):
                    moved[record.agent_id] = self.sent[record.agent_id] = lease
        finished = time.monotonic()
        self.next_at = finished + max(LEASE_EVENT_INTERVAL_S, (finished - started) / LEASE_SCAN_SHARE)
        return {"region": self.node.region, "now_ms": now_ms(), "leases": moved}

    def _wanted(self, record: AgentRecord) -> bool:
        return ((self.pattern is None or self.pattern.match(record.agent_id) is not None)
                and (not self.capability or any(c.name == self.capability for c in record.capabilities))
                and self.node.visible(record, self.caller))  # allowed_callers and the region's ACL rules


def _revoked(node: object, request: web.Request) -> bool:
    return node.revocations.refuses(request[CALLER])  # type: ignore[attr-defined]


def _since(request: web.Request) -> int | None:
    try:
        since = int(request.query["since"]) if "since" in request.query else None
    except ValueError:
        raise ValidationFailed("since must be a region version (an integer)", field="since") from None
    if since is not None and not 0 <= since <= INT64_MAX:
        raise ValidationFailed("since must be a region version (0 or more, within 64 bits)", field="since")
    return since


def _watch_filter(request: web.Request) -> Callable[[ChangeEvent], bool]:
    """The events this watcher asked for (capability, pattern) and may see (their audience)."""
    capability = request.query.get("capability")
    regex = query_pattern(request)
    caller = request[CALLER]
    acl = request.app[NODE_KEY].acl

    def accept(event: ChangeEvent) -> bool:
        if regex is not None and not regex.match(event.agent_id):
            return False
        if not may_see(caller, event.agent_id, event.audience) or not acl.permits(caller, event.agent_id):
            return False
        if capability and event.record is not None:
            return any(c.name == capability for c in event.record.capabilities)
        return True

    return accept


def _sse(event: str, data: object, *, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"


async def end_watches(app: web.Application) -> None:
    """``on_shutdown``: end every watcher's stream (reason ``closing``) before the server closes."""
    app[NODE_KEY].watch.end_all()


__all__ = ["LEASE_EVENT_INTERVAL_S", "LEASE_SCAN_SHARE", "SSE_KEEPALIVE_S", "WATCH_REPLAY_MAX", "WATCH_REPLAY_PAGE",
           "end_watches", "watch"]
