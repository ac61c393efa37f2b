"""Settings of one region's federation attachment, validated when built; units are in the names."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from node.core.models import REGION_PATTERN
from node.store import DEFAULT_KEY_PREFIX

from .security import KafkaSecurity

DEFAULT_TOPIC_PREFIX = "agent-reach"
DEFAULT_BEACON_INTERVAL_MS = 1_000
DEFAULT_STALE_AFTER_MS = 5_000
# Against the embedded broker end-to-end latency is about uniform in [0, fetch_max_wait_ms / 2];
# 20 ms keeps cross-region p99 far below 50 ms for about 3 % of a core per idle consumer.
DEFAULT_FETCH_MAX_WAIT_MS = 20
DEFAULT_REQUEST_TIMEOUT_MS = 5_000
DEFAULT_RETRY_BACKOFF_MS = 200
DEFAULT_MAX_BACKOFF_MS = 2_000
DEFAULT_PUBLISH_BATCH = 500
DEFAULT_CONSUME_BATCH = 1_000
DEFAULT_SNAPSHOT_TIMEOUT_MS = 5_000
DEFAULT_SNAPSHOT_DEADLINE_MS = 600_000
DEFAULT_SNAPSHOT_MAX_BYTES = 2**30
DEFAULT_ANTI_ENTROPY_MIN_INTERVAL_MS = 1_000
DEFAULT_FEED_MAXLEN = 100_000
DEFAULT_FEED_BLOCK_MS = 1_000
DEFAULT_KEY_REFRESH_INTERVAL_MS = 60_000
DEFAULT_SUMMARY_INTERVAL_MS = 1_000
DEFAULT_FORWARD_TIMEOUT_MS = 1_000
DEFAULT_FORWARD_BACKOFF_MS = 5_000
TOPIC_PREFIX_PATTERN = r"^[A-Za-z0-9._-]{1,100}$"


class PeerConfig(BaseModel):
    """A peer region and where its node(s) serve the anti-entropy snapshot."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str = Field(pattern=REGION_PATTERN)
    node_urls: list[str] = Field(min_length=1)


class FederationConfig(BaseModel):
    """Everything the federation of one region needs; ``peers`` nearest first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str = Field(pattern=REGION_PATTERN)
    peers: list[PeerConfig]
    bootstrap_servers: str = Field(min_length=1, description="Kafka bootstrap servers, 'host:port[,host:port]'.")
    topic_prefix: str = Field(default=DEFAULT_TOPIC_PREFIX, pattern=TOPIC_PREFIX_PATTERN)
    key_prefix: str = DEFAULT_KEY_PREFIX
    enable_idempotence: bool = Field(default=False, description="Real Kafka supports it; the embedded broker not.")
    security: KafkaSecurity = Field(default_factory=KafkaSecurity,
                                    description="TLS and SASL of every Kafka client (federation.security).")
    beacon_interval_ms: int = Field(default=DEFAULT_BEACON_INTERVAL_MS, ge=50)
    stale_after_ms: int = Field(default=DEFAULT_STALE_AFTER_MS, ge=100)
    fetch_max_wait_ms: int = Field(default=DEFAULT_FETCH_MAX_WAIT_MS, ge=1, le=10_000)
    request_timeout_ms: int = Field(default=DEFAULT_REQUEST_TIMEOUT_MS, ge=100)
    retry_backoff_ms: int = Field(default=DEFAULT_RETRY_BACKOFF_MS, ge=10)
    max_backoff_ms: int = Field(default=DEFAULT_MAX_BACKOFF_MS, ge=10)
    publish_batch_max: int = Field(default=DEFAULT_PUBLISH_BATCH, ge=1)
    consume_batch_max: int = Field(default=DEFAULT_CONSUME_BATCH, ge=1)
    snapshot_timeout_ms: int = Field(default=DEFAULT_SNAPSHOT_TIMEOUT_MS, ge=100,
                                     description="The longest silence while a peer's snapshot is fetched: for the "
                                                 "connection, the first byte, and between two chunks.")
    snapshot_deadline_ms: int = Field(default=DEFAULT_SNAPSHOT_DEADLINE_MS, ge=100,
                                      description="The whole fetch of one peer's snapshot, however steadily it "
                                                  "arrives (100,000 agents take ~5 s to read here).")
    snapshot_max_bytes: int = Field(default=DEFAULT_SNAPSHOT_MAX_BYTES, ge=1_024,
                                    description="A peer's snapshot beyond this many bytes is refused (~700 B per "
                                                "agent: the default holds about 1.5 million).")
    anti_entropy_min_interval_ms: int = Field(default=DEFAULT_ANTI_ENTROPY_MIN_INTERVAL_MS, ge=0)
    feed_maxlen: int = Field(default=DEFAULT_FEED_MAXLEN, ge=100)
    feed_block_ms: int = Field(default=DEFAULT_FEED_BLOCK_MS, ge=1)
    key_refresh_interval_ms: int = Field(default=DEFAULT_KEY_REFRESH_INTERVAL_MS, ge=100,
                                         description="How often the peers' public signing keys are fetched again "
                                                     "(an unknown kid is fetched at once).")
    summary_interval_ms: int = Field(default=DEFAULT_SUMMARY_INTERVAL_MS, ge=100,
                                     description="How often the leader sends its region's per-capability summary.")
    replicate_depth: int | None = Field(default=None, ge=0,
                                        description="Full records are kept for the first this many peers (nearest "
                                                    "first), summaries only for the rest; None = every peer.")
    forward_timeout_ms: int = Field(default=DEFAULT_FORWARD_TIMEOUT_MS, ge=50, le=60_000,
                                    description="Deadline of a lookup forwarded to a summary-only peer's node.")
    forward_backoff_ms: int = Field(default=DEFAULT_FORWARD_BACKOFF_MS, ge=0, le=600_000,
                                    description="After a summary-only peer did not answer, lookups are not "
                                                "forwarded to it for this long (0: ask every time).")

    @model_validator(mode="after")
    def _check(self) -> FederationConfig:
        names = [peer.region for peer in self.peers]
        if len(set(names)) != len(names):
            raise ValueError("peers: a region is listed twice")
        if self.region in names:
            raise ValueError(f"peers: region {self.region} cannot be its own peer")
        if self.stale_after_ms <= self.beacon_interval_ms:
            raise ValueError("stale_after_ms must exceed beacon_interval_ms, or every peer looks stale between beacons")
        return self

    def topic(self, region: str) -> str:
        """The change topic of ``region``: ``{topic_prefix}.changes.{region}``."""
        return topic_name(self.topic_prefix, region)

    def beacon_topic(self, region: str) -> str:
        """The beacon topic of ``region``: ``{topic_prefix}.beacons.{region}``."""
        return beacon_topic_name(self.topic_prefix, region)

    def summary_topic(self, region: str) -> str:
        """The summary topic of ``region``: ``{topic_prefix}.summaries.{region}``."""
        return summary_topic_name(self.topic_prefix, region)

    def revocation_topic(self, region: str) -> str:
        """The revocation topic of ``region``: ``{topic_prefix}.revocations.{region}``."""
        return f"{self.topic_prefix}.revocations.{region}"

    def acl_topic(self, region: str) -> str:
        """The ACL topic of ``region``: ``{topic_prefix}.acl.{region}``."""
        return f"{self.topic_prefix}.acl.{region}"

    @property
    def replicated_peers(self) -> list[PeerConfig]:
        """The peers whose full records this region keeps (the first ``replicate_depth``)."""
        return self.peers if self.replicate_depth is None else self.peers[:self.replicate_depth]

    def replicates(self, region: str) -> bool:
        """Whether this region keeps ``region``'s full records (else only its summaries)."""
        return any(peer.region == region for peer in self.replicated_peers)

    def peer(self, region: str) -> PeerConfig:
        for peer in self.peers:
            if peer.region == region:
                return peer
        raise KeyError(region)


def topic_name(prefix: str, region: str) -> str:
    return f"{prefix}.changes.{region}"


def beacon_topic_name(prefix: str, region: str) -> str:
    return f"{prefix}.beacons.{region}"


def summary_topic_name(prefix: str, region: str) -> str:
    return f"{prefix}.summaries.{region}"
