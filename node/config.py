"""Configuration of one regional node, validated when built; units are in the names."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .core import DEFAULT_MAX_HOPS, MAX_HOPS_CEILING
from .core.models import REGION_PATTERN
from .delivery import DEFAULT_BREAKER_COOLDOWN_MS, DEFAULT_BREAKER_FAILURES, DEFAULT_BREAKER_WINDOW_MS, RetryPolicy
from .duties import (
    DEFAULT_LEADER_TTL_MS,
    DEFAULT_MAX_CONCURRENT_PROBES,
    DEFAULT_MAX_EXPIRE_FRACTION,
    DEFAULT_PROTECTION_MAX_HOLD_MS,
    DEFAULT_SWEEP_INTERVAL_MS,
)
from .http import (
    DEFAULT_ERROR_LOG_INTERVAL_MS,
    DEFAULT_HEADER_READ_TIMEOUT_MS,
    DEFAULT_KEEPALIVE_TIMEOUT_MS,
    DEFAULT_MAX_CONNECTIONS,
)
from .routing import DEFAULT_OVERPROVISIONING_FACTOR, DEFAULT_TICKET_TTL_MS
from .store import DEFAULT_CHANGE_STREAM_MAXLEN, DEFAULT_KEY_PREFIX
from .trust import (
    DEFAULT_KEY_PUBLISH_INTERVAL_MS,
    DEFAULT_REVOCATION_POLL_INTERVAL_MS,
    DEFAULT_SIGNING_KEY_MAX_AGE_MS,
    EgressPolicy,
)
from .view import (
    DEFAULT_LEASE_SYNC_INTERVAL_MS,
    DEFAULT_PRESERVE_FRACTION,
    DEFAULT_PRESERVE_MIN_AGENTS,
    DEFAULT_STREAMS_PER_CALLER,
    DEFAULT_WRITE_TIMEOUT_MS,
)

DEFAULT_PORT = 7101  # the first node of topology/local.toml: where `up`, `node` and the client commands meet
DEFAULT_MAX_BODY_BYTES = 256 * 1024
DEFAULT_REPORT_GRACE_MS = 300_000
DEFAULT_RATE_LIMIT_RPS = 0.0
DEFAULT_BODY_READ_TIMEOUT_MS = 30_000


# -- proxy mode (node.proxy, node.traces) ----------------------------------------------------

DEFAULT_IDEMPOTENCY_TTL_MS = 600_000
DEFAULT_TRACE_TTL_MS = 86_400_000
DEFAULT_TRACE_MAX_EVENTS = 1_000
DEFAULT_TRACE_MAX_CALLERS = 16
DEFAULT_TRACE_CALLER_BYTES = 32 * 2**20
DEFAULT_IDEMPOTENCY_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_BACKGROUND = 1_000
DEFAULT_PROXY_MAX_RESPONSE_BYTES = 4 * 1024 * 1024


class ProxySettings(BaseModel):
    """Limits of proxy mode and the trace log: ``NodeConfig.proxy`` (a topology's ``[node.proxy]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_hops: int = Field(default=DEFAULT_MAX_HOPS, ge=1, le=MAX_HOPS_CEILING,
                          description="Hops an envelope may take (agent to agent through proxies) before it is "
                                      "refused.")
    connect_timeout_ms: int = Field(default=3_000, ge=1, description="Connecting to a target agent.")
    read_timeout_ms: int = Field(default=30_000, ge=1, description="Waiting for a target's answer.")
    request_timeout_ms: int = Field(default=30_000, ge=1, description="Budget of one send, all attempts included.")
    max_attempts: int = Field(default=3, ge=1, le=10, description="For idempotent envelopes; others get one.")
    retry_initial_backoff_ms: int = Field(default=100, ge=0,
                                          description="Backoff before the first retry of an idempotent send.")
    retry_max_backoff_ms: int = Field(default=2_000, ge=0, description="Longest backoff between retries.")
    retry_multiplier: float = Field(default=2.0, ge=1.0, description="Backoff growth per retry.")
    jitter_ratio: float = Field(default=0.2, ge=0.0, lt=1.0, description="Random share of each backoff.")
    idempotency_ttl_ms: int = Field(default=DEFAULT_IDEMPOTENCY_TTL_MS, ge=1_000,
                                    description="How long an envelope id is remembered (a resend within it is answered "
                                                "once).")
    idempotency_max_body_bytes: int = Field(default=DEFAULT_IDEMPOTENCY_MAX_BODY_BYTES, ge=0,
                                            description="Answers up to this size are kept for resends of the same "
                                                        "envelope id.")
    trace_ttl_ms: int = Field(default=DEFAULT_TRACE_TTL_MS, ge=1_000,
                              description="How long a trace (/v1/traces) is kept: each writer's events, after its last one.")
    trace_max_events: int = Field(default=DEFAULT_TRACE_MAX_EVENTS, ge=1, le=100_000,
                                  description="Events one trace keeps of each writer: of the node's own records, "
                                              "and of each caller's posts (POST /v1/traces).")
    trace_max_callers: int = Field(default=DEFAULT_TRACE_MAX_CALLERS, ge=1, le=1_000,
                                   description="Callers whose posts one trace keeps; a further caller's are refused "
                                               "(409 trace_full).")
    trace_caller_bytes: int = Field(default=DEFAULT_TRACE_CALLER_BYTES, ge=0,
                                    description="Bytes of trace events one caller's posts (POST /v1/traces, all its "
                                                "traces together) may add within trace_ttl_ms; beyond, its posts are "
                                                "refused (429 trace_quota) until older ones expire. Admins are not "
                                                "counted. 0: no quota.")
    callback_attempts: int = Field(default=3, ge=1, le=10, description="Attempts to deliver a callback-mode result.")
    max_background: int = Field(default=DEFAULT_MAX_BACKGROUND, ge=1,
                                description="Callback-mode deliveries in flight; beyond it sends get 429.")
    max_response_bytes: int = Field(default=DEFAULT_PROXY_MAX_RESPONSE_BYTES, ge=1,
                                    description="A target's answer (decoded) beyond this fails the attempt.")

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(initial_backoff_s=self.retry_initial_backoff_ms / 1000, multiplier=self.retry_multiplier,
                           max_backoff_s=max(self.retry_max_backoff_ms, self.retry_initial_backoff_ms) / 1000,
                           jitter_ratio=self.jitter_ratio, max_attempts=self.max_attempts)


class NodeConfig(BaseModel):
    """Everything a node needs; build it with keywords (``NodeConfig(region="eu", redis_url=…)``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str = Field(pattern=REGION_PATTERN,
                        description="This node's region (its Redis keys, topic and tickets carry it).")
    redis_url: str = Field(description="The region's Redis, e.g. redis://10.0.0.5:6379/0 (rediss:// for TLS, "
                                       "unix:// for a socket).")
    host: str = Field(default="127.0.0.1", description="Listen address.")
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65_535, description="HTTP port (0 = any free port).")
    node_id: str | None = Field(default=None,
                                description="This replica's id (leader lease, key ids); None = generated at start.")
    advertise_url: str | None = Field(default=None, description="How peers reach this node; derived if unset.")
    key_prefix: str = Field(default=DEFAULT_KEY_PREFIX,
                            description="Prefix of every Redis key (and of the federation's replica keys).")
    change_stream_maxlen: int = Field(default=DEFAULT_CHANGE_STREAM_MAXLEN, ge=100,
                                      description="Entries the region's change stream keeps (about; peers heal a "
                                                  "longer gap by anti-entropy).")
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1_024,
                                description="Largest request body; beyond it 413.")
    allowed_transports: list[str] | None = Field(default=None, description="None = any transport.")
    leader_ttl_ms: int = Field(default=DEFAULT_LEADER_TTL_MS, ge=300,
                               description="Lease of the singleton duties (sweeper, prober, publisher, consumer); a "
                                           "dead leader is replaced within about this long.")
    sweep_interval_ms: int = Field(default=DEFAULT_SWEEP_INTERVAL_MS, ge=10,
                                   description="How often the leader expires passed leases.")
    max_expire_fraction: float = Field(default=DEFAULT_MAX_EXPIRE_FRACTION, gt=0, le=1,
                                       description="Self-preservation: a sweep that would expire more than this share "
                                                   "of the agents is held back.")
    protection_max_hold_ms: int = Field(default=DEFAULT_PROTECTION_MAX_HOLD_MS, ge=0,
                                        description="How long self-preservation may hold expiry back before sweeping "
                                                    "anyway.")
    protect_min_agents: int = Field(default=DEFAULT_PRESERVE_MIN_AGENTS, ge=1,
                                    description="Self-preservation applies only to regions with at least this many "
                                                "agents.")
    lease_sync_interval_ms: int = Field(default=DEFAULT_LEASE_SYNC_INTERVAL_MS, ge=10,
                                        description="How often each replica re-reads the leases about to end "
                                                    "(heartbeats through other replicas).")
    preserve_fraction: float = Field(default=DEFAULT_PRESERVE_FRACTION, gt=0, le=1,
                                     description="The cache suspends lazy expiry when more than this share of leases "
                                                 "pass at once.")
    max_concurrent_probes: int = Field(default=DEFAULT_MAX_CONCURRENT_PROBES, ge=1,
                                       description="Liveness/readiness probes in flight at once (leader).")
    ticket_ttl_ms: int = Field(default=DEFAULT_TICKET_TTL_MS, ge=100,
                               description="A route ticket and its route credentials expire this long after issue.")
    # Route credentials (node.credentials): the key this node signs them with.
    signing_key_file: str | None = Field(
        default=None, description="Ed25519 PEM file to sign route credentials with (created, mode 0600, when "
                                  "missing; rewritten on rotation); None = a key generated in memory at start.")
    key_publish_interval_ms: int = Field(default=DEFAULT_KEY_PUBLISH_INTERVAL_MS, ge=100,
                                         description="How often the node renews its public key's lease in Redis.")
    signing_key_max_age_ms: int = Field(default=DEFAULT_SIGNING_KEY_MAX_AGE_MS, ge=1_000,
                                        description="The node rotates its signing key once it is this old.")
    # Bearer tokens (node.revocation): the region's deny list of revoked tokens.
    revocation_poll_interval_ms: int = Field(
        default=DEFAULT_REVOCATION_POLL_INTERVAL_MS, ge=10,
        description="How often the node reads the region's token deny list again: a token revoked through one "
                    "node is refused by every node of the region within about this long.")
    report_grace_ms: int = Field(default=DEFAULT_REPORT_GRACE_MS, ge=0,
                                 description="Outcome reports on a ticket are accepted until this long after it "
                                             "expired.")
    overprovisioning_factor: float = Field(default=DEFAULT_OVERPROVISIONING_FACTOR, ge=1.0,
                                           description="A priority level takes traffic in proportion to its healthy "
                                                       "share times this; the rest spills to the next.")
    semantic_threshold: float | None = Field(
        default=None, ge=-1.0, le=1.0,
        description="Score a semantic fallback match needs when ranked the node's way (hybrid; lexical with "
                    "semantic_enabled false); None = the matcher's suggestion for its ranking.")
    semantic_lexical_threshold: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="Score a lexically ranked fallback match needs on a hybrid node (a mostly-Chinese request with "
                    "an English-only model), on BM25's scale; None = the matcher's suggestion (0.07).")
    semantic_enabled: bool = Field(default=True, description="False: search and fallback are lexical only.")

    @property
    def lexical_threshold(self) -> float | None:
        """What a lexically ranked fallback match is held to: ``semantic_lexical_threshold``, or on a
        lexical node (its own ranking, so set on BM25's scale) ``semantic_threshold``."""
        if self.semantic_lexical_threshold is None and not self.semantic_enabled:
            return self.semantic_threshold
        return self.semantic_lexical_threshold

    # A2A (node.a2a.routes): who may read agents' cards without a token.
    public_cards: bool = Field(
        default=False, description="True: an agent registered from its card with public_card=true (and no "
                                   "allowed_callers) has its card served without a token at "
                                   "/agents/{agent_id}/.well-known/agent-card.json. False (the default): every "
                                   "agent card needs a bearer token, like the rest of the API.")
    semantic_model: str | None = Field(
        default=None, min_length=1,
        description="A local model directory, an installed model package or a locally cached model name; "
                    "None = the packaged all-MiniLM-L6-v2 (English only). A topology's [semantic] model.")
    breaker_failures: int = Field(default=DEFAULT_BREAKER_FAILURES, ge=1,
                                  description="Failures within breaker_window_ms that open an agent's circuit breaker.")
    breaker_window_ms: int = Field(default=DEFAULT_BREAKER_WINDOW_MS, ge=1,
                                   description="The window breaker_failures are counted in.")
    breaker_cooldown_ms: int = Field(default=DEFAULT_BREAKER_COOLDOWN_MS, ge=1,
                                     description="How long an open breaker waits before letting a trial call through.")
    rate_limit_rps: float = Field(default=DEFAULT_RATE_LIMIT_RPS, ge=0, description="Per caller; 0 = unlimited.")
    rate_limit_burst: int = Field(default=100, ge=1,
                                  description="Requests a caller may send at once above rate_limit_rps.")
    watch_streams_per_caller: int = Field(default=DEFAULT_STREAMS_PER_CALLER, ge=1,
                                          description="Open /v1/watch streams one caller (token subject) may hold; "
                                                      "one more is answered 429 too_many_watches.")
    watch_write_timeout_ms: int = Field(default=DEFAULT_WRITE_TIMEOUT_MS, ge=1,
                                        description="A /v1/watch stream whose watcher takes no write within this "
                                                    "long (it stopped reading) is cut, its token's expiry or not.")
    body_read_timeout_ms: int = Field(default=DEFAULT_BODY_READ_TIMEOUT_MS, ge=1,
                                      description="A request body must arrive within this long; else 408.")
    # HTTP server limits (node.server): what one client connection may cost the node.
    header_read_timeout_ms: int = Field(
        default=DEFAULT_HEADER_READ_TIMEOUT_MS, ge=1,
        description="A request head must be complete this long after connecting, or after its first byte on "
                    "a keep-alive connection; else 408 and close. Bodies and streams are not timed by this.")
    keepalive_timeout_ms: int = Field(default=DEFAULT_KEEPALIVE_TIMEOUT_MS, ge=1,
                                      description="An idle keep-alive connection is closed after this long.")
    max_connections: int = Field(default=DEFAULT_MAX_CONNECTIONS, ge=1,
                                 description="Open client connections; one more is answered 503 and closed.")
    http_error_log_interval_ms: int = Field(
        default=DEFAULT_ERROR_LOG_INTERVAL_MS, ge=1,
        description="At most one log line per kind of malformed request (or refusal) per interval.")
    # Operations: the access log (node.logs) and the decision log (node.decisions).
    access_log: bool = Field(default=False, description="One log line per HTTP request (logger agent_reach.access).")
    decision_log: str | None = Field(
        default=None, min_length=1,
        description='Route decisions and outcomes as JSON lines keyed by trace_id: "stdout", "stderr" or a file '
                    "path (appended to); None = not written (GET /v1/agents/{id}/decisions still serves the "
                    "recent ones).")
    # Egress (node.egress): what the node itself may contact — proxy deliveries, callbacks, probes.
    egress: EgressPolicy = Field(
        default_factory=EgressPolicy,
        description='Default: public addresses only; e.g. {"allow": ["loopback"]} when agents run on this host.')
    # Proxy mode (node.proxy) and the trace log (node.traces).
    proxy: ProxySettings = Field(default_factory=ProxySettings,
                                 description="Limits of POST /v1/send and of the trace log; e.g. "
                                             '{"max_response_bytes": 1048576}.')

    def transport_allowed(self, transport: str) -> bool:
        return self.allowed_transports is None or transport in self.allowed_transports
