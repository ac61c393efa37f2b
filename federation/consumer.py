"""The consumer: reads every peer's topics and applies them to this region's replica.

Manual assignment (no consumer group) of partition 0 of each peer's change topic and beacon topic;
the next offset of a change topic is stored in the consuming region's Redis by the same script
that applies the records, so the offset never runs ahead of the replica and a restart resumes
exactly where it stopped. A beacon topic is read from its last record at every start (only the
latest beacon matters). Tombstones (a null value after a deletion, for compaction) are skipped; so
is a value of a newer schema version than this node reads (counted, logged at most once a
minute: the node is older than its peer and must be upgraded to read it).

A beacon is checked in place, against the replica at exactly the beacon's watermark: one that
arrives before the changes it covers waits (one per peer, the latest) until the change topic
reaches its watermark; if the change topic is read to its end and the watermark is still not
reached, the changes are missing and it counts as a mismatch.
Application is idempotent by version (see ``federation.replica``), so duplicates, replays and
reordering change nothing.

Divergence is detected three ways and healed by anti-entropy (``federation.antientropy``):

* a gap: the peer's versions are consecutive on its topic, so version ``n + 2`` after ``n``
  means records were lost (the broker lost data and the log regrew past our offset, the topic's
  retention dropped them, or the peer's capped change stream was trimmed before publishing);
* a beacon whose watermark was not reached, or whose count/digest differs at that watermark;
* the broker lost data: after every poll each partition's high watermark (from the fetch
  responses) is compared with the applied offset. The embedded broker never answers
  OFFSET_OUT_OF_RANGE — a consumer ahead of a restarted broker's log just waits — so a high
  watermark below ours is the signal: read again from the beginning and reconcile. (Real
  Kafka's out-of-range resets to the earliest offset, and the gap check catches what that
  skipped.)

A region's first consumer bootstraps each peer: it notes the topic's end offset, then pulls the
peer's snapshot and stores that offset with the reconcile, so nothing between the two is missed.
If the peer's node cannot be reached it reads the topic from the beginning instead.

Runs as a leader duty: one consumer per region at a time.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from node.core import StoreUnavailable, now_ms, run_together

from .antientropy import AntiEntropy
from .config import FederationConfig
from .errors import BrokerUnavailable, InvalidMessage, NewerSchema, SnapshotUnavailable
from .events import FederationMessage, RegionBeacon
from .kafka import PARTITION, ensure_topics, make_consumer
from .replica import PeerCatalog
from .replica_store import ReplicaStore

log = logging.getLogger(__name__)

_POLL_TIMEOUT_MS = 200
_NEWER_SCHEMA_LOG_INTERVAL_S = 60.0


class ConsumerState(enum.Enum):
    IDLE = "idle"
    CONNECTING = "connecting"
    CONSUMING = "consuming"
    BACKING_OFF = "backing_off"


@dataclass(slots=True)
class ConsumerStats:
    records: int = 0
    applied: int = 0
    invalid: int = 0
    gaps: int = 0
    beacon_mismatches: int = 0
    broker_data_losses: int = 0
    tombstones: int = 0
    newer_schema: int = 0
    failures: int = 0
    last_error: str | None = None


@dataclass(slots=True)
class _Pending:
    """A peer's beacon read before the changes it covers."""

    beacon: RegionBeacon
    since_s: float  # time.monotonic() when a beacon of this peer started waiting


class Consumer:
    """Applies the peers' topics to the replica; ``run()`` is the leader duty."""

    def __init__(self, config: FederationConfig, *, catalog: PeerCatalog, replica_store: ReplicaStore,
                 anti_entropy: AntiEntropy) -> None:
        self.config = config
        self.catalog = catalog
        self.replica_store = replica_store
        self.anti_entropy = anti_entropy
        self.state = ConsumerState.IDLE
        self.stats = ConsumerStats()
        # Change topics of the replicated peers only: a summary-only peer's beacons still say it is alive.
        self.partitions = {TopicPartition(config.topic(peer.region), PARTITION): peer.region
                           for peer in config.replicated_peers}
        self.beacon_partitions = {TopicPartition(config.beacon_topic(peer.region), PARTITION): peer.region
                                  for peer in config.peers}
        self.change_partition = {peer: partition for partition, peer in self.partitions.items()}
        self.next_offsets: dict[TopicPartition, int] = {}
        self.highwaters: dict[TopicPartition, int] = {}
        self.last_change_at_ms: dict[str, int] = {}  # per peer: when the newest change applied happened there
        self._beacon_offsets: dict[TopicPartition, int] = {}
        self._pending: dict[str, _Pending] = {}
        # A beacon ahead of a change topic read to its end has lost its changes after this long.
        self._pending_grace_s = max(0.2, 5 * config.fetch_max_wait_ms / 1000)
        self._newer_logged_s = -_NEWER_SCHEMA_LOG_INTERVAL_S
        self._backoff_ms = config.retry_backoff_ms

    @staticmethod
    def offset_name(partition: TopicPartition) -> str:
        return f"{partition.topic}:{partition.partition}"

    async def run(self) -> None:
        """Consume until cancelled, with the anti-entropy worker beside it."""
        await self.catalog.wait_loaded()
        async with self.anti_entropy:
            await run_together({f"anti-entropy-{self.config.region}": self.anti_entropy.run(),
                                f"consumer-{self.config.region}": self._consume()})

    async def _consume(self) -> None:
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                self.state = ConsumerState.IDLE
                raise
            except (KafkaError, BrokerUnavailable, StoreUnavailable) as exc:
                self.stats.failures += 1
                self.stats.last_error = repr(exc)
                self.state = ConsumerState.BACKING_OFF
                log.warning("region %s: consumer paused (%s); retrying in %d ms", self.config.region, exc,
                            self._backoff_ms)
                await asyncio.sleep(self._backoff_ms / 1000)
                self._backoff_ms = min(self.config.max_backoff_ms, self._backoff_ms * 2)

    async def _session(self) -> None:
        if not self.beacon_partitions:
            await asyncio.Event().wait()  # a region without peers has nothing to read
        self.state = ConsumerState.CONNECTING
        assigned = [*self.partitions, *self.beacon_partitions]
        await ensure_topics(self.config, [partition.topic for partition in assigned])
        consumer = make_consumer(self.config)
        try:
            await consumer.start()
            consumer.assign(assigned)
            stored = await self.replica_store.offsets()
            for partition, peer in self.partitions.items():
                offset = stored.get(self.offset_name(partition))
                if offset is None:
                    offset = await self._bootstrap(consumer, partition, peer)
                consumer.seek(partition, offset)
                self.next_offsets[partition] = offset
            for partition in self.beacon_partitions:
                start = (await consumer.beginning_offsets([partition]))[partition]
                end = (await consumer.end_offsets([partition]))[partition]
                self._beacon_offsets[partition] = max(start, end - 1)  # the latest beacon
                consumer.seek(partition, self._beacon_offsets[partition])
            self._pending.clear()
            self.state = ConsumerState.CONSUMING
            self._backoff_ms = self.config.retry_backoff_ms
            while True:
                batches = await consumer.getmany(*assigned, timeout_ms=_POLL_TIMEOUT_MS,
                                                 max_records=self.config.consume_batch_max)
                for partition, records in batches.items():
                    if records and partition in self.partitions:
                        await self._apply(partition, records)
                    elif records:
                        await self._beacons(partition, records)
                await self._check_loss(consumer)
                await self._check_pending()
        finally:
            try:
                await consumer.stop()
            except KafkaError:
                pass

    async def _bootstrap(self, consumer: AIOKafkaConsumer, partition: TopicPartition, peer: str) -> int:
        """First start: the peer's snapshot plus the topic's end offset noted before taking it."""
        end = (await consumer.end_offsets([partition]))[partition]
        try:
            await self.anti_entropy.sync(peer, reason="bootstrap", offset=(self.offset_name(partition), end))
            return end
        except SnapshotUnavailable as exc:
            start = (await consumer.beginning_offsets([partition]))[partition]
            log.warning("region %s: cannot bootstrap from %s's snapshot (%s); reading its topic from offset %d "
                        "and pulling the snapshot again", self.config.region, peer, exc, start)
            # The topic may no longer hold the peer's whole history (retention): the snapshot is
            # still wanted, so the pull is retried (every anti_entropy_min_interval_ms) until it lands.
            self.anti_entropy.request(peer, "bootstrap retry")
            return start

    async def _apply(self, partition: TopicPartition, records: Sequence[ConsumerRecord]) -> None:
        """Apply one change partition's records, committing at each beacon so it is checked in place
        (a waiting beacon from the beacon topic, or one a publisher of schema 1 put among the changes)."""
        peer = self.partitions[partition]
        replica = self.catalog.peer(peer)
        seen = replica.seen_version
        segment: list[FederationMessage] = []
        self.stats.records += len(records)
        for position, record in enumerate(records):
            message = self._decode(partition, record)
            if message is not None and message.beacon is not None and _replayed(message.beacon, replica.beacon):
                message = None  # an old beacon read again (replay, or re-reading after data loss)
            beacon = message.beacon if message is not None else None
            in_place = beacon is not None  # a schema-1 publisher's beacon, after the changes it covers
            if message is not None:
                if message.change is not None:
                    version = message.change.version
                    if version > seen + 1:
                        self.stats.gaps += 1
                        self.anti_entropy.request(peer, f"gap: version {version} after {seen}")
                    seen = max(seen, version)
                segment.append(message)
                pending = self._pending.get(peer)
                if message.change is not None and pending is not None and seen >= pending.beacon.watermark:
                    del self._pending[peer]
                    beacon = pending.beacon
                    segment.append(FederationMessage.of_beacon(beacon))
            if position == len(records) - 1 or beacon is not None:
                await self._commit(peer, partition, segment, next_offset=record.offset + 1)
                if beacon is not None and (in_place or beacon.watermark == seen):
                    self._check_beacon(peer, beacon)
                segment = []

    async def _beacons(self, partition: TopicPartition, records: Sequence[ConsumerRecord]) -> None:
        """A peer's beacons: each is checked when the replica is at its watermark (now, or once
        the change topic gets there); one the replica is past already only says the peer is alive,
        unless its watermark is below the last beacon's — then the peer's versions went back."""
        peer = self.beacon_partitions[partition]
        replica = self.catalog.peer(peer)
        for record in records:
            self._beacon_offsets[partition] = record.offset + 1
            message = self._decode(partition, record)
            if message is None:
                continue
            beacon = message.beacon
            if beacon is None:
                self._invalid(partition, record, InvalidMessage(f"a change on the beacon topic of {peer}"))
                continue
            pending = self._pending.get(peer)
            if _replayed(beacon, replica.beacon) or (pending is not None and _replayed(beacon, pending.beacon)):
                continue
            if peer not in self.change_partition:  # summary-only: nothing to check the beacon against
                await self._commit(peer, None, [message], next_offset=0)
                continue
            if beacon.watermark > replica.seen_version:
                self._pending[peer] = _Pending(beacon, pending.since_s if pending is not None else time.monotonic())
                continue
            self._pending.pop(peer, None)
            went_back = replica.beacon is not None and beacon.watermark < replica.beacon.watermark
            await self._commit_beacon(peer, beacon)
            if beacon.watermark == replica.seen_version or went_back:
                self._check_beacon(peer, beacon)

    async def _check_pending(self) -> None:
        """A waiting beacon whose watermark the change topic, read to its end, did not reach: the
        changes between are missing (checked after a grace, as the two topics are fetched apart)."""
        for peer, pending in list(self._pending.items()):
            partition = self.change_partition[peer]
            replica = self.catalog.peer(peer)
            highwater = self.highwaters.get(partition)
            caught_up = highwater is not None and self.next_offsets.get(partition, 0) >= highwater
            reached = replica.seen_version >= pending.beacon.watermark  # e.g. by anti-entropy
            if not reached and not (caught_up and time.monotonic() - pending.since_s >= self._pending_grace_s):
                continue
            del self._pending[peer]
            await self._commit_beacon(peer, pending.beacon)
            if replica.seen_version <= pending.beacon.watermark:
                self._check_beacon(peer, pending.beacon)

    async def _commit_beacon(self, peer: str, beacon: RegionBeacon) -> None:
        partition = self.change_partition[peer]
        await self._commit(peer, partition, [FederationMessage.of_beacon(beacon)],
                           next_offset=self.next_offsets.get(partition, 0))

    def _decode(self, partition: TopicPartition, record: ConsumerRecord) -> FederationMessage | None:
        """The record's message; None for a tombstone, a newer schema or a value that does not parse."""
        if record.value is None:
            self.stats.tombstones += 1  # written for compaction after a deletion the change carried
            return None
        peer = self.partitions.get(partition) or self.beacon_partitions[partition]
        try:
            message = FederationMessage.decode(record.value)
            if message.region != peer:
                raise InvalidMessage(f"a message of region {message.region} on the topic of {peer}")
        except NewerSchema as exc:
            self.stats.newer_schema += 1
            now = time.monotonic()
            if now - self._newer_logged_s >= _NEWER_SCHEMA_LOG_INTERVAL_S:
                self._newer_logged_s = now
                log.warning("region %s: skipped %s@%d (and any more such within a minute): %s", self.config.region,
                            partition.topic, record.offset, exc)
            return None
        except InvalidMessage as exc:
            self._invalid(partition, record, exc)
            return None
        return message

    def _invalid(self, partition: TopicPartition, record: ConsumerRecord, exc: InvalidMessage) -> None:
        self.stats.invalid += 1
        self.replica_store.quarantine.add("kafka", f"{partition.topic}@{record.offset}", exc)

    async def _commit(self, peer: str, partition: TopicPartition | None, messages: list[FederationMessage], *,
                      next_offset: int) -> None:
        at = now_ms()
        offset = (self.offset_name(partition), next_offset) if partition is not None else None
        async with self.replica_store.committing(peer):  # in memory in Redis's order (anti-entropy too)
            result = await self.replica_store.apply(peer, messages, now_ms=at, offset=offset)
            if partition is not None:
                self.next_offsets[partition] = next_offset
            applied = [messages[number - 1] for number in result.applied]
            changes = [message.change for message in applied if message.change is not None]
            if changes:
                self.last_change_at_ms[peer] = max(self.last_change_at_ms.get(peer, 0), *(c.at_ms for c in changes))
            self.catalog.committed_changes(peer, changes, seen=result.seen, heard_at_ms=at)
            for message in applied:
                if message.beacon is not None:
                    self.catalog.committed_beacon(peer, message.beacon, heard_at_ms=at)
        self.stats.applied += len(changes)

    def _check_beacon(self, peer: str, beacon: RegionBeacon) -> None:
        replica = self.catalog.peer(peer)
        if beacon.watermark > replica.seen_version:
            reason = f"beacon at version {beacon.watermark}, replica read only up to {replica.seen_version}"
        elif beacon.watermark < replica.seen_version:
            reason = f"beacon at version {beacon.watermark}, below the {replica.seen_version} already read"
        elif beacon.digest is not None and (beacon.live_count != len(replica.index) or beacon.digest != replica.digest):
            reason = (f"at version {beacon.watermark} the peer has {beacon.live_count} agents (digest "
                      f"{beacon.digest}), the replica {len(replica.index)} ({replica.digest})")
        else:
            return
        self.stats.beacon_mismatches += 1
        self.anti_entropy.request(peer, reason)

    async def _check_loss(self, consumer: AIOKafkaConsumer) -> None:
        """A partition's high watermark below the applied offset means the broker lost data.

        The high watermark of the last fetch response is used, not ``end_offsets()``: the
        embedded broker's ListOffsets answers the base offset of the last batch + 1, which
        under load lags the records already fetched.
        """
        for partition in self.beacon_partitions:
            highwater = consumer.highwater(partition)
            if highwater is not None and highwater < self._beacon_offsets.get(partition, 0):
                start = (await consumer.beginning_offsets([partition]))[partition]
                consumer.seek(partition, start)  # the broker lost the beacons: read what it has now
                self._beacon_offsets[partition] = start
        for partition, peer in self.partitions.items():
            highwater = consumer.highwater(partition)
            ours = self.next_offsets.get(partition, 0)
            if highwater is not None:
                self.highwaters[partition] = highwater
            if highwater is None or highwater >= ours:
                continue
            self.stats.broker_data_losses += 1
            start = (await consumer.beginning_offsets([partition]))[partition]
            log.warning("region %s: %s ends at offset %d, below the %d already applied: the broker lost data; "
                        "reading again from offset %d and reconciling with %s", self.config.region,
                        partition.topic, highwater, ours, start, peer)
            consumer.seek(partition, start)
            self.next_offsets[partition] = start
            await self.replica_store.set_offset(self.offset_name(partition), start)
            self.anti_entropy.request(peer, f"the broker lost data of {partition.topic}")


def _replayed(beacon: RegionBeacon, current: RegionBeacon | None) -> bool:
    """An older beacon than the one held: sent earlier and covering no more (a restarted peer's
    history has a lower watermark but a later send time, so it is not mistaken for a replay)."""
    return current is not None and beacon.sent_at_ms <= current.sent_at_ms and beacon.watermark <= current.watermark
