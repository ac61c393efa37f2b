"""Region summaries: load stays home, peers learn each capability's health and capacity instead.

The leader's :class:`SummaryPublisher` (a leader duty) sends, every ``summary_interval_ms``, a
:class:`~node.core.models.RegionSummary` of its own region to ``{prefix}.summaries.{region}``: per
capability the agents offering it, the routable ones (leased, live, ready, a routing status),
their summed weight × status factor, summed inflight + queued and summed capacity, and the
versions they offer. It is computed from the leader's cache (``node.cache``), whose records
carry live load; :class:`SummaryBuilder` keeps each capability's figures and recomputes only
those whose index generation moved (or whose earliest lease may have passed), so a region of
10,000 agents in 100 capabilities costs a few milliseconds per summary when every capability
changed and next to nothing when few did. A summary bigger than :data:`MAX_PART_BYTES` is
split into parts of one generation (each a message well under Kafka's 1 MB).

:class:`SummaryReader` runs on every replica of every region (not only the leader): it reads
the peers' summary topics from their last records at start and keeps the latest complete
generation of each peer in memory (``PeerReplica.summary``). Summaries are soft state replaced
every second: storing them in Redis for the other replicas would add a script and a feed entry
per summary per peer and buy nothing a one-fetch read of the topic's tail does not give a
restarted replica — and each replica judges a summary's age by what it read itself.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from node.core import cancel_and_wait, now_ms
from node.core.models import AgentRecord, CapabilitySummary, RegionSummary, SummaryView
from node.routing import DEFAULT_CAPACITY, STATUS_FACTORS, capability_of
from node.view import AgentIndex

from .config import FederationConfig
from .errors import BrokerUnavailable, InvalidMessage, NewerSchema
from .events import FederationMessage
from .kafka import PARTITION, ensure_topics, make_consumer, make_producer
from .replica import PeerCatalog

log = logging.getLogger(__name__)

__all__ = ["MAX_PART_BYTES", "SummaryBuilder", "SummaryPublisher", "SummaryReader", "summary_parts"]

MAX_PART_BYTES = 256 * 1024  # of capabilities' JSON per message: far below Kafka's 1 MB default
READ_BACK_RECORDS = 64  # records read back from a summary topic's end at start: a whole generation
_POLL_TIMEOUT_MS = 200
MAX_TIME_MS = 2**62


@dataclass(slots=True)
class _Kept:
    generation: int
    min_lease_ms: int
    summary: CapabilitySummary


class SummaryBuilder:
    """The per-capability figures of an index, recomputed only for capabilities that changed."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}
        self.recomputed = 0  # capabilities recomputed by the last build

    def build(self, index: AgentIndex, *, lease_horizon_ms: int) -> list[CapabilitySummary]:
        """Every capability of ``index``; a lease ending at or before ``lease_horizon_ms`` has passed."""
        kept: dict[str, _Kept] = {}
        recomputed = 0
        for name, holders in index.by_capability.items():
            generation = index.capability_generation.get(name, 0)
            held = self._kept.get(name)
            if held is None or held.generation != generation or lease_horizon_ms >= held.min_lease_ms:
                summary, min_lease = summarize(name, holders.values(), lease_horizon_ms=lease_horizon_ms)
                held = _Kept(generation, min_lease, summary)
                recomputed += 1
            kept[name] = held
        self._kept = kept
        self.recomputed = recomputed
        return [held.summary for held in kept.values()]


def summarize(name: str, records: Iterable[AgentRecord], *, lease_horizon_ms: int) -> tuple[CapabilitySummary, int]:
    """The summary of capability ``name`` over ``records`` and the earliest lease among its healthy ones."""
    total = healthy = load = capacity = 0
    weight = 0.0
    min_lease = MAX_TIME_MS
    versions: dict[str, int] = {}
    for record in records:
        total += 1
        if record.lease_expires_at_ms <= lease_horizon_ms or not record.routable_state:
            continue
        healthy += 1
        weight += record.weight * STATUS_FACTORS[record.status]
        load += record.load.inflight + record.load.queued
        capacity += record.max_concurrency or DEFAULT_CAPACITY
        min_lease = min(min_lease, record.lease_expires_at_ms)
        offered = capability_of(record, name)
        version = offered.version if offered is not None else "1"
        versions[version] = versions.get(version, 0) + 1
    return CapabilitySummary.model_construct(name=name, total=total, healthy=healthy, weight=weight, load=load,
                                             capacity=capacity, versions=versions), min_lease


def summary_parts(region: str, capabilities: Sequence[CapabilitySummary], *, watermark: int, agents: int,
                  generation: int, sent_at_ms: int, max_part_bytes: int = MAX_PART_BYTES) -> list[RegionSummary]:
    """One generation's messages: the capabilities in parts of at most ``max_part_bytes`` of JSON each."""
    groups: list[list[CapabilitySummary]] = [[]]
    size = 0
    for capability in capabilities:
        length = len(capability.model_dump_json()) + 1
        if groups[-1] and size + length > max_part_bytes:
            groups.append([])
            size = 0
        groups[-1].append(capability)
        size += length
    return [RegionSummary(region=region, watermark=watermark, sent_at_ms=sent_at_ms, generation=generation,
                          part=number, parts=len(groups), agents=agents, capabilities=group)
            for number, group in enumerate(groups)]


class SummaryState(enum.Enum):
    IDLE = "idle"
    CONNECTING = "connecting"
    RUNNING = "running"
    BACKING_OFF = "backing_off"


@dataclass(slots=True)
class SummaryStats:
    sent: int = 0  # generations sent
    parts: int = 0  # messages of the last generation
    failures: int = 0
    last_build_ms: float = 0.0
    last_recomputed: int = 0
    last_error: str | None = None


class SummaryPublisher:
    """Sends this region's summary every ``summary_interval_ms``; ``run()`` is a leader duty.

    ``index`` returns the region's index (the node's cache) and ``lease_horizon_ms`` the instant
    before which leases have certainly passed (``RegionCache.routable_now_ms``).
    """

    def __init__(self, config: FederationConfig, *, index: Callable[[], AgentIndex],
                 lease_horizon_ms: Callable[[], int]) -> None:
        self.config = config
        self.index = index
        self.lease_horizon_ms = lease_horizon_ms
        self.topic = config.summary_topic(config.region)
        self.builder = SummaryBuilder()
        self.state = SummaryState.IDLE
        self.stats = SummaryStats()
        self._backoff_ms = config.retry_backoff_ms

    async def run(self) -> None:
        """Publish until cancelled; Kafka outages are logged and retried with a backoff."""
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                self.state = SummaryState.IDLE
                raise
            except (KafkaError, BrokerUnavailable) as exc:
                self.stats.failures += 1
                self.stats.last_error = repr(exc)
                self.state = SummaryState.BACKING_OFF
                log.warning("region %s: summaries paused (%s); retrying in %d ms", self.config.region, exc,
                            self._backoff_ms)
                await asyncio.sleep(self._backoff_ms / 1000)
                self._backoff_ms = min(self.config.max_backoff_ms, self._backoff_ms * 2)

    def parts(self) -> list[RegionSummary]:
        """The summary of the region now (timed into ``stats.last_build_ms``)."""
        started = time.perf_counter()
        index = self.index()
        capabilities = self.builder.build(index, lease_horizon_ms=self.lease_horizon_ms())
        at = now_ms()
        parts = summary_parts(self.config.region, capabilities, watermark=index.version, agents=len(index),
                              generation=at, sent_at_ms=at)
        self.stats.last_build_ms = (time.perf_counter() - started) * 1000
        self.stats.last_recomputed = self.builder.recomputed
        return parts

    async def _session(self) -> None:
        self.state = SummaryState.CONNECTING
        producer = make_producer(self.config)
        try:
            await producer.start()
            await ensure_topics(self.config, [self.topic])
            self.state = SummaryState.RUNNING
            self._backoff_ms = self.config.retry_backoff_ms
            while True:
                started = time.monotonic()
                parts = self.parts()
                futures = []
                for part in parts:
                    message = FederationMessage.of_summary(part)
                    futures.append(await producer.send(self.topic, message.encode(), key=message.key(),
                                                       partition=PARTITION, headers=message.headers()))
                for result in await asyncio.gather(*futures, return_exceptions=True):
                    if isinstance(result, BaseException):
                        raise BrokerUnavailable(f"Kafka did not acknowledge the summary of {self.config.region}: "
                                                f"{result!r}") from result
                self.stats.sent += 1
                self.stats.parts = len(parts)
                elapsed = time.monotonic() - started
                await asyncio.sleep(max(0.0, self.config.summary_interval_ms / 1000 - elapsed))
        finally:
            try:
                await producer.stop()
            except KafkaError:
                pass


class _Assembly:
    """The parts of a peer's summary generations read so far (the newest complete one wins)."""

    def __init__(self) -> None:
        self.pending: dict[int, dict[int, RegionSummary]] = {}

    def add(self, part: RegionSummary) -> SummaryView | None:
        """A complete generation's view once ``part`` completes it, else None."""
        parts = self.pending.setdefault(part.generation, {})
        parts[part.part] = part
        if len(parts) < part.parts:
            return None
        try:
            view = SummaryView.of(list(parts.values()))
        except ValueError:
            view = None  # parts that disagree on their count: wait for a generation that agrees
        # A complete generation supersedes every older one still incomplete.
        self.pending = {generation: held for generation, held in self.pending.items() if generation > part.generation}
        return view


@dataclass(slots=True)
class ReaderStats:
    records: int = 0
    applied: int = 0  # complete generations applied
    invalid: int = 0
    failures: int = 0
    last_error: str | None = None


class SummaryReader:
    """Reads every peer's summary topic into the catalog (every replica); an async context manager."""

    def __init__(self, config: FederationConfig, *, catalog: PeerCatalog) -> None:
        self.config = config
        self.catalog = catalog
        self.partitions = {TopicPartition(config.summary_topic(peer.region), PARTITION): peer.region
                           for peer in config.peers}
        self.stats = ReaderStats()
        self._assemblies = {peer.region: _Assembly() for peer in config.peers}
        self._task: asyncio.Task[None] | None = None
        self._backoff_ms = config.retry_backoff_ms

    async def start(self) -> None:
        if self._task is None and self.partitions:
            self._task = asyncio.create_task(self._run(), name=f"federation-summaries-{self.config.region}")

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    async def __aenter__(self) -> SummaryReader:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def apply(self, peer: str, record_value: bytes | None, *, where: str) -> bool:
        """One record of ``peer``'s summary topic; True when it completed a generation."""
        self.stats.records += 1
        if record_value is None:
            return False
        try:
            message = FederationMessage.decode(record_value)
            if message.summary is None or message.region != peer:
                raise InvalidMessage(f"not a summary of region {peer}")
        except NewerSchema:
            return False
        except InvalidMessage as exc:
            self.stats.invalid += 1
            self.catalog.store.quarantine.add("kafka", where, exc)
            return False
        view = self._assemblies[peer].add(message.summary)
        if view is None:
            return False
        self.catalog.peer(peer).set_summary(view, received_at_ms=now_ms())
        self.stats.applied += 1
        return True

    async def _run(self) -> None:
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except (KafkaError, BrokerUnavailable) as exc:
                self.stats.failures += 1
                self.stats.last_error = repr(exc)
                log.warning("region %s: summary reader paused (%s); retrying in %d ms", self.config.region, exc,
                            self._backoff_ms)
                await asyncio.sleep(self._backoff_ms / 1000)
                self._backoff_ms = min(self.config.max_backoff_ms, self._backoff_ms * 2)

    async def _session(self) -> None:
        assigned = list(self.partitions)
        await ensure_topics(self.config, [partition.topic for partition in assigned])
        # Summaries come once a second: a long fetch wait costs them nothing and keeps an idle
        # reader from waking 50 times a second as the change consumer does.
        consumer = make_consumer(self.config, fetch_max_wait_ms=max(self.config.fetch_max_wait_ms,
                                                                    min(500, self.config.summary_interval_ms // 2)))
        try:
            await consumer.start()
            consumer.assign(assigned)
            for partition in assigned:
                start = (await consumer.beginning_offsets([partition]))[partition]
                end = (await consumer.end_offsets([partition]))[partition]
                consumer.seek(partition, max(start, end - READ_BACK_RECORDS))
            self._backoff_ms = self.config.retry_backoff_ms
            while True:
                batches = await consumer.getmany(*assigned, timeout_ms=_POLL_TIMEOUT_MS)
                for partition, records in batches.items():
                    self._apply_records(partition, records)
                for partition in assigned:
                    highwater = consumer.highwater(partition)
                    if highwater is not None and highwater < await consumer.position(partition):
                        # The broker lost the topic's records (a restarted memory-only broker): read what it has.
                        consumer.seek(partition, (await consumer.beginning_offsets([partition]))[partition])
        finally:
            try:
                await consumer.stop()
            except KafkaError:
                pass

    def _apply_records(self, partition: TopicPartition, records: Sequence[ConsumerRecord]) -> None:
        peer = self.partitions[partition]
        for record in records:
            self.apply(peer, record.value, where=f"{partition.topic}@{record.offset}")
