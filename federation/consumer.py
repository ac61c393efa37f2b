"""The consumer: reads every peer's topic and applies it to this region's replica.

Manual assignment (no consumer group) of partition 0 of each peer topic; the next offset to read
is stored in the consuming region's Redis by the same script that applies the records, so the
offset never runs ahead of the replica and a restart resumes exactly where it stopped.
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
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from node.clock import now_ms
from node.errors import StoreUnavailable

from .antientropy import AntiEntropy
from .config import FederationConfig
from .errors import BrokerUnavailable, InvalidMessage, SnapshotUnavailable
from .events import FederationMessage, RegionBeacon
from .kafka import PARTITION, ensure_topics, make_consumer
from .replica import PeerCatalog
from .replica_store import ReplicaStore

log = logging.getLogger(__name__)

_POLL_TIMEOUT_MS = 200


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
    failures: int = 0
    last_error: str | None = None


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
        self.partitions = {TopicPartition(config.topic(peer.region), PARTITION): peer.region for peer in config.peers}
        self.next_offsets: dict[TopicPartition, int] = {}
        self._backoff_ms = config.retry_backoff_ms

    @staticmethod
    def offset_name(partition: TopicPartition) -> str:
        return f"{partition.topic}:{partition.partition}"

    async def run(self) -> None:
        """Consume until cancelled, with the anti-entropy worker beside it."""
        await self.catalog.wait_loaded()
        async with self.anti_entropy, asyncio.TaskGroup() as tasks:
            tasks.create_task(self.anti_entropy.run(), name=f"anti-entropy-{self.config.region}")
            tasks.create_task(self._consume(), name=f"consumer-{self.config.region}")

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
        if not self.partitions:
            await asyncio.Event().wait()  # a region without peers has nothing to read
        self.state = ConsumerState.CONNECTING
        await ensure_topics(self.config, [partition.topic for partition in self.partitions])
        consumer = make_consumer(self.config)
        try:
            await consumer.start()
            consumer.assign(list(self.partitions))
            stored = await self.replica_store.offsets()
            for partition, peer in self.partitions.items():
                offset = stored.get(self.offset_name(partition))
                if offset is None:
                    offset = await self._bootstrap(consumer, partition, peer)
                consumer.seek(partition, offset)
                self.next_offsets[partition] = offset
            self.state = ConsumerState.CONSUMING
            self._backoff_ms = self.config.retry_backoff_ms
            while True:
                batches = await consumer.getmany(*self.partitions, timeout_ms=_POLL_TIMEOUT_MS,
                                                 max_records=self.config.consume_batch_max)
                for partition, records in batches.items():
                    if records:
                        await self._apply(partition, records)
                await self._check_loss(consumer)
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
            log.warning("region %s: cannot bootstrap from %s's snapshot (%s); reading its topic from offset %d",
                        self.config.region, peer, exc, start)
            return start

    async def _apply(self, partition: TopicPartition, records: Sequence[ConsumerRecord]) -> None:
        """Apply one partition's records, committing at each beacon so it is checked in place."""
        peer = self.partitions[partition]
        replica = self.catalog.peer(peer)
        seen = replica.seen_version
        segment: list[FederationMessage] = []
        self.stats.records += len(records)
        for position, record in enumerate(records):
            try:
                message = FederationMessage.decode(record.value)
                if message.region != peer:
                    raise InvalidMessage(f"a message of region {message.region} on the topic of {peer}")
            except InvalidMessage as exc:
                self.stats.invalid += 1
                self.replica_store.quarantine.add("kafka", f"{partition.topic}@{record.offset}", exc)
                message = None
            if message is not None and message.beacon is not None and _replayed(message.beacon, replica.beacon):
                message = None  # an old beacon read again (replay, or re-reading after data loss)
            if message is not None:
                if message.change is not None:
                    version = message.change.version
                    if version > seen + 1:
                        self.stats.gaps += 1
                        self.anti_entropy.request(peer, f"gap: version {version} after {seen}")
                    seen = max(seen, version)
                segment.append(message)
            if position == len(records) - 1 or (message is not None and message.beacon is not None):
                await self._commit(peer, partition, segment, next_offset=record.offset + 1)
                if message is not None and message.beacon is not None:
                    self._check_beacon(peer, message.beacon)
                segment = []

    async def _commit(self, peer: str, partition: TopicPartition, messages: list[FederationMessage], *,
                      next_offset: int) -> None:
        at = now_ms()
        result = await self.replica_store.apply(peer, messages, now_ms=at,
                                                offset=(self.offset_name(partition), next_offset))
        self.next_offsets[partition] = next_offset
        applied = [messages[number - 1] for number in result.applied]
        changes = [message.change for message in applied if message.change is not None]
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
        for partition, peer in self.partitions.items():
            highwater = consumer.highwater(partition)
            ours = self.next_offsets.get(partition, 0)
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
