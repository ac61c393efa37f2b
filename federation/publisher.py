"""The publisher: drains this region's change stream to its Kafka topic, and sends beacons.

Transactional outbox: a change is in the region's Redis stream the moment it happened; the
publisher reads the stream after its acknowledged position, sends the entries to
``{prefix}.changes.{region}`` (key = agent_id, the single partition; a deletion is followed by a
null-value tombstone for the agent, so the topic can be compacted) and only once Kafka has
acknowledged every one of them moves the position (``…:fed:published`` in the region's Redis).
While Kafka is down nothing moves: the backlog waits in the stream and goes out in order when
the broker is back — and a crash between send and acknowledgement only causes duplicates,
which consumers skip by version.

Every ``beacon_interval_ms`` the publisher reads the region's version ``V``, sends every
change up to exactly ``V`` and then a :class:`RegionBeacon` for ``V`` with the count and digest
of its agents (no digest while a passed lease awaits the sweeper), so on the topic a beacon
follows precisely the changes it covers — on its own topic ``{prefix}.beacons.{region}``,
sent only once those changes were acknowledged. The digest is tracked from the changes it sends
(``federation.digest.DigestTracker``), so a beacon costs two Redis reads, not a region scan.
Before each beacon it re-creates the topic if the broker lost it (a restarted memory-only
broker forgets its topics, and clients would otherwise write to ghost partitions that vanish
when the topic is created again).

Runs as a leader duty: one publisher per region at a time.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from node.core import StoreUnavailable, now_ms
from node.core.models import ChangeEvent, ChangeKind
from node.store import RegionStore

from .config import FederationConfig
from .digest import DigestTracker, read_region_state
from .errors import BrokerUnavailable
from .events import FederationMessage, RegionBeacon
from .kafka import PARTITION, ensure_topics, make_producer
from .replica_store import ReplicaStore, shielded_read

log = logging.getLogger(__name__)

# The tracked digest is checked against a full read of the region this often (a safety net:
# with consecutive changes it cannot drift, but a wrong digest would make every peer pull
# snapshots until it is right).
FULL_DIGEST_EVERY_BEACONS = 60


class PublisherState(enum.Enum):
    IDLE = "idle"
    CONNECTING = "connecting"
    PUBLISHING = "publishing"
    BACKING_OFF = "backing_off"


@dataclass(slots=True)
class PublisherStats:
    published: int = 0
    beacons: int = 0
    failures: int = 0
    topic_recreated: int = 0
    tombstones: int = 0
    position: int = 0
    last_error: str | None = None


class Publisher:
    """Publishes one region's changes and beacons; ``run()`` is the leader duty."""

    def __init__(self, config: FederationConfig, *, store: RegionStore, replica_store: ReplicaStore) -> None:
        self.config = config
        self.store = store
        self.replica_store = replica_store
        self.topic = config.topic(config.region)
        self.beacon_topic = config.beacon_topic(config.region)
        self.state = PublisherState.IDLE
        self.stats = PublisherStats()
        self._backoff_ms = config.retry_backoff_ms
        self.digest = DigestTracker()
        self._beacons_since_full_read = 0

    async def run(self) -> None:
        """Publish until cancelled; Kafka or Redis outages are logged and retried with a backoff."""
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                self.state = PublisherState.IDLE
                raise
            except (KafkaError, BrokerUnavailable, StoreUnavailable) as exc:
                self.stats.failures += 1
                self.stats.last_error = repr(exc)
                self.state = PublisherState.BACKING_OFF
                log.warning("region %s: publisher paused (%s); position %d, retrying in %d ms", self.config.region,
                            exc, self.stats.position, self._backoff_ms)
                await asyncio.sleep(self._backoff_ms / 1000)
                self._backoff_ms = min(self.config.max_backoff_ms, self._backoff_ms * 2)

    async def _session(self) -> None:
        self.state = PublisherState.CONNECTING
        producer = make_producer(self.config)
        try:
            await producer.start()
            await ensure_topics(self.config, [self.topic, self.beacon_topic])
            position = await self.replica_store.published_position()
            self.stats.position = position
            self.state = PublisherState.PUBLISHING
            self._backoff_ms = self.config.retry_backoff_ms
            log.info("region %s: publishing to %s from version %d", self.config.region, self.topic, position)
            next_beacon = 0.0
            while True:
                if time.monotonic() >= next_beacon:
                    position = await self._beacon(producer, position)
                    next_beacon = time.monotonic() + self.config.beacon_interval_ms / 1000
                block_ms = max(1, int((next_beacon - time.monotonic()) * 1000))
                events = await shielded_read(self.store.read_changes(
                    after_version=position, block_ms=block_ms, count=self.config.publish_batch_max))
                if events:
                    position = await self._publish(producer, events)
        finally:
            try:
                await producer.stop()
            except KafkaError:
                pass

    async def _publish(self, producer: AIOKafkaProducer, events: Sequence[ChangeEvent]) -> int:
        """Send ``events`` and move the position once Kafka acknowledged all of them."""
        futures = []
        tombstones = 0
        for event in events:
            message = FederationMessage.of_change(event)
            futures.append(await producer.send(self.topic, message.encode(), key=message.key(), partition=PARTITION,
                                               headers=message.headers()))
            if event.kind is ChangeKind.DELETE:  # compaction drops the key once the tombstone is the last value
                futures.append(await producer.send(self.topic, None, key=message.key(), partition=PARTITION))
                tombstones += 1
        results = await asyncio.gather(*futures, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise BrokerUnavailable(f"Kafka did not acknowledge a change of region {self.config.region}: "
                                        f"{result!r}") from result
        position = events[-1].version
        await self.replica_store.set_published(position)
        for event in events:
            self.digest.advance(event)
        self.stats.published += len(events)
        self.stats.tombstones += tombstones
        self.stats.position = position
        return position

    async def _beacon(self, producer: AIOKafkaProducer, position: int) -> int:
        """Send everything up to the current version ``V``, then the beacon for ``V``."""
        created = await ensure_topics(self.config, [self.topic, self.beacon_topic])
        if created:
            self.stats.topic_recreated += 1
            log.warning("region %s: topics %s were missing (the broker lost its data); re-created them — peers "
                        "re-sync by anti-entropy", self.config.region, ", ".join(created))
        watermark = await self.store.version()
        if watermark < position:
            # The region's Redis lost its data and its versions started again: publish its new
            # history from the start (peers see the lower watermark and replace their replica).
            log.warning("region %s: version %d is below the %d already published: the region's Redis lost data; "
                        "publishing its new history", self.config.region, watermark, position)
            position = 0
            await self.replica_store.set_published(0)
            self.digest = DigestTracker()
        if self.digest.version < 0 or self._beacons_since_full_read >= FULL_DIGEST_EVERY_BEACONS:
            self.digest.reset(await read_region_state(self.store))
            self._beacons_since_full_read = 0
            watermark = max(watermark, self.digest.version)
        position = await self._drain_to(producer, position, watermark)
        if self.digest.version != watermark:
            # A change did not follow on (trimmed from the stream before it was published).
            self.digest.reset(await read_region_state(self.store))
            watermark = self.digest.version
            position = await self._drain_to(producer, position, watermark)
        self._beacons_since_full_read += 1
        at = now_ms()
        passed = await self._passed_leases(at)
        live = len(self.digest.versions) - passed
        beacon = RegionBeacon(region=self.config.region, watermark=watermark, live_count=max(0, live),
                              digest=self.digest.digest if passed == 0 else None, sent_at_ms=at)
        message = FederationMessage.of_beacon(beacon)
        try:
            await producer.send_and_wait(self.beacon_topic, message.encode(), key=message.key(), partition=PARTITION,
                                         headers=message.headers())
        except KafkaError as exc:
            raise BrokerUnavailable(f"Kafka did not acknowledge the beacon of {self.config.region}: {exc!r}") from exc
        self.stats.beacons += 1
        return position

    async def _drain_to(self, producer: AIOKafkaProducer, position: int, watermark: int) -> int:
        """Publish every change after ``position`` up to exactly ``watermark``."""
        while position < watermark:
            events = await self.store.read_changes(after_version=position,
                                                   count=min(self.config.publish_batch_max, watermark - position))
            events = [event for event in events if event.version <= watermark]
            if not events:
                # Trimmed from the capped stream before it was published: peers see the gap
                # in versions and heal it by anti-entropy.
                log.warning("region %s: changes %d..%d left the change stream before they were published",
                            self.config.region, position + 1, watermark)
                await self.replica_store.set_published(watermark)
                return watermark
            position = await self._publish(producer, events)
        return position

    async def _passed_leases(self, at_ms: int) -> int:
        """Agents whose lease has passed but whose expiry the sweeper has not written yet."""
        return await self.store.passed_lease_count(now_ms=at_ms)
