"""Cross-region replication over Kafka: change events, publisher, consumer, replica, anti-entropy.

Imports only ``node`` (models, store, cache, follower, security, credentials); ``topology.composition`` attaches a
:class:`Federation` to a node. Where state lives: the replica of the peers, the consumer
offsets and the publisher position are all in the consuming region's own Redis (see
``federation.replica_store``).
"""

from .antientropy import AntiEntropy, AntiEntropyStats
from .config import (
    DEFAULT_BEACON_INTERVAL_MS,
    DEFAULT_STALE_AFTER_MS,
    DEFAULT_SUMMARY_INTERVAL_MS,
    DEFAULT_TOPIC_PREFIX,
    FederationConfig,
    PeerConfig,
    beacon_topic_name,
    summary_topic_name,
    topic_name,
)
from .consumer import Consumer, ConsumerState, ConsumerStats
from .digest import DigestTracker, RegionState, entry_hash, read_region_state, region_digest
from .errors import BrokerUnavailable, FederationError, InvalidMessage, NewerSchema, SnapshotUnavailable
from .events import (
    BEACON_CONTENT_TYPE,
    CHANGE_CONTENT_TYPE,
    CONTENT_TYPE_HEADER,
    SCHEMA_VERSION,
    SUMMARY_CONTENT_TYPE,
    FederationMessage,
    RegionBeacon,
)
from .forward import Forwarder
from .keys import PeerKeys
from .publisher import Publisher, PublisherState, PublisherStats
from .replica import CatalogState, PeerCatalog, PeerReplica
from .replica_store import ReplicaStore
from .service import STATUS_PATH, Federation
from .summary import SummaryBuilder, SummaryPublisher, SummaryReader, summary_parts

__all__ = [
    "Federation",
    "FederationConfig",
    "PeerConfig",
    "PeerCatalog",
    "PeerKeys",
    "Forwarder",
    "SummaryBuilder",
    "SummaryPublisher",
    "SummaryReader",
    "summary_parts",
    "PeerReplica",
    "CatalogState",
    "ReplicaStore",
    "Publisher",
    "PublisherState",
    "PublisherStats",
    "Consumer",
    "ConsumerState",
    "ConsumerStats",
    "AntiEntropy",
    "AntiEntropyStats",
    "FederationMessage",
    "RegionBeacon",
    "region_digest",
    "entry_hash",
    "DigestTracker",
    "RegionState",
    "read_region_state",
    "topic_name",
    "beacon_topic_name",
    "summary_topic_name",
    "SUMMARY_CONTENT_TYPE",
    "DEFAULT_SUMMARY_INTERVAL_MS",
    "SCHEMA_VERSION",
    "CONTENT_TYPE_HEADER",
    "CHANGE_CONTENT_TYPE",
    "BEACON_CONTENT_TYPE",
    "STATUS_PATH",
    "DEFAULT_BEACON_INTERVAL_MS",
    "DEFAULT_STALE_AFTER_MS",
    "DEFAULT_TOPIC_PREFIX",
    "FederationError",
    "BrokerUnavailable",
    "SnapshotUnavailable",
    "InvalidMessage",
    "NewerSchema",
]
