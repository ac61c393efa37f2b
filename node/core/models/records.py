"""Registrations and records: what an agent sends to register and heartbeat, and what the
region stores of it (:class:`AgentRecord`), listed and snapshotted. This module does no I/O.
"""

from __future__ import annotations

import enum
from typing import Annotated, Literal

from packaging.version import Version
from pydantic import Field, field_validator, model_validator

from .access import CallerPatterns
from .cards import CardListing
from .fields import (
    CAPABILITY_NAME_PATTERN,
    LABEL_KEY_PATTERN,
    MULTI_LINE_PATTERN,
    SINGLE_LINE_PATTERN,
    TRANSPORT_PATTERN,
    AgentId,
    Count,
    EndpointName,
    LongText,
    Millis,
    Region,
    ShortText,
    Strict,
    check_url,
    compile_pattern,
)
from .versions import parse_version

DEFAULT_LEASE_TTL_MS = 30_000
MIN_LEASE_TTL_MS = 1_000
MAX_LEASE_TTL_MS = 3_600_000
DEFAULT_WEIGHT = 100
DEFAULT_PROBE_INTERVAL_MS = 5_000
DEFAULT_PROBE_TIMEOUT_MS = 1_000
DEFAULT_FAILURE_THRESHOLD = 3
DEFAULT_SUCCESS_THRESHOLD = 2


class Status(str, enum.Enum):
    """What an agent says of itself in heartbeats."""

    READY = "ready"
    DEGRADED = "degraded"
    BUSY = "busy"
    DRAINING = "draining"
    UNREADY = "unready"


ROUTABLE_STATUSES = frozenset({Status.READY, Status.DEGRADED, Status.BUSY})


class Capability(Strict):
    """One thing an agent can do, e.g. ``translate.text`` version ``2``."""

    name: str = Field(pattern=CAPABILITY_NAME_PATTERN, examples=["translate.text"])
    version: str = Field(default="1", max_length=40, pattern=SINGLE_LINE_PATTERN)
    description: LongText = ""
    tags: list[Annotated[str, Field(max_length=64, pattern=SINGLE_LINE_PATTERN)]] = Field(
        default_factory=list, max_length=32)
    examples: list[Annotated[str, Field(max_length=500, pattern=MULTI_LINE_PATTERN)]] = Field(
        default_factory=list, max_length=16)
    allowed_callers: CallerPatterns = Field(
        default_factory=list,
        description="Caller patterns allowed to be routed to this capability, besides the agent's own "
                    "allowed_callers ('payment.*.*', 'admin'); empty = whoever may see the agent.")

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        parse_version(value)
        return value

    @property
    def parsed_version(self) -> Version:
        return parse_version(self.version)


class Probe(Strict):
    """An HTTP probe the node runs against the agent (2xx = success)."""

    url: str = Field(max_length=2_000)
    interval_ms: int = Field(default=DEFAULT_PROBE_INTERVAL_MS, ge=100, le=3_600_000)
    timeout_ms: int = Field(default=DEFAULT_PROBE_TIMEOUT_MS, ge=10, le=60_000)
    failure_threshold: int = Field(default=DEFAULT_FAILURE_THRESHOLD, ge=1, le=100)
    success_threshold: int = Field(default=DEFAULT_SUCCESS_THRESHOLD, ge=1, le=100)
    accept: Literal["2xx", "listening"] = Field(
        default="2xx", description="2xx: only a 2xx answer is a success. listening: any answer below 500, or a "
                                   "server that accepted the connection and speaks another protocol (gRPC), is "
                                   "one — the probe of an A2A interface, which need not answer a GET.")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_url(value)


class Load(Strict):
    """Load an agent reports with its heartbeat."""

    queued: Count = 0
    inflight: Count = 0
    rps: float = Field(default=0.0, ge=0.0, le=1e15)


class Registration(Strict):
    """What an agent sends to register (an idempotent upsert by agent_id)."""

    agent_id: AgentId
    display_name: ShortText = ""
    description: LongText = ""
    capabilities: list[Capability] = Field(default_factory=list, max_length=64)
    endpoints: dict[EndpointName, Annotated[str, Field(max_length=2_000)]] = Field(
        description="Named endpoints; 'primary' is required.", examples=[{"primary": "http://127.0.0.1:9000"}],
        min_length=1, max_length=16)
    callback_endpoint: str | None = Field(default=None, max_length=2_000)
    transport: str = Field(default="http+token", pattern=TRANSPORT_PATTERN)
    liveness_probe: Probe | None = None
    readiness_probe: Probe | None = None
    lease_ttl_ms: int = Field(default=DEFAULT_LEASE_TTL_MS, ge=MIN_LEASE_TTL_MS, le=MAX_LEASE_TTL_MS)
    labels: dict[Annotated[str, Field(pattern=LABEL_KEY_PATTERN)], ShortText] = Field(
        default_factory=dict, max_length=64
    )
    weight: int = Field(default=DEFAULT_WEIGHT, ge=0, le=10_000)
    max_concurrency: int | None = Field(default=None, ge=1, le=1_000_000)
    allowed_callers: list[Annotated[str, Field(max_length=200, pattern=SINGLE_LINE_PATTERN)]] = Field(
        default_factory=list,
        max_length=64,
        description="Caller patterns allowed to resolve and call this agent ('payment.*.*', 'admin'); empty = "
                    "anyone. The router enforces it, and so does the agent when it verifies route credentials.",
    )
    semantic_fallback: bool = Field(
        default=True, description="False: the router's semantic fallback never picks this agent; it is reached "
                                  "by capability name, pattern or agent_id only.")
    status: Status = Status.READY

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, value: dict[str, str]) -> dict[str, str]:
        if "primary" not in value:
            raise ValueError("an endpoint named 'primary' is required")
        if len(value) > 16:
            raise ValueError("at most 16 endpoints")
        for name, url in value.items():
            try:
                check_url(url, schemes=("http", "https", "grpc", "grpcs", "ws", "wss"))
            except ValueError as exc:
                raise ValueError(f"endpoint {name!r}: {exc}") from None
        return value

    @field_validator("callback_endpoint")
    @classmethod
    def _callback(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value)

    @field_validator("allowed_callers")
    @classmethod
    def _callers(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if pattern != "admin":
                compile_pattern(pattern)
        return value

    @model_validator(mode="after")
    def _unique_capabilities(self) -> Registration:
        seen = set()
        for capability in self.capabilities:
            key = (capability.name, capability.parsed_version.major)
            if key in seen:
                raise ValueError(f"capability {capability.name!r} major version {key[1]} is listed twice")
            seen.add(key)
        return self


class AgentRecord(Registration):
    """A registration as the region stores it, with what the node adds."""

    region: Region
    version: Count = Field(default=0, description="Monotonic per region; bumped by every change.")
    load: Load = Field(default_factory=Load)
    registered_at_ms: Millis = 0
    updated_at_ms: Millis = 0
    lease_expires_at_ms: Millis = 0
    live: bool = Field(default=True, description="Liveness probe verdict (true when there is no probe).")
    ready: bool = Field(default=True, description="Readiness probe verdict (true when there is no probe).")
    probe_error: str | None = None
    a2a: CardListing | None = Field(default=None, description="Registered from an A2A Agent Card: the card as "
                                                                "given (POST /v1/agent-cards).")

    def leased(self, now_ms: int) -> bool:
        return self.lease_expires_at_ms > now_ms

    @property
    def routable_state(self) -> bool:
        """Live, ready and in a status that takes traffic (the lease is checked separately)."""
        return self.live and self.ready and self.status in ROUTABLE_STATUSES


class RegisterResponse(Strict):
    agent_id: AgentId
    region: Region
    version: int
    lease_expires_at_ms: int
    heartbeat_interval_ms: int


class Heartbeat(Strict):
    """Lease renewal; optional status and load."""

    status: Status | None = None
    load: Load | None = None


class AgentChange(Strict):
    """``PATCH /v1/admin/agents/{agent_id}``: an admin sets an agent's status (``draining`` takes
    it out of routing) or its routing weight; at least one of them."""

    status: Status | None = Field(default=None, description="The agent's new status; the agent's own next "
                                                             "heartbeat that names a status, or its next "
                                                             "registration, replaces it.")
    weight: int | None = Field(default=None, ge=0, le=10_000, description="The routing weight (0: no traffic).")
    reason: str | None = Field(default=None, max_length=200, pattern=SINGLE_LINE_PATTERN,
                               description="Why, for the decision log.")

    @model_validator(mode="after")
    def _something(self) -> AgentChange:
        if self.status is None and self.weight is None:
            raise ValueError("give status or weight (or both)")
        return self


class HeartbeatResponse(Strict):
    agent_id: AgentId
    version: int
    lease_expires_at_ms: int
    changed: bool = Field(description="The record changed (a new status): a new version, an event for peers. "
                                      "A new load alone is no change (it stays in the region).")


class LoadReportResponse(Strict):
    """Answer to ``PUT /v1/agents/{agent_id}/load``: the load is stored (no lease moved)."""

    agent_id: AgentId
    at_ms: int


class AgentList(Strict):
    agents: list[AgentRecord]
    region: Region
    count: int


class Snapshot(Strict):
    """Live records of a region plus its watermark version (anti-entropy)."""

    region: Region
    watermark: int
    taken_at_ms: int
    agents: list[AgentRecord]
