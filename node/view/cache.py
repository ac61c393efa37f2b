"""The in-memory view of a region that routing reads: snapshot, then tail the change stream.

``AgentIndex`` is the plain data structure (records by id and by capability name), also used by
the federation replica for peer regions. ``RegionCache`` keeps one index current with the
region's Redis (a :class:`~node.view.follower.StreamFollower`): it loads a snapshot, then
``XREAD BLOCK``s the change stream from the snapshot's version; a version gap (the capped
stream was trimmed past us, an entry did not parse, or Redis was wiped) reloads the snapshot.
Loads reported by heartbeats or load reports come over the region's load channel
(``node.store.loads.LoadFeed``), not the stream. Heartbeats that only move leases append nothing, so every ``lease_sync_interval_ms`` the cache
re-reads the leases it holds as ending within two intervals (ZMSCORE; an agent heartbeating
through another replica is re-read about once per lease, not once per interval); which those are,
``node.view.leases`` tells without looking at every lease. Routing treats
a lease as passed only against the start of the last successful sync — every lease that ended
before that instant was re-read then — so a node cut off from Redis keeps routing on what it
knew instead of emptying its table. Likewise, when more than ``preserve_fraction`` of a
region's leases have passed at once (agents cut off from Redis, not dead), routing stops
expiring leases lazily until the share drops again (self-preservation, as the sweeper does).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Coroutine, Iterable, Iterator
from typing import Any

from ..core import StoreUnavailable, now_ms
from ..core.models import AgentRecord, ChangeEvent, ChangeKind, DeleteReason, Load
from ..store import (HeldChange, LoadFeed, RegionSnapshots, RegionStore, build, compact, holding, is_compact,
                     share_load)
from .follower import FollowerState, StreamFollower
from .leases import LeaseBuckets
from .suspects import SuspectList

log = logging.getLogger(__name__)

DEFAULT_LEASE_SYNC_INTERVAL_MS = 1_000
_FILL_SLICE = 5_000  # records per slice when the lease buckets are filled (node.view.leases)
CHANGE_LOG = 256  # per capability: changes a table can be patched with (node.routing.candidates)
DEFAULT_TAIL_BLOCK_MS = 1_000
DEFAULT_PRESERVE_FRACTION = 0.5
DEFAULT_PRESERVE_MIN_AGENTS = 10


class AgentIndex:
    """Records of one region by agent_id and by capability name (no I/O)."""

    __slots__ = ("region", "records", "by_capability", "version", "generation", "capability_generation",
                 "suspects", "lease_buckets", "_changes", "_reset_generation")

    def __init__(self, region: str) -> None:
        self.region = region
        self.records: dict[str, AgentRecord] = {}
        self.by_capability: dict[str, dict[str, AgentRecord]] = {}
        self.version = 0
        # Bumped on every put/remove (and per capability name), so readers that derive data
        # from the index (the router's tables) know when to rebuild it.
        self.generation = 0
        self.capability_generation: dict[str, int] = {}
        # Per capability name, the last CHANGE_LOG (generation, agent_id) bumps: which agents a
        # reader's table derived at an older generation must look at again (changes_since).
        self._changes: dict[str, deque[tuple[int, str]]] = {}
        self._reset_generation = 0
        # Agents whose session dropped, with the record version they were suspected at
        # (node.view.suspects): held, leased, not routable. A newer record is never suspect.
        self.suspects: dict[str, int] = {}
        # Agents by when their lease ends, for a reader that asks which end soon (RegionCache).
        self.lease_buckets: LeaseBuckets | None = None

    def __len__(self) -> int:
        return len(self.records)

    def get(self, agent_id: str) -> AgentRecord | None:
        return self.records.get(agent_id)

    def with_capability(self, name: str) -> dict[str, AgentRecord]:
        return self.by_capability.get(name, {})

    def put(self, record: AgentRecord) -> AgentRecord | None:
        """Insert or replace (a compact equal of ``record`` is held: ``node.store.compact``); returns the
        record it replaced."""
        record = _held(record)
        previous = self.records.get(record.agent_id)
        if previous is not None:
            self._unindex(previous)
            self._bump(previous)
        self.records[record.agent_id] = record
        for capability in record.capabilities:
            self.by_capability.setdefault(capability.name, {})[record.agent_id] = record
        if self.suspects and self.suspects.get(record.agent_id, record.version) < record.version:
            del self.suspects[record.agent_id]  # registered again, or a new status: a sign of life
        if self.lease_buckets is not None:
            self.lease_buckets.put(record, previous)
        self._bump(record)
        return previous

    def suspect(self, agent_id: str, version: int) -> bool:
        """Hold ``agent_id`` as suspect at record ``version`` (not routable, lease kept); True if
        that changed anything (a change for the readers of ``changes_since``)."""
        record = self.records.get(agent_id)
        if record is None or record.version > version or agent_id in self.suspects:
            return False
        self.suspects[agent_id] = version
        self._bump(record)
        return True

    def unsuspect(self, agent_id: str) -> bool:
        """``agent_id`` is no longer suspect (it came back); True if it was."""
        if self.suspects.pop(agent_id, None) is None:
            return False
        record = self.records.get(agent_id)
        if record is not None:
            self._bump(record)
        return True

    def set_load(self, agent_id: str, load: Load) -> bool:
        """Set the live load of a held record (in place: load is soft state, ``node.store.loads``); True
        if it changed. Counts as a change of the agent for the readers of ``changes_since``."""
        record = self.records.get(agent_id)
        if record is None or record.load == load:
            return False
        record.__dict__["load"] = share_load(load)
        self._bump(record)
        return True

    def remove(self, agent_id: str) -> AgentRecord | None:
        self.suspects.pop(agent_id, None)
        previous = self.records.pop(agent_id, None)
        if previous is not None:
            self._unindex(previous)
            self._bump(previous)
        return previous

    def _bump(self, record: AgentRecord) -> None:
        self.generation += 1
        for capability in record.capabilities:
            self.capability_generation[capability.name] = self.generation
            log = self._changes.get(capability.name)
            if log is None:
                log = self._changes[capability.name] = deque(maxlen=CHANGE_LOG)
            log.append((self.generation, record.agent_id))

    def changes_since(self, name: str, generation: int) -> set[str] | None:
        """The agents with capability ``name`` (then or now) changed after ``generation``, or None
        when that is no longer known (too many changes since, or a snapshot swapped in)."""
        if generation < self._reset_generation:
            return None
        if self.capability_generation.get(name, 0) <= generation:
            return set()  # none bumped since (after a bulk load no change is logged yet)
        log = self._changes.get(name)
        if log is None:
            return None
        if len(log) == log.maxlen and log[0][0] > generation:  # older entries were dropped
            return None
        return {agent_id for bumped, agent_id in log if bumped > generation}

    def _unindex(self, record: AgentRecord) -> None:
        for capability in record.capabilities:
            holders = self.by_capability.get(capability.name)
            if holders is not None:
                holders.pop(record.agent_id, None)
                if not holders:
                    del self.by_capability[capability.name]

    def apply(self, event: ChangeEvent) -> bool:
        """Apply a change unless it is older than what is held; True if it changed the index."""
        current = self.records.get(event.agent_id)
        if current is not None and current.version >= event.version:
            return False
        if event.kind is ChangeKind.DELETE:
            if current is None:
                return False
            self.remove(event.agent_id)
        elif event.record is not None:
            if current is not None and event.record.lease_expires_at_ms < current.lease_expires_at_ms:
                event.record.lease_expires_at_ms = current.lease_expires_at_ms
            self.put(event.record)
        self.version = max(self.version, event.version)
        return True

    def replace_all(self, records: Iterable[AgentRecord], version: int) -> list[ChangeEvent]:
        """Swap in a full snapshot; returns the changes that turn the old view into the new."""
        loaded = AgentIndex(self.region)
        loaded.add_all(records)
        return list(self.take(loaded, version))

    def add_all(self, records: Iterable[AgentRecord]) -> None:
        """:meth:`put` of every record into an index being loaded, logging no change and bumping
        nothing: :meth:`take` swaps it in with one bump for all (a per-record bump was ~11 % of
        a 1,000,000-record load). A region's load adds each chunk as it is parsed, while its
        records are still in the processor's cache: indexed in a pass of their own after the
        whole region was read, 1,000,000 records cost ~3 µs each, mostly cache misses."""
        held = self.records
        by_capability = self.by_capability
        for record in records:
            record = _held(record)
            previous = held.get(record.agent_id)
            if previous is not None:  # the same agent twice: the last one counts, as with put
                self._unindex(previous)
            held[record.agent_id] = record
            for capability in record.capabilities:
                holders = by_capability.get(capability.name)
                if holders is None:
                    holders = by_capability[capability.name] = {}
                holders[record.agent_id] = record

    def take(self, loaded: AgentIndex, version: int) -> Iterator[ChangeEvent]:
        """Hold what ``loaded`` holds (filled by :meth:`add_all`, not to be used after) at
        ``version``; returns the changes that turn the old view into the new, made as they are
        iterated — iterate them before this index changes again.

        Every capability's generation is the new one and no change is logged: a reader's table
        from before is older than ``_reset_generation``, so ``changes_since`` says rebuild.
        """
        old = self.records
        self.records = loaded.records
        self.by_capability = loaded.by_capability
        loaded.records, loaded.by_capability = {}, {}
        self.capability_generation.clear()
        self._changes.clear()
        self.generation += 1
        self._reset_generation = self.generation
        self.capability_generation.update(dict.fromkeys(self.by_capability, self.generation))
        self.version = version
        self.suspects = {agent_id: suspected for agent_id, suspected in self.suspects.items()
                         if (record := self.records.get(agent_id)) is not None and record.version <= suspected}
        if self.lease_buckets is not None:
            self.lease_buckets.reset()
        return self._changes_from(old, self.records, version)

    def _changes_from(self, old: dict[str, AgentRecord], new: dict[str, AgentRecord],
                      version: int) -> Iterator[ChangeEvent]:
        """The changes from ``old`` to ``new``, built without validation (``node.store.compact.build``):
        their records were validated as they were read, and a region reload makes one per record."""
        at = now_ms()
        region = self.region
        for agent_id, gone in old.items():
            if agent_id not in new:
                yield build(ChangeEvent, {"kind": ChangeKind.DELETE, "region": region, "version": version,
                                          "agent_id": agent_id, "at_ms": at, "record": None,
                                          "reason": DeleteReason.EVICTED, "allowed_callers": gone.allowed_callers})
        upsert = build(ChangeEvent, {"kind": ChangeKind.UPSERT, "region": region, "version": 0, "agent_id": "",
                                     "at_ms": at, "record": None, "reason": None, "allowed_callers": None}).__dict__
        for record in list(new.values()):  # a list: a listener may change the index meanwhile
            was = old.get(record.agent_id)
            if was is None or was.version != record.version:
                fields = upsert.copy()  # one per record: the template's fields, three of them its own
                fields["version"], fields["agent_id"], fields["record"] = record.version, record.agent_id, record
                yield holding(ChangeEvent, fields)

    def __iter__(self) -> Iterator[AgentRecord]:
        return iter(self.records.values())


CacheState = FollowerState  # the cache's state: NEW → RUNNING ⇄ DISCONNECTED → CLOSED, or FAILED


class RegionCache(StreamFollower[ChangeEvent | HeldChange]):
    """Keeps an :class:`AgentIndex` current with the region's Redis; an async context manager.

    Listeners are called synchronously, in the event loop, for every applied change (including
    the synthetic ones a reload produces); they must be quick and must not raise.
    """

    stream_name = "change stream"

    def __init__(self, store: RegionStore, *, lease_sync_interval_ms: int = DEFAULT_LEASE_SYNC_INTERVAL_MS,
                 tail_block_ms: int = DEFAULT_TAIL_BLOCK_MS, preserve_fraction: float = DEFAULT_PRESERVE_FRACTION,
                 preserve_min_agents: int = DEFAULT_PRESERVE_MIN_AGENTS) -> None:
        super().__init__(region=store.region, task_name=f"cache-tail-{store.region}")
        self.store = store
        self.snapshots = RegionSnapshots(store)  # the region load reads the whole region
        self.index = AgentIndex(store.region)
        self.lease_buckets = self.index.lease_buckets = LeaseBuckets(lease_sync_interval_ms)
        self.lease_sync_interval_ms = lease_sync_interval_ms
        self.tail_block_ms = tail_block_ms
        self.preserve_fraction = preserve_fraction
        self.preserve_min_agents = preserve_min_agents
        self.preserving = False
        self.lease_synced_at_ms = 0
        self.loads = LoadFeed(store, self.index.set_load)
        self.suspects = SuspectList(store, self.index)

    def routable_now_ms(self) -> int:
        """Leases that ended before this instant are certainly over (see module docstring)."""
        if self.preserving:
            return 0
        return min(now_ms(), self.lease_synced_at_ms) if self.lease_synced_at_ms else now_ms()

    def apply_local(self, event: ChangeEvent) -> None:
        """Apply a change this node just wrote, ahead of the stream (read-your-writes).

        The same entry arriving later from the stream is then skipped by version.
        """
        if self._apply_stream_event(event):
            self._emit([event])

    def touch_lease(self, agent_id: str, lease_expires_at_ms: int) -> None:
        record = self.index.get(agent_id)
        if record is not None and record.lease_expires_at_ms < lease_expires_at_ms:
            record.lease_expires_at_ms = lease_expires_at_ms

    def touch_leases(self, moved: list[tuple[AgentRecord, int]]) -> None:
        """:meth:`touch_lease` of records in hand (a session's frame of renewals): the field is
        set in the record's ``__dict__`` (an int for an int: pydantic's assignment hook, a few
        µs a record, has nothing to check)."""
        for record, lease_expires_at_ms in moved:
            if record.lease_expires_at_ms < lease_expires_at_ms:
                record.__dict__["lease_expires_at_ms"] = lease_expires_at_ms

    # -- the tail (node.view.follower) -------------------------------------------------------------

    async def _load(self) -> tuple[int, Iterator[ChangeEvent]]:
        started = now_ms()
        version = await self.snapshots.version()  # first: see RegionSnapshots.snapshot
        loaded = AgentIndex(self.store.region)
        async for records in self.snapshots.parsed_chunks():
            loaded.add_all(records)
        # The snapshot read every lease: none that ended before it started is unknown to us.
        self.lease_synced_at_ms = started
        return version, self.index.take(loaded, version)

    async def _read(self, *, after: int) -> list[ChangeEvent | HeldChange]:
        # The node's own writes, applied ahead of the stream (apply_local), come back unparsed.
        return await self.store.read_changes(after_version=after, block_ms=self.tail_block_ms, held=self._holds)

    def _holds(self, agent_id: str, version: int) -> bool:
        current = self.index.records.get(agent_id)
        return current is not None and current.version >= version  # what index.apply would skip

    def _number(self, entry: ChangeEvent | HeldChange) -> int:
        return entry.version

    async def _apply(self, entry: ChangeEvent | HeldChange) -> tuple[ChangeEvent, ...]:
        if isinstance(entry, HeldChange):
            self.index.version = max(self.index.version, entry.version)
            return ()
        applied = self._apply_stream_event(entry)
        # An entry this node applied ahead of the stream (apply_local) changes nothing, but the
        # index has still seen its version.
        self.index.version = max(self.index.version, entry.version)
        return (entry,) if applied else ()

    async def _lost_data(self) -> bool:
        """An idle stream whose version is behind ours, or whose oldest entry is past the next
        one we need, means Redis lost data or the capped stream was trimmed past us."""
        position = self.position
        version = await self.store.version()
        return version < position or (version > position and (await self.store.first_change_version() or 0) > position + 1)

    def _background(self) -> dict[str, Coroutine[Any, Any, None]]:
        return {f"cache-leases-{self.store.region}": self._sync_leases(),
                f"cache-loads-{self.store.region}": self.loads.run(),
                f"cache-suspects-{self.store.region}": self.suspects.run()}

    def _apply_stream_event(self, event: ChangeEvent) -> bool:
        current = self.index.get(event.agent_id)
        if event.record is not None and current is not None:
            # Stream records do not carry leases moved by heartbeats; keep what we know.
            event.record.lease_expires_at_ms = max(current.lease_expires_at_ms, event.record.lease_expires_at_ms)
        return self.index.apply(event)

    async def _sync_leases(self) -> None:
        while True:
            await asyncio.sleep(self.lease_sync_interval_ms / 1000)
            try:
                started = now_ms()
                soon = started + 2 * self.lease_sync_interval_ms
                ending = await self._leases_ending(soon)
                if ending:
                    for agent_id, expires in (await self.store.leases(ending)).items():
                        self.touch_lease(agent_id, expires)
                self.lease_synced_at_ms = started
                self._check_preservation(started, ending)
            except asyncio.CancelledError:
                raise
            except StoreUnavailable as exc:
                self._set_reachable(False)
                log.warning("region %s: lease sync failed: %s", self.store.region, exc)

    async def _leases_ending(self, soon: int) -> list[str]:
        """Agents whose lease (as held) ends by ``soon``: what comes due of ``index.lease_buckets``
        (``node.view.leases``), not a scan of every record."""
        buckets = self.lease_buckets
        while not buckets.built:  # the index was loaded: every record goes in, a slice at a time
            records, resets = list(self.index.records.values()), buckets.resets
            buckets.start()
            for start in range(0, len(records), _FILL_SLICE):
                if start:
                    await asyncio.sleep(0)  # 100,000 records at once held the loop ~50 ms
                if buckets.resets != resets:
                    break  # swapped again meanwhile: start over
                buckets.fill(records[start:start + _FILL_SLICE])
        return buckets.ending(self.index.records, soon)

    def _check_preservation(self, at_ms: int, ending: list[str]) -> None:
        """``ending`` holds every agent whose lease could have passed by ``at_ms`` (just re-read)."""
        total = len(self.index)
        passed = sum(1 for agent_id in ending
                     if (record := self.index.get(agent_id)) is not None and record.lease_expires_at_ms <= at_ms)
        preserving = total >= self.preserve_min_agents and passed > self.preserve_fraction * total
        if preserving != self.preserving:
            log.warning("region %s: %d of %d leases passed at once; lazy expiry %s", self.store.region, passed,
                        total, "suspended (self-preservation)" if preserving else "resumed")
        self.preserving = preserving


def _held(record: AgentRecord) -> AgentRecord:
    """The compact equal of ``record`` that the index holds, with its load shared (a reader may
    have set a load of its own on it; a compact load is a shared one)."""
    record = compact(record)
    if not is_compact(record.load):
        record.__dict__["load"] = share_load(record.load)
    return record
