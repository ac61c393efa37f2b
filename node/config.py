"""Configuration of one regional node: the rooms' settings composed, validated when built; units
are in the names.

:class:`NodeConfig` inherits each room's settings object — :class:`~node.store.StoreSettings`,
:class:`~node.view.ViewSettings`, :class:`~node.duties.DutySettings`,
:class:`~node.trust.TrustSettings`, :class:`~node.routing.RoutingSettings`,
:class:`~node.delivery.BreakerSettings`, :class:`~node.ops.TelemetrySettings` (OpenTelemetry) and the HTTP
face's below — so each setting is defined
once, in the room that uses it, and keeps one flat name: the keyword (``NodeConfig(ticket_ttl_ms=…)``),
the topology file's ``[node]`` key and the variable ``AGENT_REACH_TICKET_TTL_MS``
(:mod:`node.envconfig`). A room may take the whole config as its own settings type. TLS — how the
node serves (:class:`~node.core.ServerTlsSettings`) and what it trusts as a client of peers, probes
and deliveries (:class:`~node.core.ClientTlsSettings`) — is core's, shared with the SDK. The egress
policy (``egress``) and proxy mode (``proxy``) are nested settings objects.

The HTTP face's settings (:class:`ServerLimits`, :class:`HttpSettings`, :class:`ProxySettings`)
are defined here, not in ``node.http``: that room stands above this module (its routes take the
node's service), so the configuration cannot import from it.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from .core import ClientTlsSettings, ServerTlsSettings, Settings
from .core.models import REGION_PATTERN
from .delivery import BreakerSettings, DeliverySettings
from .duties import DutySettings
from .ops import TelemetrySettings
from .routing import RoutingSettings
from .store import StoreSettings, parse_redis_url
from .trust import DEFAULT_REFUSED_PAYLOAD_KEYS, TrustSettings
from .view import ViewSettings

__all__ = ["DEFAULT_PORT", "HttpSettings", "NodeConfig", "NodeIdentity", "ProxySettings", "ServerLimits"]

DEFAULT_PORT = 7101  # the first node of topology/local.toml: where `up`, `node` and the client commands meet


class NodeIdentity(Settings):
    """Which region a node serves, its Redis, where it listens and how peers reach it."""

    region: str = Field(pattern=REGION_PATTERN,
                        description="This node's region (its Redis keys, topic and tickets carry it).")
    redis_url: str = Field(description="The region's Redis, e.g. redis://10.0.0.5:6379/0 (a server or any node of "
                                       "a Redis Cluster; rediss:// for TLS, unix:// for a socket, "
                                       "redis+sentinel://host:26379,host:26379/<master>/0 for a Sentinel-managed "
                                       "primary).")
    host: str = Field(default="127.0.0.1", description="Listen address.")
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65_535, description="HTTP port (0 = any free port).")
    node_id: str | None = Field(default=None,
                                description="This replica's id (leader lease, key ids); None = generated at start.")
    advertise_url: str | None = Field(default=None, description="How peers reach this node; derived if unset.")

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        parse_redis_url(value)  # a RedisUrlError is a ValueError: the setting is named with it
        return value


# -- the HTTP face (node.http) -----------------------------------------------------------------

DEFAULT_HEADER_READ_TIMEOUT_MS = 10_000
# Longer than the idle timeouts of the usual load balancers (60 s) and client pools (aiohttp 15 s),
# so that the client, not the node, closes an idle connection and no request races the close.
DEFAULT_KEEPALIVE_TIMEOUT_MS = 75_000
DEFAULT_MAX_CONNECTIONS = 1_000
DEFAULT_MAX_CONNECTIONS_PER_SOURCE = 250  # a quarter of the default cap: no one address takes it all
DEFAULT_MAX_CONNECTIONS_PER_TOKEN = 250  # the same for one token, from however many addresses
DEFAULT_ERROR_LOG_INTERVAL_MS = 1_000
DEFAULT_MAX_BODY_BYTES = 256 * 1024
DEFAULT_BODY_READ_TIMEOUT_MS = 30_000


class ServerLimits(Settings):
    """What one client connection may cost the node (``node.http.server.NodeRunner``)."""

    header_read_timeout_ms: int = Field(
        default=DEFAULT_HEADER_READ_TIMEOUT_MS, ge=1,
        description="A request head must be complete this long after connecting, or after its first byte on "
                    "a keep-alive connection; else 408 and close. Bodies and streams are not timed by this.")
    keepalive_timeout_ms: int = Field(default=DEFAULT_KEEPALIVE_TIMEOUT_MS, ge=1,
                                      description="An idle keep-alive connection is closed after this long.")
    max_connections: int = Field(default=DEFAULT_MAX_CONNECTIONS, ge=1,
                                 description="Open client connections; at the cap the oldest idle keep-alive "
                                             "connection is closed for a new one, and only when none is idle "
                                             "the new one is answered 503 and closed.")
    max_connections_per_source: int = Field(
        default=DEFAULT_MAX_CONNECTIONS_PER_SOURCE, ge=0,
        description="Open connections one source address may hold; one more closes that source's oldest idle "
                    "connection, or is answered 503. 0 = no share (behind a load balancer, whose address every "
                    "connection has).")
    max_connections_per_token: int = Field(
        default=DEFAULT_MAX_CONNECTIONS_PER_TOKEN, ge=0,
        description="Open connections whose last request authenticated with one token (its role and subject) "
                    "may count; one more closes that token's oldest idle connection, or its request is answered "
                    "503 and its connection closed. 0 = no share.")
    http_error_log_interval_ms: int = Field(
        default=DEFAULT_ERROR_LOG_INTERVAL_MS, ge=1,
        description="At most one log line per kind of malformed request (or refusal) per interval.")


class HttpSettings(ServerLimits):
    """What one request may cost and what the HTTP face logs and serves without a token."""

    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1_024,
                                description="Largest request body; beyond it 413.")
    body_read_timeout_ms: int = Field(default=DEFAULT_BODY_READ_TIMEOUT_MS, ge=1,
                                      description="A request body must arrive within this long; else 408.")
    access_log: bool = Field(default=False, description="One log line per HTTP request (logger agent_reach.access).")
    public_cards: bool = Field(
        default=False, description="True: an agent registered from its card with public_card=true (and no "
                                   "allowed_callers) has its card served without a token at "
                                   "/agents/{agent_id}/.well-known/agent-card.json. False (the default): every "
                                   "agent card needs a bearer token, like the rest of the API.")


# -- proxy mode (node.http.proxy, node.http.traces) --------------------------------------------

# The proxy answers a caller that waits, and holds each answer in the node: it retries sooner and
# caps answers lower than the SDK (DeliverySettings' defaults).
DEFAULT_PROXY_READ_TIMEOUT_MS = 30_000
DEFAULT_PROXY_RETRY_INITIAL_BACKOFF_MS = 100
DEFAULT_PROXY_RETRY_MAX_BACKOFF_MS = 2_000
DEFAULT_PROXY_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
DEFAULT_IDEMPOTENCY_TTL_MS = 600_000
DEFAULT_IDEMPOTENCY_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_TRACE_TTL_MS = 86_400_000
DEFAULT_TRACE_MAX_EVENTS = 1_000
DEFAULT_TRACE_MAX_CALLERS = 16
DEFAULT_TRACE_CALLER_BYTES = 32 * 2**20
DEFAULT_RESULT_MAX_BYTES = 256 * 1024
DEFAULT_CALLBACK_ATTEMPTS = 3
DEFAULT_MAX_BACKGROUND = 1_000
BACKGROUND_SHARES = 10  # one tenant's share is a tenth of the pool: ten slow tenants to fill it


class ProxySettings(DeliverySettings):
    """Proxy mode and the trace log: ``NodeConfig.proxy`` (a topology's ``[node.proxy]``).

    Its deliveries are timed and retried by :class:`~node.delivery.DeliverySettings`, the SDK's
    settings, with the proxy's defaults where they differ.
    """

    read_timeout_ms: int = DeliverySettings.with_default("read_timeout_ms", DEFAULT_PROXY_READ_TIMEOUT_MS)
    retry_initial_backoff_ms: int = DeliverySettings.with_default("retry_initial_backoff_ms",
                                                                  DEFAULT_PROXY_RETRY_INITIAL_BACKOFF_MS)
    retry_max_backoff_ms: int = DeliverySettings.with_default("retry_max_backoff_ms", DEFAULT_PROXY_RETRY_MAX_BACKOFF_MS)
    max_response_bytes: int = DeliverySettings.with_default("max_response_bytes", DEFAULT_PROXY_MAX_RESPONSE_BYTES)
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
                                                "refused (429 trace_quota) until older ones expire. The node's "
                                                "own records of its traced resolves and sends count too. Admins "
                                                "are not counted. 0: no quota.")
    callback_attempts: int = Field(default=DEFAULT_CALLBACK_ATTEMPTS, ge=1, le=10,
                                   description="Attempts to deliver a callback-mode result.")
    max_background: int = Field(default=DEFAULT_MAX_BACKGROUND, ge=1,
                                description="Callback-mode deliveries in flight; beyond it sends get 429.")
    max_background_per_caller: int | None = Field(
        default=None, ge=1,
        description="Callback-mode deliveries one tenant (token role and subject) may have in flight; beyond it "
                    "its sends get 429 while other tenants' are accepted. None = a tenth of max_background.")

    @property
    def background_share(self) -> int:
        """What one tenant may hold of the callback pool (``max_background_per_caller``, else a tenth)."""
        if self.max_background_per_caller is not None:
            return self.max_background_per_caller
        return max(1, self.max_background // BACKGROUND_SHARES)
    result_max_bytes: int = Field(
        default=DEFAULT_RESULT_MAX_BYTES, ge=0,
        description="A delivery's answer up to this size is kept with its trace for the caller that sent it (GET "
                    "/v1/traces/{trace_id}/result); a larger one is kept without its body.")
    refused_payload_keys: list[str] = Field(
        default_factory=lambda: list(DEFAULT_REFUSED_PAYLOAD_KEYS), max_length=64,
        description="Keys an envelope's payload or extensions may not hold, at any depth (case ignored): such a send "
                    "is refused, 422 payload_refused naming where. Empty: no refusal.")
    payload_policy_passthrough: bool = Field(
        default=False, description="Hold sends to passthrough targets (the raw payload) to refused_payload_keys too.")


# -- the whole node ----------------------------------------------------------------------------

# pydantic lists a model's fields from its last base to its first, then its own: the bases are
# written in the reverse of the order docs/configuration.md shows the settings in.
class NodeConfig(TelemetrySettings, HttpSettings, BreakerSettings, RoutingSettings, TrustSettings, DutySettings,
                 ViewSettings, StoreSettings, ClientTlsSettings, ServerTlsSettings, NodeIdentity):
    """Everything a node needs; build it with keywords (``NodeConfig(region="eu", redis_url=…)``)."""

    allowed_transports: list[str] | None = Field(default=None, description="None = any transport.")
    proxy: ProxySettings = Field(default_factory=ProxySettings,
                                 description="Limits of POST /v1/send and of the trace log; e.g. "
                                             '{"max_response_bytes": 1048576}.')

    def transport_allowed(self, transport: str) -> bool:
        return self.allowed_transports is None or transport in self.allowed_transports
