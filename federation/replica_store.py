"""Where the replica of the peer regions lives: the Redis of the CONSUMING region.

A restarted node, or another node replica of the same region behind the load balancer,
reloads the peers' agents from here instead of re-reading Kafka. Layout (all keys carry the
consuming region's hash tag, so every script is single-slot, as in ``node.store``)::

    {prefix}:{region}:fed:peer:{peer}:agents    HASH   agent_id -> record JSON of the peer's agent
    {prefix}:{region}:fed:peer:{peer}:versions  HASH   agent_id -> version; negative = deleted at that
                                                       version (a tombstone: an older upsert arriving
                                                       late must not resurrect the agent)
    {prefix}:{region}:fed:peer:{peer}:state     HASH   seen (highest version read from the peer's
                                                       topic), floor (every version up to it is
                                                       covered by an applied snapshot; older events
                                                       are refused and older tombstones pruned),
                                                       heard_at_ms, beacon (last beacon JSON),
                                                       anti_entropy_runs, reconciled_at_ms
    {prefix}:{region}:fed:offsets               HASH   "{topic}:{partition}" -> next offset to read
    {prefix}:{region}:fed:feed                  STREAM id "<seq>-0", capped: every applied remote
                                                       change, beacon and reconcile, in commit order
    {prefix}:{region}:fed:feed:seq              STRING last feed sequence number
    {prefix}:{region}:fed:published             STRING this region's version acknowledged by Kafka

Applying a batch of Kafka records is ONE Lua script: the version checks, the record writes,
the consumer offset and the feed entries commit together, so a crash can neither lose an
applied change nor skip one (the offset never runs ahead of the replica). The leader applies
what the script reports in memory at once; every node replica of the region (the leader too)
tails the feed to stay current, so they all converge on the Redis state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import redis.asyncio as aioredis
from pydantic import ValidationError

from node.core import first_problem
from node.core.models import AgentRecord, Snapshot, compat
from node.store import Quarantine, RedisErrors, read_record

from .events import FederationMessage, RegionBeacon

T = TypeVar("T")


async def shielded_read(read: Awaitable[T]) -> T:
    """Await a bounded blocking Redis read (``XREAD BLOCK n``) without ever cancelling it.

    redis-py can swallow a cancellation that lands inside a blocking command, leaving the
    cancelled task hanging on its socket (redis/redis-py#2028; reproduced here with 8.1 and
    ``XREAD BLOCK 50``: about 1 cancellation in 100 never finishes). Shielded, the caller is
    cancelled at once while the read itself ends by its block timeout and returns its
    connection to the pool normally.
    """
    task = asyncio.ensure_future(read)
    task.add_done_callback(_retrieve)
    return await asyncio.shield(task)


def _retrieve(task: asyncio.Future[object]) -> None:
    if not task.cancelled():
        task.exception()  # an abandoned read's error is not worth a "never retrieved" warning


# KEYS: agents, versions, state, offsets, feed, seq.
# ARGV: peer, now ms, feed maxlen, offsets field ('' = none), next offset, then 5 per item:
#       type ('c' change | 'b' beacon), agent_id, version, record JSON ('' = delete), body JSON.
# Returns {seen, n1, n2, ...}: the new seen version and the 1-based numbers of applied items.
_APPLY = """
local floor = tonumber(redis.call('HGET', KEYS[3], 'floor') or '0')
local seen = tonumber(redis.call('HGET', KEYS[3], 'seen') or '0')
local applied = {}
local n = 0
for i = 6, #ARGV, 5 do
  n = n + 1
  if ARGV[i] == 'b' then
    redis.call('HSET', KEYS[3], 'beacon', ARGV[i + 4])
    local s = redis.call('INCR', KEYS[6])
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], s .. '-0', 'peer', ARGV[1], 'type', 'beacon',
               'at', ARGV[2], 'seen', seen, 'body', ARGV[i + 4])
    applied[#applied + 1] = n
  else
    local id = ARGV[i + 1]
    local v = tonumber(ARGV[i + 2])
    if v > seen then seen = v end
    if v > floor then
      local cur = tonumber(redis.call('HGET', KEYS[2], id) or '0')
      if math.abs(cur) < v then
        if ARGV[i + 3] == '' then
          redis.call('HDEL', KEYS[1], id)
          redis.call('HSET', KEYS[2], id, '-' .. ARGV[i + 2])
        else
          redis.call('HSET', KEYS[1], id, ARGV[i + 3])
          redis.call('HSET', KEYS[2], id, ARGV[i + 2])
        end
        local s = redis.call('INCR', KEYS[6])
        redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], s .. '-0', 'peer', ARGV[1], 'type', 'change',
                   'at', ARGV[2], 'seen', seen, 'agent_id', id, 'version', ARGV[i + 2], 'body', ARGV[i + 4])
        applied[#applied + 1] = n
      end
    end
  end
end
redis.call('HSET', KEYS[3], 'seen', seen)
if #applied > 0 then redis.call('HSET', KEYS[3], 'heard_at_ms', ARGV[2]) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[4], ARGV[4], ARGV[5]) end
table.insert(applied, 1, seen)
return applied
"""

# KEYS: agents, versions, state, offsets, feed, seq.
# ARGV: peer, now ms, feed maxlen, offsets field ('' = none), offset, watermark, reset ('1'/'0'),
#       then 3 per snapshot record: agent_id, version, record JSON.
# Returns {floor, seen, runs, n_put, put item numbers..., evicted agent ids...}.
_RECONCILE = """
local w = tonumber(ARGV[6])
local reset = ARGV[7] == '1'
local floor = tonumber(redis.call('HGET', KEYS[3], 'floor') or '0')
local seen = tonumber(redis.call('HGET', KEYS[3], 'seen') or '0')
if reset then
  redis.call('DEL', KEYS[1], KEYS[2])
  floor = w
  seen = w
else
  if w > floor then floor = w end
  if w > seen then seen = w end
end
local present = {}
local put = {}
local n = 0
for i = 8, #ARGV, 3 do
  n = n + 1
  local id = ARGV[i]
  present[id] = true
  local cur = tonumber(redis.call('HGET', KEYS[2], id) or '0')
  if math.abs(cur) < tonumber(ARGV[i + 1]) then
    redis.call('HSET', KEYS[1], id, ARGV[i + 2])
    redis.call('HSET', KEYS[2], id, ARGV[i + 1])
    put[#put + 1] = n
  end
end
local evicted = {}
for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
  if not present[id] then
    local cur = tonumber(redis.call('HGET', KEYS[2], id) or '0')
    if cur <= w then
      redis.call('HDEL', KEYS[1], id)
      redis.call('HDEL', KEYS[2], id)
      evicted[#evicted + 1] = id
    end
  end
end
local all = redis.call('HGETALL', KEYS[2])
for j = 1, #all, 2 do
  local v = tonumber(all[j + 1])
  if v < 0 and -v <= floor then redis.call('HDEL', KEYS[2], all[j]) end
end
local runs = redis.call('HINCRBY', KEYS[3], 'anti_entropy_runs', 1)
redis.call('HSET', KEYS[3], 'floor', floor, 'seen', seen, 'reconciled_at_ms', ARGV[2])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[4], ARGV[4], ARGV[5]) end
local s
if reset then
  s = redis.call('INCR', KEYS[6])
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], s .. '-0', 'peer', ARGV[1], 'type', 'reload', 'at', ARGV[2],
             'seen', seen)
else
  for _, k in ipairs(put) do
    local i = 8 + (k - 1) * 3
    s = redis.call('INCR', KEYS[6])
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], s .. '-0', 'peer', ARGV[1], 'type', 'put', 'at', ARGV[2],
               'seen', seen, 'agent_id', ARGV[i], 'version', ARGV[i + 1], 'body', ARGV[i + 2])
  end
  for _, id in ipairs(evicted) do
    s = redis.call('INCR', KEYS[6])
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], s .. '-0', 'peer', ARGV[1], 'type', 'evict', 'at', ARGV[2],
               'seen', seen, 'agent_id', id, 'version', w)
  end
  s = redis.call('INCR', KEYS[6])
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], s .. '-0', 'peer', ARGV[1], 'type', 'state', 'at', ARGV[2],
             'seen', seen, 'floor', floor, 'runs', runs)
end
local out = {floor, seen, runs, #put}
for _, k in ipairs(put) do out[#out + 1] = k end
for _, id in ipairs(evicted) do out[#out + 1] = id end
return out
"""


@dataclass(slots=True)
class PeerState:
    """What the consuming region's Redis holds about one peer."""

    region: str
    records: list[AgentRecord] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    floor: int = 0
    seen: int = 0
    heard_at_ms: int = 0
    beacon: RegionBeacon | None = None
    anti_entropy_runs: int = 0
    reconciled_at_ms: int = 0


@dataclass(slots=True)
class FeedEntry:
    """One entry of the replica feed (see the module docstring)."""

    seq: int
    peer: str
    type: str
    at_ms: int
    seen: int
    body: str | None = None
    agent_id: str | None = None
    version: int = 0
    floor: int = 0
    runs: int = 0


@dataclass(slots=True)
class ApplyResult:
    seen: int
    applied: list[int]


@dataclass(slots=True)
class ReconcileResult:
    floor: int
    seen: int
    runs: int
    put: list[AgentRecord]
    evicted: list[str]


class ReplicaStore:
    """Async access to the peers' replica in the consuming region's Redis.

    Raises :class:`node.core.errors.StoreUnavailable` when Redis cannot be reached.
    """

    def __init__(self, redis: aioredis.Redis, *, region: str, key_prefix: str, feed_maxlen: int,
                 quarantine: Quarantine | None = None) -> None:
        self.redis = redis
        self.region = region
        self.quarantine = quarantine if quarantine is not None else Quarantine()  # an empty one is falsy
        self.feed_maxlen = feed_maxlen
        self.key_base = f"{key_prefix}:{{{region}}}:fed"
        self.key_offsets = f"{self.key_base}:offsets"
        self.key_feed = f"{self.key_base}:feed"
        self.key_seq = f"{self.key_base}:feed:seq"
        self.key_published = f"{self.key_base}:published"
        self._apply = redis.register_script(_APPLY)
        self._reconcile = redis.register_script(_RECONCILE)
        self._committing: dict[str, asyncio.Lock] = {}

    def committing(self, peer: str) -> asyncio.Lock:
        """Held by the consumer and anti-entropy from a commit of ``peer``'s replica in Redis to its
        in-memory apply: two commits whose replies came back in the other order would otherwise be
        applied out of Redis's order (a reconcile's floor first, then the changes it covers, refused)."""
        return self._committing.setdefault(peer, asyncio.Lock())

    def _peer_keys(self, peer: str) -> list[str]:
        base = f"{self.key_base}:peer:{peer}"
        return [f"{base}:agents", f"{base}:versions", f"{base}:state", self.key_offsets, self.key_feed, self.key_seq]

    # -- consumer side -----------------------------------------------------------------------

    async def apply(self, peer: str, messages: Sequence[FederationMessage], *, now_ms: int,
                    offset: tuple[str, int] | None = None) -> ApplyResult:
        """Apply records of ``peer``'s topic in order and move the offset, atomically."""
        args: list[object] = [peer, now_ms, self.feed_maxlen, offset[0] if offset else "", offset[1] if offset else 0]
        for message in messages:
            if message.beacon is not None:
                args += ["b", "", 0, "", message.beacon.model_dump_json()]
            elif (change := message.change) is not None:
                record = change.record.model_dump_json() if change.record is not None else ""
                args += ["c", change.agent_id, change.version, record, change.model_dump_json(exclude_none=True)]
        async with RedisErrors(self.region):
            reply = await self._apply(keys=self._peer_keys(peer), args=args)
        return ApplyResult(seen=int(reply[0]), applied=[int(n) for n in reply[1:]])

    async def reconcile(self, peer: str, snapshot: Snapshot, *, now_ms: int, reset: bool = False,
                        offset: tuple[str, int] | None = None) -> ReconcileResult:
        """Make the replica of ``peer`` agree with its snapshot (see ``antientropy``)."""
        args: list[object] = [peer, now_ms, self.feed_maxlen, offset[0] if offset else "", offset[1] if offset else 0,
                              snapshot.watermark, "1" if reset else "0"]
        for record in snapshot.agents:
            args += [record.agent_id, record.version, record.model_dump_json()]
        async with RedisErrors(self.region):
            reply = await self._reconcile(keys=self._peer_keys(peer), args=args)
        floor, seen, runs, n_put = (int(value) for value in reply[:4])
        put = [snapshot.agents[int(number) - 1] for number in reply[4:4 + n_put]]
        return ReconcileResult(floor=floor, seen=seen, runs=runs, put=put, evicted=list(reply[4 + n_put:]))

    async def offsets(self) -> dict[str, int]:
        async with RedisErrors(self.region):
            raw = await self.redis.hgetall(self.key_offsets)
        return {name: int(value) for name, value in raw.items()}

    async def set_offset(self, name: str, offset: int) -> None:
        async with RedisErrors(self.region):
            await self.redis.hset(self.key_offsets, name, offset)

    # -- publisher side ----------------------------------------------------------------------

    async def published_position(self) -> int:
        """This region's version up to which Kafka acknowledged every change."""
        async with RedisErrors(self.region):
            return int(await self.redis.get(self.key_published) or 0)

    async def set_published(self, version: int) -> None:
        async with RedisErrors(self.region):
            await self.redis.set(self.key_published, version)

    # -- readers -----------------------------------------------------------------------------

    async def load(self, peers: Sequence[str]) -> tuple[int, dict[str, PeerState]]:
        """Every peer's replica and the feed sequence it is consistent with (one MULTI/EXEC)."""
        async with RedisErrors(self.region):
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.get(self.key_seq)
                for peer in peers:
                    agents, versions, state = self._peer_keys(peer)[:3]
                    pipe.hgetall(agents)
                    pipe.hgetall(versions)
                    pipe.hgetall(state)
                reply = await pipe.execute()
        seq = int(reply[0] or 0)
        states = {}
        for position, peer in enumerate(peers):
            raw_agents, raw_versions, raw_state = reply[1 + 3 * position: 4 + 3 * position]
            states[peer] = self._peer_state(peer, raw_agents, raw_versions, raw_state)
        return seq, states

    def _peer_state(self, peer: str, raw_agents: dict[str, str], raw_versions: dict[str, str],
                    raw_state: dict[str, str]) -> PeerState:
        records = []
        base = self._peer_keys(peer)[0]
        for agent_id, raw in raw_agents.items():
            try:
                records.append(read_record(raw))
            except ValidationError as exc:
                # Skipped, not fatal: the peer's next beacon disagrees and anti-entropy re-syncs it.
                self.quarantine.add("replica", f"{base}/{agent_id}", first_problem(exc).message,
                                    agent_id=agent_id)
        beacon = None
        if raw_state.get("beacon"):
            try:
                beacon = compat.read_json(RegionBeacon, raw_state["beacon"])
            except ValidationError as exc:
                self.quarantine.add("replica", f"{self._peer_keys(peer)[2]}/beacon", first_problem(exc).message)
        return PeerState(
            region=peer, records=records, versions={agent_id: int(v) for agent_id, v in raw_versions.items()},
            floor=int(raw_state.get("floor", 0)), seen=int(raw_state.get("seen", 0)),
            heard_at_ms=int(raw_state.get("heard_at_ms", 0)), beacon=beacon,
            anti_entropy_runs=int(raw_state.get("anti_entropy_runs", 0)),
            reconciled_at_ms=int(raw_state.get("reconciled_at_ms", 0)),
        )

    async def read_feed(self, *, after_seq: int, block_ms: int | None = None, count: int = 1_000) -> list[FeedEntry]:
        async with RedisErrors(self.region):
            if block_ms is None:
                entries = await self.redis.xrange(self.key_feed, min=f"({after_seq}-0", max="+", count=count)
            else:
                reply = await self.redis.xread({self.key_feed: f"{after_seq}-0"}, count=count, block=block_ms)
                entries = reply[0][1] if reply else []
        return [_feed_entry(entry_id, fields) for entry_id, fields in entries]

    async def feed_seq(self) -> int:
        async with RedisErrors(self.region):
            return int(await self.redis.get(self.key_seq) or 0)

    async def first_feed_seq(self) -> int | None:
        async with RedisErrors(self.region):
            entries = await self.redis.xrange(self.key_feed, count=1)
        return int(entries[0][0].split("-", 1)[0]) if entries else None


def _feed_entry(entry_id: str, fields: dict[str, str]) -> FeedEntry:
    return FeedEntry(
        seq=int(entry_id.split("-", 1)[0]), peer=fields["peer"], type=fields["type"], at_ms=int(fields["at"]),
        seen=int(fields.get("seen", 0)), body=fields.get("body"), agent_id=fields.get("agent_id"),
        version=int(fields.get("version", 0)), floor=int(fields.get("floor", 0)), runs=int(fields.get("runs", 0)),
    )
