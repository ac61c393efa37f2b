"""Kafka clients as the federation uses them, and the translation of their errors.

Only produce, fetch, metadata and admin create-topics are used, so the same code runs against
real Kafka and the embedded Tansu broker (see ``topology.embedded`` for how it behaves).
Region topics are created explicitly with ONE partition before anyone touches them: a client
that asks for metadata of a missing topic makes the broker auto-create it with its default
partition count. An existing topic is not an error (code 36 in the response).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from .config import FederationConfig
from .errors import BrokerUnavailable

log = logging.getLogger(__name__)

TOPIC_PARTITIONS = 1
PRODUCER_MAX_BATCH_BYTES = 1024 * 1024
PARTITION = 0
_TOPIC_ALREADY_EXISTS = 36


def make_producer(config: FederationConfig) -> AIOKafkaProducer:
    """A producer that waits for every replica (``acks="all"``) and sends at once (no linger)."""
    return AIOKafkaProducer(
        bootstrap_servers=config.bootstrap_servers,
        client_id=f"agent-reach-publisher-{config.region}",
        acks="all",
        enable_idempotence=config.enable_idempotence,
        linger_ms=0,
        # One request per broker is in flight, carrying one batch per partition: with the
        # default 16 KiB batches a region topic moves ~13 changes per round trip, which caps it
        # near 1,000 changes/s under load. Batches up to 1 MiB keep the single partition fed.
        max_batch_size=PRODUCER_MAX_BATCH_BYTES,
        request_timeout_ms=config.request_timeout_ms,
        retry_backoff_ms=config.retry_backoff_ms,
    )


def make_consumer(config: FederationConfig, *, fetch_max_wait_ms: int | None = None) -> AIOKafkaConsumer:
    """A group-less consumer for manual assignment; offsets live in Redis, never in Kafka.
    ``fetch_max_wait_ms`` defaults to the config's (what change propagation needs)."""
    return AIOKafkaConsumer(
        bootstrap_servers=config.bootstrap_servers,
        client_id=f"agent-reach-consumer-{config.region}",
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=fetch_max_wait_ms or config.fetch_max_wait_ms,
        request_timeout_ms=config.request_timeout_ms,
        retry_backoff_ms=config.retry_backoff_ms,
    )


async def ensure_topics(config: FederationConfig, topics: Sequence[str]) -> list[str]:
    """Create the topics that do not exist (one partition each); returns those it created.

    Raises :class:`BrokerUnavailable` when the broker cannot be reached or refuses.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=config.bootstrap_servers,
                                client_id=f"agent-reach-admin-{config.region}",
                                request_timeout_ms=config.request_timeout_ms)
    try:
        await admin.start()
        response = await admin.create_topics(
            [NewTopic(topic, num_partitions=TOPIC_PARTITIONS, replication_factor=1) for topic in topics])
    except KafkaError as exc:
        raise BrokerUnavailable(f"cannot create topics {', '.join(topics)} on {config.bootstrap_servers}: "
                                f"{exc!r}") from exc
    finally:
        try:
            await admin.close()
        except KafkaError:
            pass
    created = []
    for topic, code, *_ in response.topic_errors:
        if code == 0:
            created.append(topic)
        elif code != _TOPIC_ALREADY_EXISTS:
            raise BrokerUnavailable(f"the broker refused to create topic {topic} (Kafka error code {code}); "
                                    "check that the topic prefix is a legal topic name and that this client may "
                                    "create topics")
    return created
