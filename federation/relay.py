"""``LogRelay``: what the relays of region-wide lists share — sending this region's own entries to
its topic, applying the peers' from theirs — as one of the leader's duties.

A list each region keeps in its own Redis with a log of its changes (the token deny list,
``federation.revocations``; the ACL rules, ``federation.acl``) reaches every region the same way:
the relay announces the whole list whenever it starts (a peer that missed records catches up),
then follows the log and sends the entries whose origin is this region; it reads every peer's
topic from its start and applies each entry with that peer as its origin, which is why nothing
is sent back. While Kafka or Redis cannot be reached it backs off and tries again; the list keeps
working in the region it was changed in.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from node.core import StoreUnavailable, run_together
from node.store import Quarantine

from .config import FederationConfig
from .errors import BrokerUnavailable, InvalidMessage, NewerSchema
from .events import FederationMessage
from .kafka import PARTITION, ensure_topics, make_consumer, make_producer

__all__ = ["LOG_RESCAN_S", "LogRelay", "RelayState", "RelayStats"]

log = logging.getLogger(__name__)

Item = TypeVar("Item")

LOG_RESCAN_S = 1.0
_FETCH_TIMEOUT_MS = 1_000


class RelayState(enum.Enum):
    IDLE = "idle"
    CONNECTING = "connecting"
    RELAYING = "relaying"
    BACKING_OFF = "backing_off"


@dataclass(slots=True)
class RelayStats:
    sent: int = 0  # this region's entries sent as they were made
    announced: int = 0  # entries sent in full lists
    received: int = 0  # entries read from peers' topics
    applied: int = 0  # of those, the ones this region's list did not hold already
    invalid: int = 0
    failures: int = 0
    last_error: str | None = None


class LogRelay:
    """The topics, the session and the back-off of a relay; a subclass sends (``_send``, given the
    producer) and applies one peer record (``_apply``)."""

    name = "list"  # what the logs call the relayed list: the FederationMessage field it travels in

    def __init__(self, config: FederationConfig, *, topic: str, peer_topics: dict[str, str],
                 quarantine: Quarantine) -> None:
        self.config = config
        self.quarantine = quarantine
        self.topic = topic
        self.partitions = {TopicPartition(peer_topic, PARTITION): peer for peer, peer_topic in peer_topics.items()}
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
                    log.warning("region %s: %s relay paused (%s); retrying in %d ms", self.config.region, self.name,
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
            loops = {f"{self.name}-out-{self.config.region}": self._send(producer)}
            if consumer is not None:
                await consumer.start()
                consumer.assign(list(self.partitions))
                await consumer.seek_to_beginning(*self.partitions)
                loops[f"{self.name}-in-{self.config.region}"] = self._receive(consumer)
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

    async def _send(self, producer: AIOKafkaProducer) -> None:
        raise NotImplementedError

    async def _publish_parts(self, producer: AIOKafkaProducer, items: Sequence[Item], *, per_message: int,
                             message: Callable[[list[Item]], FederationMessage]) -> int:
        """Send ``items`` in messages of at most ``per_message`` (one, empty, for none) and wait for
        Kafka's acknowledgement of each; returns how many items went."""
        for start in range(0, max(len(items), 1), per_message):
            built = message(list(items[start:start + per_message]))
            await producer.send_and_wait(self.topic, built.encode(), key=built.key(), partition=PARTITION,
                                         headers=built.headers())
        return len(items)

    async def _receive(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=_FETCH_TIMEOUT_MS,
                                             max_records=self.config.consume_batch_max)
            for partition, records in batches.items():
                peer = self.partitions[partition]
                for record in records:
                    await self._apply(peer, record)

    async def _apply(self, peer: str, record: ConsumerRecord) -> None:
        raise NotImplementedError

    def _message(self, peer: str, record: ConsumerRecord) -> FederationMessage | None:
        """The record's message when it is of this relay's kind (the ``name`` field) and of ``peer``;
        None for a newer schema (skipped) or anything else (counted and quarantined)."""
        try:
            message = FederationMessage.decode(record.value)
            if getattr(message, self.name) is None or message.region != peer:
                raise InvalidMessage(f"not {self.name} of region {peer}")
        except NewerSchema:
            return None
        except InvalidMessage as exc:
            self.stats.invalid += 1
            self.quarantine.add("kafka", f"{record.topic}@{record.offset}", exc)
            return None
        return message

    def describe(self) -> dict[str, object]:
        """What ``/v1/federation/status`` shows of the relay."""
        stats = self.stats
        return {"state": self.state.value, "topic": self.topic, "sent": stats.sent, "announced": stats.announced,
                "received": stats.received, "applied": stats.applied, "invalid": stats.invalid,
                "failures": stats.failures, "last_error": stats.last_error}
