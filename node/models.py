"""Boundary models of a regional node: registrations, records, routing, change events, errors.

Every model that crosses a boundary (HTTP body, Redis value, Kafka event) is a pydantic v2
model with ``extra="forbid"``, so an unknown or mistyped field is a 4xx naming the field.
Whatever a route accepts must read back from Redis, the change stream, Kafka and JSON
encoders, so the models admit only what every one of them can carry: finite floats, integers
within int64, text without control characters (descriptions may hold tabs and line breaks),
URLs without whitespace. HTTP bodies are parsed in strict mode (``"5000"`` is not an integer,
``true`` is not a weight: see ``node.http.parse_body``). This module does no I/O.
"""

from __future__ import annotations

import enum
import fnmatch
import math
import re
from functools import lru_cache
from typing import Annotated, Literal
from urllib.parse import urlsplit

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_LEASE_TTL_MS = 30_000
MIN_LEASE_TTL_MS = 1_000
MAX_LEASE_TTL_MS = 3_600_000
DEFAULT_WEIGHT = 100
DEFAULT_PROBE_INTERVAL_MS = 5_000
DEFAULT_PROBE_TIMEOUT_MS = 1_000
DEFAULT_FAILURE_THRESHOLD = 3
DEFAULT_SUCCESS_THRESHOLD = 2

_SEGMENT = r"[a-z0-9_-]+"
AGENT_ID_PATTERN = rf"^{_SEGMENT}\.{_SEGMENT}\.{_SEGMENT}$"
AGENT_ID_RE = re.compile(AGENT_ID_PATTERN)
_PATTERN_SEGMENT = r"[a-z0-9_*-]+"
AGENT_PATTERN_RE = re.compile(rf"^{_PATTERN_SEGMENT}\.{_PATTERN_SEGMENT}\.{_PATTERN_SEGMENT}$")
CAPABILITY_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.:/-]{0,127}$"
LABEL_KEY_PATTERN = r"^[a-z0-9][a-z0-9_./-]{0,62}$"
REGION_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
TRANSPORT_PATTERN = r"^[a-z][a-z0-9+_-]{0,31}$"
TRACE_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,100}$"

INT64_MAX = 2**63 - 1
# One line of text: no C0/C1 control characters, no Unicode line or paragraph separators.
SINGLE_LINE_PATTERN = "^[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]*$"
# Prose: tabs and line breaks allowed, other control characters not.
MULTI_LINE_PATTERN = "^[^\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f]*$"
_URL_FORBIDDEN_RE = re.compile(r"[\x00-\x20\x7f-\x9f\u2028\u2029]")
MAX_JSON_DEPTH = 32

AgentId = Annotated[str, Field(pattern=AGENT_ID_PATTERN, max_length=200, examples=["payment.risk_check.prod_01"])]
Region = Annotated[str, Field(pattern=REGION_PATTERN, max_length=63)]
ShortText = Annotated[str, Field(max_length=200, pattern=SINGLE_LINE_PATTERN)]
LongText = Annotated[str, Field(max_length=4_000, pattern=MULTI_LINE_PATTERN)]
Millis = Annotated[int, Field(ge=0, le=INT64_MAX, description="ms since the epoch")]
EndpointName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]


class Strict(BaseModel):
    """Base of every boundary model: unknown fields are errors, floats are finite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _check_url(value: str, *, schemes: tuple[str, ...] = ("http", "https")) -> str:
    if _URL_FORBIDDEN_RE.search(value):
        raise ValueError("must not contain whitespace or control characters")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise ValueError(f"is not a valid URL: {exc}") from None
    if parts.scheme not in schemes or not parts.hostname:
        raise ValueError(f"must be an absolute URL with scheme {' or '.join(schemes)}")
    return value


def check_json_value(value: object, *, _depth: int = 0) -> object:
    """Free-form JSON (payloads, extensions) limited to what every encoder carries.

    Integers must fit int64 and floats be finite (orjson, Redis and Kafka consumers all
    refuse or mangle the rest); nesting is bounded.
    """
    if _depth > MAX_JSON_DEPTH:
        raise ValueError(f"is nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        if not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise ValueError("holds an integer outside the 64-bit range")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("holds NaN or an infinite number")
        return value
    if isinstance(value, list):
        for item in value:
            check_json_value(item, _depth=_depth + 1)
        return value
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError("holds an object key that is not a string")
            check_json_value(item, _depth=_depth + 1)
        return value
    raise ValueError(f"holds a {type(value).__name__}, which is not JSON")


JsonValue = Annotated[object, AfterValidator(check_json_value)]


def parse_version(text: str) -> Version:
    """Parse a capability version; ``v1`` and ``1`` are the same version."""
    try:
        return Version(text.strip().lstrip("vV"))
    except InvalidVersion as exc:
        raise ValueError(f"{text!r} is not a version (use e.g. '1', 'v2' or '1.4.0')") from exc


class VersionConstraint:
    """What a caller accepts: ``1`` / ``v1.2`` (same major, at least that) or a PEP 440 set."""

    __slots__ = ("text", "_major", "_minimum", "_specifiers")

    def __init__(self, text: str) -> None:
        self.text = text
        self._major: int | None = None
        self._minimum: Version | None = None
        self._specifiers: SpecifierSet | None = None
        stripped = text.strip()
        if stripped[:1] in "<>=!~":
            try:
                self._specifiers = SpecifierSet(stripped)
            except InvalidSpecifier as exc:
                raise ValueError(f"{text!r} is not a version constraint (e.g. '1', '>=1.2,<3')") from exc
        else:
            self._minimum = parse_version(stripped)
            self._major = self._minimum.major

    def accepts(self, version: Version) -> bool:
        if self._specifiers is not None:
            return self._specifiers.contains(version, prereleases=True)
        return version.major == self._major and version >= self._minimum  # type: ignore[operator]


@lru_cache(maxsize=4096)
def version_constraint(text: str) -> VersionConstraint:
    """A parsed (and cached: constraints repeat across requests) version constraint."""
    return VersionConstraint(text)


@lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> re.Pattern[str]:
    """``payment.risk_check.*`` → a regex; ``*`` matches within one segment only."""
    if not AGENT_PATTERN_RE.match(pattern):
        raise ValueError("must look like namespace.group.name with '*' wildcards, e.g. 'payment.*.*'")
    regex = fnmatch.translate(pattern).replace(".*", "[^.]*")
    return re.compile(regex)


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

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _check_url(value)


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
        description="Caller patterns allowed to resolve this agent ('payment.*.*', 'admin'); empty = anyone.",
    )
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
                _check_url(url, schemes=("http", "https", "grpc", "grpcs", "ws", "wss"))
            except ValueError as exc:
                raise ValueError(f"endpoint {name!r}: {exc}") from None
        return value

    @field_validator("callback_endpoint")
    @classmethod
    def _callback(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value)

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


class HeartbeatResponse(Strict):
    agent_id: AgentId
    version: int
    lease_expires_at_ms: int
    changed: bool


class ChangeKind(str, enum.Enum):
    UPSERT = "upsert"
    STATUS = "status"
    DELETE = "delete"


class DeleteReason(str, enum.Enum):
    DEREGISTERED = "deregistered"
    EXPIRED = "expired"
    EVICTED = "evicted"
    QUARANTINED = "quarantined"   # its stored record does not parse (see node.quarantine)


class ChangeEvent(Strict):
    """One entry of a region's change stream (and, later, of its Kafka topic).

    A delete carries no record, but keeps the ``allowed_callers`` of the record it removed, so
    a watcher who may not see the agent does not see its tombstone either.
    """

    kind: ChangeKind
    region: Region
    version: Count
    agent_id: AgentId
    at_ms: Millis
    record: AgentRecord | None = None
    reason: DeleteReason | None = None
    allowed_callers: list[Annotated[str, Field(max_length=200)]] | None = Field(
        default=None, max_length=64, description="Deletes only: who could see the removed record.")

    @property
    def audience(self) -> list[str]:
        """``allowed_callers`` of the record this change is about (empty = anyone)."""
        if self.record is not None:
            return self.record.allowed_callers
        return self.allowed_callers or []


class Scope(str, enum.Enum):
    LOCAL = "local"
    LOCAL_FIRST = "local-first"
    GLOBAL = "global"


class RouteRequest(Strict):
    """Ask for one agent by capability, agent_id or name pattern."""

    capability: str | None = Field(default=None, max_length=500, pattern=SINGLE_LINE_PATTERN)
    version: str | None = Field(default=None, max_length=100, pattern=SINGLE_LINE_PATTERN,
                                description="'1', 'v2', '>=1.2,<3'")
    agent_id: AgentId | None = None
    pattern: str | None = Field(default=None, max_length=200)
    conversation_id: str | None = Field(default=None, max_length=200, pattern=SINGLE_LINE_PATTERN)
    labels: dict[Annotated[str, Field(max_length=63)], ShortText] = Field(default_factory=dict, max_length=32)
    preferred_region: Region | None = None
    scope: Scope = Scope.LOCAL_FIRST
    semantic: bool = True
    exclude: list[AgentId] = Field(default_factory=list, max_length=64)
    trace_id: str | None = Field(default=None, pattern=TRACE_ID_PATTERN,
                                 description="Join a collaboration's trace: the decision is recorded in it.")

    @field_validator("version")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        if value is not None:
            version_constraint(value)
        return value

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is not None:
            compile_pattern(value)
        return value

    @model_validator(mode="after")
    def _one_selector(self) -> RouteRequest:
        chosen = [name for name in ("capability", "agent_id", "pattern") if getattr(self, name)]
        if not chosen:
            raise ValueError("give one of capability, agent_id or pattern")
        return self


class MatchKind(str, enum.Enum):
    EXACT = "exact"
    PATTERN = "pattern"
    AGENT_ID = "agent_id"
    SEMANTIC = "semantic"


class Locality(str, enum.Enum):
    LOCAL = "local"
    REMOTE = "remote"


class RouteTarget(Strict):
    agent_id: AgentId
    region: Region
    endpoint: str
    transport: str
    callback_endpoint: str | None = None
    locality: Locality = Locality.LOCAL
    stale: bool = False


class Match(Strict):
    kind: MatchKind
    capability: str | None = None
    version: str | None = None
    score: float = 1.0


class RouteTicket(Strict):
    """A signed routing decision: call ``target`` directly, fail over to ``alternates``."""

    ticket_id: str
    trace_id: str
    target: RouteTarget
    alternates: list[RouteTarget] = Field(default_factory=list)
    match: Match
    locality: Locality
    issued_at_ms: int
    expires_at_ms: int
    caller: str
    signature: str = Field(description="Opaque token; send it back with outcome reports.")


class Outcome(str, enum.Enum):
    SUCCESS = "success"
    FAILURE = "failure"
    TIMEOUT = "timeout"
    REJECTED = "rejected"


class OutcomeReport(Strict):
    """What happened when the caller used a ticket."""

    signature: str = Field(max_length=4_000, description="The ticket's signature.")
    agent_id: AgentId = Field(description="Which of the ticket's targets was called.")
    outcome: Outcome
    latency_ms: float | None = Field(default=None, ge=0, le=1e12)


class OutcomeReports(Strict):
    reports: list[OutcomeReport] = Field(min_length=1, max_length=500)


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


class SearchHit(Strict):
    """One agent found by a natural-language search, with why it matched."""

    agent_id: AgentId
    region: Region
    locality: Locality
    capability: str | None = Field(description="The capability that matched; null when the description did.")
    score: float = Field(description="The final (fused) score used for ranking and thresholds.")
    vector_score: float | None = Field(description="Cosine similarity; null in lexical mode.")
    lexical_score: float
    routable: bool
    display_name: str = ""


class SearchResponse(Strict):
    query: str
    mode: Literal["hybrid", "lexical"]
    scope: Scope
    hits: list[SearchHit]
    took_ms: float


class ErrorBody(Strict):
    error: str = Field(description="snake_case code, e.g. no_agent_available")
    message: str
    field: str | None = None
    details: dict[str, object] | None = None


class TokenRole(str, enum.Enum):
    """admin: anything; agent: act for its own agent_id; caller: resolve, search, send, report;
    peer: another region's node (snapshot and vectors, which show every record)."""

    ADMIN = "admin"
    AGENT = "agent"
    CALLER = "caller"
    PEER = "peer"


class TokenClaims(Strict):
    """What a bearer token asserts; signed with the cluster secret."""

    sub: str = Field(max_length=200, pattern=SINGLE_LINE_PATTERN)
    role: TokenRole
    exp: Count = Field(description="Expiry, seconds since the epoch.")
    iat: Count


