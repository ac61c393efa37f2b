"""``RevocationRelay``: a token revoked in any region is refused in every region.

Bearer tokens are valid in every region of a cluster (one secret), while each region keeps its
deny list in its own Redis (``node.trust.revocation``). The relay, one of the leader's duties,
joins the lists over Kafka:

* **out**: it follows the region's revocation log and sends the entries whose origin is this
  region to ``{prefix}.revocations.{region}`` as they are made. The deny list wakes it
  (:meth:`RevocationList.wait_changed`): at once for a revocation through the leader itself,
  within the list's poll interval for one through another node of the region; the log is read
  every :data:`LOG_RESCAN_S` whatever happens, so a missed wake costs at most that. Every time the
  relay starts it first sends the whole list, marked ``full``: a peer that missed records — a new
  region, a broker that forgot them, retention — catches up.
* **in**: it reads every peer's revocation topic from its start and applies each token with that
  peer as its origin. The log marks it so, which is why it is never sent back; a token the list
  holds until as late already costs no round trip, so the full lists peers repeat are cheap.

The leader applies a peer's revocation at once; the region's other nodes read it from Redis
within their ``revocation_poll_interval_ms``. While Kafka cannot be reached, revocations keep
working in the region they were made in and travel once it is back.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from node.core import StoreUnavailable, now_ms, run_together
from node.store import Quarantine
from node.trust import RevocationList

from .config import FederationConfig
from .errors import BrokerUnavailable, InvalidMessage, NewerSchema
from .events import MAX_REVOCATIONS_PER_MESSAGE, FederationMessage, RegionRevocations, RevokedToken
from .kafka import PARTITION, ensure_topics, make_consumer, make_producer

__all__ = ["LOG_RESCAN_S", "RelayState", "RelayStats", "RevocationRelay"]

log = logging.getLogger(__name__)

LOG_RESCAN_S = 1.0
_FETCH_TIMEOUT_MS = 1_000


class RelayState(enum.Enum):
    IDLE = "idle"
    CONNECTING = "connecting"
    RELAYING = "relaying"
    BACKING_OFF = "backing_off"


@dataclass(slots=True)
class RelayStats:
    sent: int = 0  # this region's revocations sent as they were made
    announced: int = 0  # tokens sent in full lists
    received: int = 0  # tokens read from peers' topics
    applied: int = 0  # of those, the ones this region's list did not hold until as late
    invalid: int = 0
    failures: int = 0
    last_error: str | None = None


class RevocationRelay:
    """Sends this region's revocations to its peers and applies theirs; ``run`` is a leader duty."""

    def __init__(self, config: FederationConfig, *, revocations: RevocationList, quarantine: Quarantine) -> None:
        self.config = config
        self.revocations = revocations
        self.quarantine = quarantine
        self.topic = config.revocation_topic(config.region)
        self.partitions = {TopicPartition(config.revocation_topic(peer.region), PARTITION): peer.region
                           for peer in config.peers}
        self.state = RelayState.IDLE
        self.stats = RelayStats()
        self._backoff_ms = config.retry_backoff_ms

    async def run(self) -> None:
        """Relay until cancelled, backing off while Kafka or Redis cannot be reached."""
        try:
            while True:
                try:
                    await self._session()
                except asyncio.CancelledError:
                    raise
                except (KafkaError, BrokerUnavailable, StoreUnavailable) as exc:
                    self.stats.failures += 1
                    self.stats.last_error = repr(exc)
                    self.state = RelayState.BACKING_OFF
                    log.warning("region %s: revocation relay paused (%s); retrying in %d ms", self.config.region,
                                exc, self._backoff_ms)
                    await asyncio.sleep(self._backoff_ms / 1000)
                    self._backoff_ms = min(self.config.max_backoff_ms, self._backoff_ms * 2)
        finally:
            self.state = RelayState.IDLE

    async def _session(self) -> None:
        self.state = RelayState.CONNECTING
        await ensure_topics(self.config, [self.topic, *(partition.topic for partition in self.partitions)])
        producer = make_producer(self.config)
        consumer = make_consumer(self.config) if self.partitions else None
        try:
            await producer.start()
            loops = {f"revocations-out-{self.config.region}": self._send(producer)}
            if consumer is not None:
                await consumer.start()
                consumer.assign(list(self.partitions))
                await consumer.seek_to_beginning(*self.partitions)
                loops[f"revocations-in-{self.config.region}"] = self._receive(consumer)
            self.state = RelayState.RELAYING
            self._backoff_ms = self.config.retry_backoff_ms
            await run_together(loops)
        finally:
            for client in (producer, consumer):
                if client is not None:
                    try:
                        await client.stop()
                    except KafkaError:
                        pass

    # -- out ---------------------------------------------------------------------------------

    async def _send(self, producer: AIOKafkaProducer) -> None:
        # The log position is read before the list: a revocation in between is in both, and a
        # peer applies a token twice at no cost.
        position = await self.revocations.log_position()
        everything = await self.revocations.entries()
        self.stats.announced += await self._publish(
            producer, (RevokedToken(jti=jti, until_ms=until) for jti, until in everything.items()), full=True)
        while True:
            await self.revocations.wait_changed(LOG_RESCAN_S)
            entries = await self.revocations.read_log(after=position)
            if not entries:
                continue
            own = [RevokedToken(jti=entry.jti, until_ms=entry.until_ms) for entry in entries
                   if entry.origin == self.config.region]
            if own:
                self.stats.sent += await self._publish(producer, own, full=False)
            position = entries[-1].position

    async def _publish(self, producer: AIOKafkaProducer, tokens: Iterable[RevokedToken], *, full: bool) -> int:
        """Send ``tokens`` (in messages of at most 5,000) and wait for Kafka's acknowledgement."""
        batch = list(tokens)
        if not batch and not full:
            return 0
        for start in range(0, max(len(batch), 1), MAX_REVOCATIONS_PER_MESSAGE):
            message = FederationMessage.of_revocations(RegionRevocations(
                region=self.config.region, tokens=batch[start:start + MAX_REVOCATIONS_PER_MESSAGE], full=full,
                sent_at_ms=now_ms()))
            await producer.send_and_wait(self.topic, message.encode(), key=message.key(), partition=PARTITION,
                                         headers=message.headers())
        if batch:
            log.info("region %s: sent %d revocation(s) to the peers%s", self.config.region, len(batch),
                     " (the whole list)" if full else "")
        return len(batch)

    # -- in ----------------------------------------------------------------------------------

    async def _receive(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=_FETCH_TIMEOUT_MS,
                                             max_records=self.config.consume_batch_max)
            for partition, records in batches.items():
                peer = self.partitions[partition]
                for record in records:
                    await self._apply(peer, record)

    async def _apply(self, peer: str, record: ConsumerRecord) -> None:
        where = f"{record.topic}@{record.offset}"
        try:
            message = FederationMessage.decode(record.value)
            if message.revocations is None or message.region != peer:
                raise InvalidMessage(f"not revocations of region {peer}")
        except NewerSchema:
            return
        except InvalidMessage as exc:
            self.stats.invalid += 1
            self.quarantine.add("kafka", where, exc)
            return
        for token in message.revocations.tokens:
            self.stats.received += 1
            done = await self.revocations.apply(token.jti, until_ms=token.until_ms, origin=peer)
            if done.changed:
                self.stats.applied += 1
                log.info("region %s: token %s revoked in region %s is refused here too", self.config.region,
                         token.jti, peer)

    def describe(self) -> dict[str, object]:
        """What ``/v1/federation/status`` shows of the relay."""
        stats = self.stats
        return {"state": self.state.value, "topic": self.topic, "sent": stats.sent, "announced": stats.announced,
                "received": stats.received, "applied": stats.applied, "invalid": stats.invalid,
                "failures": stats.failures, "last_error": stats.last_error}
