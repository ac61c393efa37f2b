"""An agent's configuration: which node, which token, what to register, how to call others.

One TOML file serves the SDK (:class:`node.client.ReachClient`), the sidecar and preflight::

    [node]
    url = "http://127.0.0.1:7101"         # optional: else $AGENT_REACH_URL (the CLI: else the local cluster's)
    token_env = "AGENT_REACH_TOKEN"       # or token = "ar1…" or token_file = "~/.agent-reach/agent.token"

    [agent]                               # a Registration, field for field (see /v1/openapi.json)
    agent_id = "demo.translate.en_01"
    description = "Translates short texts between Chinese, English and French."
    transport = "http+token"
    endpoints = { primary = "http://127.0.0.1:8701/invoke" }
    [[agent.capabilities]]
    name = "translate.text"

    [client]                              # optional; every key has a default (ClientSettings)
    connect_timeout_ms = 3000
    retry_initial_backoff_ms = 500
    ca_file = "/etc/agent-reach/ca.pem"   # https: the CAs to trust (else $AGENT_REACH_CA_FILE, else the system's)

    [sidecar]                             # optional; only the sidecar reads it (see SidecarSettings)
    ready_url = "http://127.0.0.1:8701/readyz"

Relative ``token_file`` paths are relative to the TOML file. Units are in the names. This
module does no network I/O.
"""

from __future__ import annotations

import os
import ssl
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, ValidationError, field_validator, model_validator

from ..core import ClientTlsSettings, Settings, TlsConfigError, ValidationFailed, first_problem
from ..core.models import Registration
from ..delivery import BreakerSettings, DeliverySettings

DEFAULT_NODE_TIMEOUT_MS = 5_000
# One agent's client sees only its own calls: it opens a breaker on fewer failures than the node,
# which counts the whole region's reports.
DEFAULT_CLIENT_BREAKER_FAILURES = 5
DEFAULT_REPORT_BATCH_SIZE = 100
DEFAULT_REPORT_FLUSH_INTERVAL_MS = 1_000
DEFAULT_REPORT_QUEUE_LIMIT = 10_000
# A ticket's weights are the node's load figures when it was issued, and agents report load every
# second: reused longer, the draw spreads calls by stale load (bench/routing.py measures it).
DEFAULT_TICKET_REUSE_MS = 1_000
DEFAULT_SIDECAR_PROBE_INTERVAL_MS = 2_000
DEFAULT_SIDECAR_PROBE_TIMEOUT_MS = 1_000
DEFAULT_SIDECAR_FAILURE_THRESHOLD = 3
DEFAULT_SIDECAR_SUCCESS_THRESHOLD = 2
DEFAULT_SIDECAR_MAX_BODY_BYTES = 16 * 1024 * 1024
TOKEN_ENV = "AGENT_REACH_TOKEN"
URL_ENV = "AGENT_REACH_URL"


class AgentConfigError(ValidationFailed):
    """The agent configuration (TOML file or keywords) is invalid; the message names the key."""

    code = "invalid_agent_config"


class ClientSettings(DeliverySettings, BreakerSettings, ClientTlsSettings):
    """How the SDK talks to the node and to other agents (``[client]``).

    Timeouts, retries, hops and the answer's cap are :class:`~node.delivery.DeliverySettings` (the
    proxy's too, with other defaults), the breakers :class:`~node.delivery.BreakerSettings`, what
    https is checked against (``ca_file``, and ``client_cert_file``/``client_key_file`` for a node
    that requires client certificates) :class:`~node.core.ClientTlsSettings`.
    """

    breaker_failures: int = BreakerSettings.with_default("breaker_failures", DEFAULT_CLIENT_BREAKER_FAILURES)
    node_timeout_ms: int = Field(default=DEFAULT_NODE_TIMEOUT_MS, ge=1, le=600_000,
                                 description="Total timeout of one request to the registry node.")
    register_max_wait_ms: int | None = Field(default=None, ge=0,
                                             description="Give up registering after this long; None = keep trying.")
    heartbeat_interval_ms: int | None = Field(default=None, ge=50,
                                              description="None = what the node says (lease_ttl / 3).")
    load_report_interval_ms: int | None = Field(
        default=None, ge=100, description="With a load callback: report load this often between heartbeats "
        "(PUT …/load, only when it changed; it stays in the region). None = load goes with heartbeats only.")
    heartbeat_in_thread: bool = Field(default=True, description="Heartbeats on their own thread and event loop, "
                                      "so a handler that blocks the caller's loop cannot starve them.")
    report_outcomes: bool = True
    report_batch_size: int = Field(default=DEFAULT_REPORT_BATCH_SIZE, ge=1, le=500)
    report_flush_interval_ms: int = Field(default=DEFAULT_REPORT_FLUSH_INTERVAL_MS, ge=1)
    report_queue_limit: int = Field(default=DEFAULT_REPORT_QUEUE_LIMIT, ge=1)
    record_traces: bool = Field(default=True, description="Send direct-call deliveries to the node's trace log.")
    semantic: bool = Field(default=True, description="Let the router's semantic fallback pick an agent when none "
                                                     "has the capability by name (call()/resolve() semantic=).")
    ticket_reuse_ms: int = Field(default=DEFAULT_TICKET_REUSE_MS, ge=0,
                                 description="Reuse a route ticket for at most this long (and at most 90 % of its "
                                             "life), drawing each call among its targets; 0: resolve every call.")
    session: bool = Field(default=True, description="Hold one WebSocket per process with the node (GET "
                          "/v1/session): leases renewed and load reported over it, HTTP while it is down; the "
                          "node hears of a dead process at once and pushes when a ticket's target goes.")
    session_ticket_reuse_ms: int | None = Field(
        default=None, ge=0, description="While the session is open (it pushes when a target is drained, "
        "deregistered, ejected or suspect, and the ticket is dropped), reuse a ticket this long instead of "
        "ticket_reuse_ms. None = ticket_reuse_ms.")

    def with_options(self, options: Mapping[str, Any]) -> ClientSettings:
        """These settings with keyword ``options`` (field names) on top; raises AgentConfigError."""
        if not options:
            return self
        try:
            return ClientSettings.model_validate({**self.model_dump(), **options})
        except ValidationError as exc:
            first = first_problem(exc)
            key = first.field or ""
            raise AgentConfigError(f"client option {key}: {first.message}", field=key) from exc


class SidecarSettings(Settings):
    """How the sidecar stands beside the agent (``[sidecar]``; every key optional).

    With ``upstream`` (the agent's own base URL, e.g. ``http://127.0.0.1:8701``) the sidecar is
    on the call path: it listens where ``[agent] endpoints.primary`` points (or at ``listen``),
    verifies each call's route credential (401/403 as ``CallVerifier`` says) and forwards what
    passes to ``upstream`` + the same path, adding ``X-Reach-Caller`` (the verified caller) and
    ``X-Reach-Caller-Role``. Without it, it only registers, probes and heartbeats, and calls go
    straight to the agent, which must verify them itself. Probe URLs default to ``/healthz`` and
    ``/readyz`` on ``upstream``, else on the primary endpoint's host.
    """

    upstream: str | None = Field(default=None, description="The agent's base URL; set it to put the sidecar on "
                                                            "the call path (verifying route credentials).")
    listen: str | None = Field(default=None, pattern=r"^[^\s:]+:\d{1,5}$",
                               description="host:port to listen on with upstream (default: endpoints.primary's)")
    max_body_bytes: int = Field(default=DEFAULT_SIDECAR_MAX_BODY_BYTES, ge=1_024,
                                description="A call's body beyond this is refused (413) before it is forwarded.")
    health_url: str | None = None
    ready_url: str | None = None
    probe_interval_ms: int = Field(default=DEFAULT_SIDECAR_PROBE_INTERVAL_MS, ge=50, le=3_600_000)
    probe_timeout_ms: int = Field(default=DEFAULT_SIDECAR_PROBE_TIMEOUT_MS, ge=10, le=60_000)
    failure_threshold: int = Field(default=DEFAULT_SIDECAR_FAILURE_THRESHOLD, ge=1, le=100)
    success_threshold: int = Field(default=DEFAULT_SIDECAR_SUCCESS_THRESHOLD, ge=1, le=100)

    @field_validator("upstream")
    @classmethod
    def _upstream(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
            raise ValueError("must be the agent's base URL without a path, e.g. http://127.0.0.1:8701")
        return value.rstrip("/")


class NodeSection(Settings):
    """Which node, with which bearer token (``[node]``); at most one token source.

    ``url`` may be left out: the SDK then reads ``$AGENT_REACH_URL``, and the CLI commands
    (``sidecar``, ``preflight``) their ``--node``, ``$AGENT_REACH_URL`` or the local cluster's
    first node.
    """

    url: str | None = None
    token: str | None = Field(default=None, repr=False)
    token_file: str | None = None
    token_env: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be the node's base URL, e.g. http://127.0.0.1:7101")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _one_token_source(self) -> NodeSection:
        sources = [name for name in ("token", "token_file", "token_env") if getattr(self, name)]
        if len(sources) > 1:
            raise ValueError(f"give one of token, token_file or token_env, not {' and '.join(sources)}")
        return self


class AgentConfig(Settings):
    """A whole agent TOML file. ``agent`` may be absent for a pure caller."""

    node: NodeSection = Field(default_factory=NodeSection)
    agent: Registration | None = None
    client: ClientSettings = Field(default_factory=ClientSettings)
    sidecar: SidecarSettings = Field(default_factory=SidecarSettings)
    source: str | None = Field(default=None, exclude=True, description="Where this config was read from.")

    def resolve_token(self) -> str:
        """The bearer token from ``token``, ``token_file``, ``token_env`` or ``$AGENT_REACH_TOKEN``.

        Raises :class:`AgentConfigError` saying which source was tried when none yields a token.
        """
        node = self.node
        if node.token:
            return node.token.strip()
        if node.token_file:
            path = Path(node.token_file).expanduser()
            if not path.is_absolute() and self.source:
                path = Path(self.source).parent / path
            try:
                text = path.read_text().strip()
            except OSError as exc:
                raise AgentConfigError(f"node.token_file {path} cannot be read: {exc.strerror}",
                                       field="node.token_file") from exc
            if not text:
                raise AgentConfigError(f"node.token_file {path} is empty", field="node.token_file")
            return text.splitlines()[0].strip()
        variable = node.token_env or TOKEN_ENV
        value = os.environ.get(variable, "").strip()
        if not value:
            raise AgentConfigError(f"no token: set ${variable}, or node.token / node.token_file in the config "
                                   "('agent-reach token issue --agent AGENT_ID' prints one)", field="node.token")
        return value

    def sidecar_urls(self) -> tuple[str, str]:
        """The (health, ready) URLs the sidecar probes."""
        if self.agent is None:
            raise AgentConfigError("the sidecar needs an [agent] section", field="agent")
        base = self.sidecar.upstream or _origin(self.agent.endpoints["primary"])
        return (self.sidecar.health_url or f"{base}/healthz", self.sidecar.ready_url or f"{base}/readyz")


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def tls_context(settings: ClientTlsSettings) -> ssl.SSLContext | bool:
    """The ``ssl=`` of the SDK's sessions from ``settings`` (``ca_file``, client certificate), the
    environment filling what they leave unset; raises :class:`AgentConfigError` naming the file."""
    try:
        return settings.with_environment().client_ssl_context()
    except TlsConfigError as exc:
        raise AgentConfigError(f"client {exc}", field=f"client.{exc.setting}") from None


def registration_of(registration: Registration | Mapping[str, Any] | None) -> Registration | None:
    """``registration`` validated (a mapping is parsed); raises AgentConfigError naming the field."""
    if registration is None or isinstance(registration, Registration):
        return registration
    try:
        return Registration.model_validate(dict(registration))
    except ValidationError as exc:
        first = first_problem(exc)
        key = first.field or ""
        raise AgentConfigError(f"registration {key}: {first.message}", field=key) from exc


def parse_agent_config(data: dict[str, Any], *, source: str | None = None) -> AgentConfig:
    """Validate a decoded config; raises :class:`AgentConfigError` naming the first bad key."""
    try:
        return AgentConfig.model_validate({**data, "source": source})
    except ValidationError as exc:
        first = first_problem(exc)
        key = first.field or ""
        message = f"unknown key {key!r}" if first.kind == "extra_forbidden" else f"{key}: {first.message}"
        where = f" in {source}" if source else ""
        raise AgentConfigError(f"{message}{where}", field=key) from exc


def load_agent_config(path: str | os.PathLike[str]) -> AgentConfig:
    """Read and validate an agent TOML file; raises :class:`AgentConfigError`."""
    file = Path(path).expanduser()
    try:
        data = tomllib.loads(file.read_text())
    except OSError as exc:
        raise AgentConfigError(f"cannot read {file}: {exc.strerror}", field=None) from exc
    except tomllib.TOMLDecodeError as exc:
        raise AgentConfigError(f"{file} is not valid TOML: {exc}", field=None) from exc
    return parse_agent_config(data, source=str(file))


__all__ = ["TOKEN_ENV", "URL_ENV", "AgentConfig", "AgentConfigError", "ClientSettings", "NodeSection",
           "SidecarSettings", "load_agent_config", "parse_agent_config", "registration_of", "tls_context"]
