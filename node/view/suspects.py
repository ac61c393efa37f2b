"""Liveness from sessions: an agent whose session dropped is *suspect* — its lease still held, the
router's candidate no more — on every replica of the region, until it comes back or its lease lapses.

An SDK holds one long-lived session per process to a replica of its region (``node.http.sessions``).
When that connection ends without the agent leaving (its process was killed, the network cut it),
the replica marks the agent suspect in the region's Redis; every replica follows the marks and
keeps them beside its index (``AgentIndex.suspects``), which routing reads. Suspicion is soft state
like load (``node.store.loads``): it bumps no version and appends nothing to the change stream, so a
reconnect within the lease makes the agent routable again with no version bump and no
re-registration, and peers hear nothing of it (they route to the region by its summary).

Keys, under the store's key base (named by the store, whose deletions clear them)::

    {base}:suspects   HASH  agent_id -> the record version it was suspected at; also the pub/sub
                            channel of the marks ("+agent_id version" / "-agent_id" lines)
    {base}:holders    HASH  agent_id -> the session holding it now (a join, or "http" for an HTTP heartbeat)

A mark names the record version it was made at, and applies to that version only: a registration
or a status change (a new version) is a sign of life, so a newer record is never suspect. The
holder makes marks race-free across replicas: an agent that reconnected to replica B before
replica A noticed the old session end is held by B's session, and A's mark — one script that
marks only agents the ending session still holds — writes nothing.

Pub/sub loses what is published while a subscriber is away, so every (re)subscription reads the
whole hash again (as the load feed does) and prunes the marks no record needs any more (an agent
that is gone, or registered again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from ..core import StoreUnavailable
from ..store import RedisErrors, RegionStore

if TYPE_CHECKING:
    from .cache import AgentIndex

__all__ = ["HTTP_HOLDER", "SuspectList"]

log = logging.getLogger(__name__)

HTTP_HOLDER = "http"  # the holder an HTTP heartbeat writes: a sign of life outside any session
RETRY_MS = (100, 2_000)  # the feed's reconnect backoff: first and longest wait
_SCAN_CHUNK = 2_000

# KEYS: suspects, holders. ARGV: the session, agent ids... Each agent is held by the session; a
# mark on it is cleared (and announced).
HOLD = """
local gone = {}
for i = 2, #ARGV do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[1])
  if redis.call('HDEL', KEYS[1], ARGV[i]) == 1 then gone[#gone + 1] = '-' .. ARGV[i] end
end
if #gone > 0 then redis.call('PUBLISH', KEYS[1], table.concat(gone, '\\n')) end
return #gone
"""

# KEYS: suspects, holders. ARGV: the session, then pairs agent id, record version. Marks the agents
# the session still holds; returns the ids marked.
DROP = """
local marked, lines = {}, {}
for i = 2, #ARGV, 2 do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[1] then
    redis.call('HDEL', KEYS[2], ARGV[i])
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    marked[#marked + 1] = ARGV[i]
    lines[#lines + 1] = '+' .. ARGV[i] .. ' ' .. ARGV[i + 1]
  end
end
if #lines > 0 then redis.call('PUBLISH', KEYS[1], table.concat(lines, '\\n')) end
return marked
"""

# KEYS: suspects, holders. ARGV: the session, agent ids... A clean leave: no mark.
RELEASE = """
for i = 2, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[1] then redis.call('HDEL', KEYS[2], ARGV[i]) end
end
return 0
"""

# KEYS: suspects. ARGV: pairs agent id, the mark as read. Removes each mark still as read.
PRUNE = """
local gone = {}
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    gone[#gone + 1] = '-' .. ARGV[i]
  end
end
if #gone > 0 then redis.call('PUBLISH', KEYS[1], table.concat(gone, '\\n')) end
return #gone
"""


class SuspectList:
    """The region's suspect agents: marked and cleared by sessions, followed by every replica.

    ``run()`` is the task (subscribe, read every mark, then apply the marks as they come; on a lost
    connection wait 100 ms doubling to 2 s and start over). Writes raise :class:`StoreUnavailable`.
    ``on_suspect`` listeners hear each agent that became suspect here, in the event loop.
    """

    def __init__(self, store: RegionStore, index: AgentIndex) -> None:
        self.store = store
        self.index = index
        self.key_suspects = store.key_suspects
        self.key_holders = store.key_holders
        self._keys = [self.key_suspects, self.key_holders]
        self._hold = store.redis.register_script(HOLD)
        self._drop = store.redis.register_script(DROP)
        self._release = store.redis.register_script(RELEASE)
        self._prune = store.redis.register_script(PRUNE)
        self.on_suspect: list[Callable[[str], None]] = []
        self.subscribed = False
        self.marked = 0  # agents this replica marked suspect
        self.resyncs = 0

    # -- writes ------------------------------------------------------------------------------

    async def hold(self, agent_ids: Iterable[str], *, session: str) -> None:
        """``session`` holds the agents now: any mark on them is cleared, here at once."""
        ids = list(agent_ids)
        if not ids:
            return
        async with RedisErrors(self.store.region):
            await self._hold(keys=self._keys, args=[session, *ids])
        for agent_id in ids:
            self.index.unsuspect(agent_id)

    async def drop(self, agent_ids: Iterable[str], *, session: str) -> list[str]:
        """``session`` ended without its agents leaving: mark those it still holds (at the version
        held here); returns the agents marked, suspect here at once."""
        pairs: list[object] = []
        for agent_id in agent_ids:
            record = self.index.get(agent_id)
            if record is not None:
                pairs += [agent_id, record.version]
        if not pairs:
            return []
        async with RedisErrors(self.store.region):
            marked = [m.decode() if isinstance(m, bytes) else str(m)
                      for m in await self._drop(keys=self._keys, args=[session, *pairs])]
        versions = dict(zip(pairs[::2], pairs[1::2]))
        for agent_id in marked:
            self._apply_mark(agent_id, int(versions[agent_id]))  # type: ignore[call-overload]
        self.marked += len(marked)
        return marked

    async def release(self, agent_ids: Iterable[str], *, session: str) -> None:
        """The agents left ``session`` cleanly (closing, deregistering): no mark."""
        ids = list(agent_ids)
        if ids:
            async with RedisErrors(self.store.region):
                await self._release(keys=self._keys, args=[session, *ids])

    # -- the feed ----------------------------------------------------------------------------

    async def run(self) -> None:
        wait_ms = RETRY_MS[0]
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except (RedisError, StoreUnavailable, OSError) as exc:
                if self.subscribed:
                    wait_ms = RETRY_MS[0]
                    log.warning("region %s: suspect feed lost (%s); reading the marks again", self.store.region, exc)
            self.subscribed = False
            await asyncio.sleep(wait_ms / 1000)
            wait_ms = min(RETRY_MS[1], wait_ms * 2)

    async def _follow(self) -> None:
        async with self.store.redis.pubsub() as pubsub:
            await pubsub.subscribe(self.key_suspects)
            async for message in pubsub.listen():
                kind = message.get("type")
                if kind == "subscribe":  # (re)subscribed: what was published meanwhile is lost
                    await self._resync()
                    self.subscribed = True
                    self.resyncs += 1
                elif kind == "message":
                    self._apply_message(_text(message["data"]))

    async def _resync(self) -> None:
        marks: dict[str, str] = {}
        async with RedisErrors(self.store.region):
            async for agent_id, raw in self.store.redis.hscan_iter(self.key_suspects, count=_SCAN_CHUNK):
                marks[_text(agent_id)] = _text(raw)
        for agent_id in [a for a in self.index.suspects if a not in marks]:
            self.index.unsuspect(agent_id)
        stale: list[str] = []
        for agent_id, raw in marks.items():
            record = self.index.get(agent_id)
            if not raw.isdigit() or record is None or record.version > int(raw):
                stale += [agent_id, raw]  # gone, or registered again: no record needs the mark
            else:
                self._apply_mark(agent_id, int(raw))
        if stale:
            async with RedisErrors(self.store.region):
                await self._prune(keys=[self.key_suspects], args=stale)

    def _apply_message(self, data: str) -> None:
        for line in data.split("\n"):
            if line.startswith("-"):
                self.index.unsuspect(line[1:])
            elif line.startswith("+"):
                agent_id, _, version = line[1:].partition(" ")
                if version.isdigit():
                    self._apply_mark(agent_id, int(version))

    def _apply_mark(self, agent_id: str, version: int) -> None:
        if self.index.suspect(agent_id, version):
            for listener in self.on_suspect:
                try:
                    listener(agent_id)
                except Exception:  # noqa: BLE001 - one listener must not stop the feed
                    log.exception("a suspect listener failed")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
