"""The remote catalog: peer regions' agents as this region knows them, nearest region first.

This is what the router reads (``node.remote.RemoteCatalog``): one :class:`PeerReplica` per
peer with an :class:`~node.view.cache.AgentIndex` of its agents and a freshness verdict. A peer is
``stale`` once nothing (no beacon, no change) has been heard from it for ``stale_after_ms`` —
its node stopped, its publisher cannot reach Kafka, or this region's consumer cannot. Stale
peers stay routable, but only when no fresher level can serve (see ``node.router``).

State lives in the consuming region's Redis (``federation.replica_store``). Every node replica
of the region loads it at start and then tails the replica feed (:class:`PeerCatalog`, a
``node.view.follower.StreamFollower``), so a restarted node comes back with the peers it knew and
with their last-heard times (stale until a beacon arrives). The
leader, which runs the Kafka consumer, also applies what it commits at once, ahead of the feed
(read-your-writes); the feed then repeats those changes and they are skipped by version.

In memory the replica keeps the same rules as the Redis scripts: a change applies only when
its version is above the floor and above the agent's version or tombstone, so duplicates,
replays and late arrivals never move a record backwards or resurrect a deleted agent. Every
applied change is given to subscribers as a :class:`~node.core.models.ChangeEvent` of the peer's
region (the node's watch hub, the semantic index) — synchronously, so listeners must be quick.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from pydantic import ValidationError

from node.core import first_problem, now_ms
from node.core.models import AgentRecord, ChangeEvent, ChangeKind, DeleteReason, SummaryView, compat
from node.store import read_record
from node.view import AgentIndex, FollowerState, StreamFollower

from .digest import digest_hex, entry_hash
from .events import RegionBeacon
from .replica_store import FeedEntry, PeerState, ReplicaStore, shielded_read


class PeerReplica:
    """One peer region: its agents, how far this region has read, and how fresh that is."""

    def __init__(self, region: str, *, stale_after_ms: int, replicated: bool = True) -> None:
        self.region = region
        self.index = AgentIndex(region)
        # False: a summary-only peer (beyond the replicate depth): no records, lookups are forwarded.
        self.replicated = replicated
        self.latest_summary: SummaryView | None = None
        self.summary_received_at_ms = 0
        self.stale_after_ms = stale_after_ms
        self.versions: dict[str, int] = {}
        self.floor = 0
        self.seen_version = 0
        self.heard_at_ms = 0
        self.beacon: RegionBeacon | None = None
        self.anti_entropy_runs = 0
        self.reconciled_at_ms = 0
        self._digest = 0

    # -- PeerView ----------------------------------------------------------------------------

    @property
    def stale(self) -> bool:
        """True when nothing was heard from the peer for ``stale_after_ms`` (or ever)."""
        return self.heard_at_ms == 0 or now_ms() - self.heard_at_ms > self.stale_after_ms

    @property
    def summary(self) -> SummaryView | None:
        """The latest complete summary, unless it arrived longer than ``stale_after_ms`` ago."""
        if self.latest_summary is None or now_ms() - self.summary_received_at_ms > self.stale_after_ms:
            return None
        return self.latest_summary

    def set_summary(self, summary: SummaryView, *, received_at_ms: int) -> None:
        """The peer's latest complete summary (``federation.summary``)."""
        self.latest_summary = summary
        self.summary_received_at_ms = received_at_ms

    # -- state -------------------------------------------------------------------------------

    @property
    def digest(self) -> str:
        return digest_hex(self._digest)

    @property
    def in_sync(self) -> bool:
        """The last beacon's watermark was reached and the replica matches its count and digest."""
        beacon = self.beacon
        return (beacon is not None and beacon.watermark == self.seen_version and beacon.digest is not None
                and beacon.live_count == len(self.index) and beacon.digest == self.digest)

    def apply_change(self, event: ChangeEvent) -> bool:
        """Apply one change of this peer unless it is covered already; True if it changed the replica."""
        self.seen_version = max(self.seen_version, event.version)
        self.index.version = self.seen_version
        if event.version <= self.floor or abs(self.versions.get(event.agent_id, 0)) >= event.version:
            return False
        if event.kind is ChangeKind.DELETE or event.record is None:
            self._drop(event.agent_id)
            self.versions[event.agent_id] = -event.version
        else:
            self._put(event.record)
        return True

    def covers(self, agent_id: str, version: int, *, below_floor: bool = True) -> bool:
        """A change of ``agent_id`` at ``version`` would not apply: held at that version or later
        (or, for a change from the topic, at or below the floor)."""
        return (below_floor and version <= self.floor) or abs(self.versions.get(agent_id, 0)) >= version

    def put_record(self, record: AgentRecord) -> ChangeEvent | None:
        """A record from a peer's snapshot; the upsert event if it was newer than what is held."""
        if abs(self.versions.get(record.agent_id, 0)) >= record.version:
            return None
        self._put(record)
        return ChangeEvent(kind=ChangeKind.UPSERT, region=self.region, version=record.version,
                           agent_id=record.agent_id, at_ms=now_ms(), record=record)

    def evict(self, agent_id: str, watermark: int) -> ChangeEvent | None:
        """Drop an agent a snapshot at ``watermark`` no longer lists (unless held at a newer version)."""
        current = self.index.get(agent_id)
        if current is None or current.version > watermark:
            return None
        self._drop(agent_id)
        self.versions.pop(agent_id, None)
        return ChangeEvent(kind=ChangeKind.DELETE, region=self.region, version=watermark, agent_id=agent_id,
                           at_ms=now_ms(), reason=DeleteReason.EVICTED)

    def raise_floor(self, floor: int, seen: int) -> None:
        """Everything up to ``floor`` is covered by a snapshot: older tombstones can go."""
        self.floor = max(self.floor, floor)
        self.seen_version = max(self.seen_version, seen)
        self.index.version = self.seen_version
        for agent_id in [a for a, v in self.versions.items() if v < 0 and -v <= self.floor]:
            del self.versions[agent_id]

    def hear(self, at_ms: int) -> None:
        self.heard_at_ms = max(self.heard_at_ms, at_ms)

    def replace(self, state: PeerState) -> list[ChangeEvent]:
        """Swap in the state loaded from Redis; returns the changes from the old view to the new."""
        records = state.records if self.replicated else []  # left over from a deeper replicate_depth
        changes = self.index.replace_all(records, state.seen)
        self._digest = 0
        for record in records:
            self._digest ^= entry_hash(record.agent_id, record.version)
        self.versions = dict(state.versions)
        self.floor = state.floor
        self.seen_version = state.seen
        self.heard_at_ms = max(self.heard_at_ms, state.heard_at_ms)
        self.beacon = state.beacon or self.beacon
        self.anti_entropy_runs = state.anti_entropy_runs
        self.reconciled_at_ms = state.reconciled_at_ms
        return changes

    def describe(self) -> dict[str, object]:
        """Freshness, lag and counts for ``GET /v1/regions``."""
        now = now_ms()
        beacon = self.beacon
        return {
            "region": self.region,
            "stale": self.stale,
            "heard_age_ms": now - self.heard_at_ms if self.heard_at_ms else None,
            "beacon_age_ms": now - beacon.sent_at_ms if beacon else None,
            "beacon_watermark": beacon.watermark if beacon else None,
            "beacon_live_count": beacon.live_count if beacon else None,
            "beacon_digest": beacon.digest if beacon else None,
            "seen_version": self.seen_version,
            "events_behind": max(0, beacon.watermark - self.seen_version) if beacon else None,
            "agents": len(self.index),
            "digest": self.digest,
            "in_sync": self.in_sync,
            "anti_entropy_runs": self.anti_entropy_runs,
            "reconciled_at_ms": self.reconciled_at_ms or None,
            "replicated": self.replicated,
            "summary": self._describe_summary(now),
        }

    def _describe_summary(self, now: int) -> dict[str, object] | None:
        summary = self.latest_summary
        if summary is None:
            return None
        return {"fresh": self.summary is not None, "received_age_ms": max(0, now - self.summary_received_at_ms),
                "age_ms": max(0, now - summary.sent_at_ms), "generation": summary.generation,
                "watermark": summary.watermark, "agents": summary.agents,
                "capabilities": {name: capability.model_dump(exclude={"name"})
                                 for name, capability in sorted(summary.capabilities.items())}}

    def _put(self, record: AgentRecord) -> None:
        previous = self.index.put(record)
        if previous is not None:
            self._digest ^= entry_hash(previous.agent_id, previous.version)
        self._digest ^= entry_hash(record.agent_id, record.version)
        self.versions[record.agent_id] = record.version

    def _drop(self, agent_id: str) -> None:
        previous = self.index.remove(agent_id)
        if previous is not None:
            self._digest ^= entry_hash(previous.agent_id, previous.version)


CatalogState = FollowerState  # the catalog's state: NEW → RUNNING ⇄ DISCONNECTED → CLOSED, or FAILED


class PeerCatalog(StreamFollower[FeedEntry]):
    """All peer replicas, nearest first; loads from Redis, then tails the replica feed.

    The ``node.remote.RemoteCatalog`` the router reads; an async context manager.
    ``subscribe`` listeners are called for every applied remote change (including the
    synthetic ones a load or reload produces); they must not block.
    """

    stream_name = "replica feed"

    def __init__(self, store: ReplicaStore, *, peers: Sequence[str], stale_after_ms: int,
                 feed_block_ms: int = 1_000, replicated: Collection[str] | None = None,
                 node_urls: Mapping[str, Sequence[str]] | None = None) -> None:
        """``node_urls``: where each peer's nodes serve (the topology's), named in ``describe()``
        so a console can link to theirs."""
        super().__init__(region=store.region, task_name=f"federation-feed-{store.region}")
        self.store = store
        self.feed_block_ms = feed_block_ms
        self._peers = [PeerReplica(peer, stale_after_ms=stale_after_ms,
                                   replicated=replicated is None or peer in replicated) for peer in peers]
        self._by_region = {peer.region: peer for peer in self._peers}
        self._node_urls = {region: list(urls) for region, urls in (node_urls or {}).items()}

    # -- node.remote.RemoteCatalog -----------------------------------------------------------

    def peers(self) -> Sequence[PeerReplica]:
        return self._peers

    def describe(self) -> list[dict[str, object]]:
        return [{**peer.describe(), "node_urls": self._node_urls.get(peer.region, [])} for peer in self._peers]

    # subscribe(listener) -> unsubscribe: node.view.follower.StreamFollower

    # -- public ------------------------------------------------------------------------------

    def peer(self, region: str) -> PeerReplica:
        """The replica of ``region``; raises KeyError for a region that is not a peer."""
        return self._by_region[region]

    async def reload(self, peers: Sequence[str] | None = None) -> None:
        """Replace the given peers (default: all, and tail the feed on from there) with what Redis holds."""
        if peers is None:
            await super().reload()
            return
        _, changes = await self._load_peers(peers)
        self.reloads += 1
        self._emit(changes)

    # -- used by the consumer (the leader), right after its Redis commit ---------------------

    def committed_changes(self, region: str, events: Sequence[ChangeEvent], *, seen: int, heard_at_ms: int) -> None:
        peer = self._by_region[region]
        applied = [event for event in events if peer.apply_change(event)]
        peer.seen_version = max(peer.seen_version, seen)
        peer.index.version = peer.seen_version
        if applied:  # replays of old records say nothing about the peer being alive now
            peer.hear(heard_at_ms)
        self._emit(applied)

    def committed_beacon(self, region: str, beacon: RegionBeacon, *, heard_at_ms: int) -> None:
        peer = self._by_region[region]
        peer.beacon = beacon
        peer.hear(heard_at_ms)

    def committed_reconcile(self, region: str, *, records: Sequence[AgentRecord], evicted: Sequence[str],
                            watermark: int, floor: int, seen: int, runs: int, at_ms: int) -> None:
        """A reconcile with the snapshot of ``records`` at ``watermark`` committed in Redis: memory
        follows it as Redis did — newer records written, absent ones not newer than it dropped —
        so a replica whose memory lags its Redis heals too."""
        peer = self._by_region[region]
        changes = [event for record in records if (event := peer.put_record(record)) is not None]
        listed = {record.agent_id for record in records}
        gone = {*evicted, *(record.agent_id for record in peer.index if record.agent_id not in listed)}
        changes += [event for agent_id in sorted(gone) if (event := peer.evict(agent_id, watermark)) is not None]
        peer.raise_floor(floor, seen)
        peer.anti_entropy_runs = max(peer.anti_entropy_runs, runs)
        peer.reconciled_at_ms = at_ms
        self._emit(changes)

    # -- the feed (node.view.follower) ------------------------------------------------------------

    async def _load(self) -> tuple[int, list[ChangeEvent]]:
        return await self._load_peers([peer.region for peer in self._peers])

    async def _load_peers(self, names: Sequence[str]) -> tuple[int, list[ChangeEvent]]:
        seq, states = await self.store.load(names)
        changes: list[ChangeEvent] = []
        for name, state in states.items():
            changes += self._by_region[name].replace(state)
        return seq, changes

    async def _read(self, *, after: int) -> list[FeedEntry]:
        return await shielded_read(self.store.read_feed(after_seq=after, block_ms=self.feed_block_ms))

    def _number(self, entry: FeedEntry) -> int:
        return entry.seq

    async def _lost_data(self) -> bool:
        return await self.store.feed_seq() < self.position

    async def _apply(self, entry: FeedEntry) -> list[ChangeEvent]:
        peer = self._by_region.get(entry.peer)
        if peer is None:
            return []  # a peer that is no longer in the topology
        changes: list[ChangeEvent] = []
        try:
            if (entry.type in ("change", "put") and entry.agent_id
                    and peer.covers(entry.agent_id, entry.version, below_floor=entry.type == "change")):
                pass  # applied already (the leader applies its commits directly): skip parsing the body
            elif entry.type == "change" and entry.body:
                event = compat.read_json(ChangeEvent, entry.body)
                if peer.apply_change(event):
                    changes.append(event)
            elif entry.type == "beacon" and entry.body:
                peer.beacon = compat.read_json(RegionBeacon, entry.body)
            elif entry.type == "put" and entry.body:
                if (change := peer.put_record(read_record(entry.body))) is not None:
                    changes.append(change)
            elif entry.type == "evict" and entry.agent_id:
                if (change := peer.evict(entry.agent_id, entry.version)) is not None:
                    changes.append(change)
            elif entry.type == "state":
                peer.raise_floor(entry.floor, entry.seen)
                peer.anti_entropy_runs = max(peer.anti_entropy_runs, entry.runs)
                peer.reconciled_at_ms = entry.at_ms
            elif entry.type == "reload":
                await self.reload([peer.region])
        except ValidationError as exc:
            self.store.quarantine.add("replica", f"{self.store.key_feed}@{entry.seq}",
                                      first_problem(exc).message, agent_id=entry.agent_id)
        peer.seen_version = max(peer.seen_version, entry.seen)
        peer.index.version = peer.seen_version
        peer.hear(entry.at_ms)
        return changes
