"""Boundary models of a regional node: registrations, records, routing, change events, errors.

Every model that crosses a boundary (HTTP body, Redis value, Kafka event) is a pydantic v2
model with ``extra="forbid"``, so an unknown or mistyped field is a 4xx naming the field. What
another version of this code wrote (stored records, change events, peers' and the node's answers
to the SDK) is read through ``compat``, which drops the fields this version does not know.
Whatever a route accepts must read back from Redis, the change stream, Kafka and JSON
encoders, so the models admit only what every one of them can carry: finite floats, integers
within int64, text without control characters (descriptions may hold tabs and line breaks),
URLs without whitespace. HTTP bodies are parsed in strict mode (``"5000"`` is not an integer,
``true`` is not a weight: see ``node.http.parse_body``). No module of this package does I/O (``compat``
logs the first drop of each field).

One concept per module, every name importable from here (``from node.core.models import X``)::

    fields     identifier patterns, bounded text and numbers, URLs, free-form JSON, Strict
    versions   capability versions and version constraints
    cards      an agent registered from its A2A card (the card as given)
    records    registrations, heartbeats and the records a region stores, lists, snapshots
    changes    one change of a region (ChangeEvent)
    routing    route requests, route tickets, alternates' credentials, outcome reports
    search     natural-language search answers
    sessions   the frames of a session (GET /v1/session), both ways
    summaries  a region's per-capability summary (what peers route by)
    tokens     token claims and roles, route-credential claims, who may call, the JSON error body
    compat     reading what a newer version wrote: unknown fields dropped and counted
"""

from __future__ import annotations

from . import compat
from .cards import (
    BINDING_TRANSPORTS,
    DEFAULT_PROTOCOL_VERSION,
    PROTOCOL_VERSION_LABEL,
    TRANSPORT_BINDINGS,
    CardListing,
    a2a_interface,
)
from .changes import ChangeEvent, ChangeKind, DeleteReason
from .fields import (
    AGENT_ID_PATTERN,
    AGENT_ID_RE,
    AGENT_PATTERN_RE,
    CAPABILITY_NAME_PATTERN,
    ENDPOINT_NAME_PATTERN,
    INT64_MAX,
    LABEL_KEY_PATTERN,
    MAX_JSON_DEPTH,
    MULTI_LINE_PATTERN,
    NOT_IN_ONE_LINE,
    REGION_PATTERN,
    SINGLE_LINE_PATTERN,
    TRACE_ID_PATTERN,
    TRANSPORT_PATTERN,
    AgentId,
    Count,
    EndpointName,
    JsonValue,
    LongText,
    Millis,
    Region,
    ShortText,
    Strict,
    check_json_value,
    check_url,
    compile_pattern,
)
from .records import (
    DEFAULT_FAILURE_THRESHOLD,
    DEFAULT_LEASE_TTL_MS,
    DEFAULT_PROBE_INTERVAL_MS,
    DEFAULT_PROBE_TIMEOUT_MS,
    DEFAULT_SUCCESS_THRESHOLD,
    DEFAULT_WEIGHT,
    MAX_LEASE_TTL_MS,
    MIN_LEASE_TTL_MS,
    ROUTABLE_STATUSES,
    AgentChange,
    AgentList,
    AgentRecord,
    Capability,
    Heartbeat,
    HeartbeatResponse,
    Load,
    LoadReportResponse,
    Probe,
    RegisterResponse,
    Registration,
    Snapshot,
    Status,
)
from .routing import (
    CredentialRequest,
    IssuedCredential,
    Locality,
    Match,
    MatchKind,
    Outcome,
    OutcomeReport,
    OutcomeReports,
    RouteRequest,
    RouteTarget,
    RouteTicket,
    Scope,
)
from .access import (
    ACL_RULE_ID_PATTERN,
    MAX_ACL_RULES,
    AclEffect,
    AclEntry,
    AclList,
    AclRule,
    CallerPatterns,
    caller_matches,
)
from .search import SearchHit, SearchResponse
from .sessions import (
    CLIENT_FRAMES,
    MAX_FRAME_ITEMS,
    Beat,
    ClientFrame,
    Gone,
    Join,
    JoinAgent,
    Joined,
    Leave,
    LoadItem,
    Loads,
    Renew,
    SessionAnswer,
    Watch,
)
from .summaries import CapabilitySummary, RegionSummary, SummaryView
from .tokens import (
    KEY_ID_PATTERN,
    MAX_KEY_SET_BYTES,
    MAX_REGION_KEYS,
    MAX_TOKEN_EXPIRY_S,
    TOKEN_ID_PATTERN,
    CallClaims,
    ErrorBody,
    Forwarding,
    KeySet,
    PublicKey,
    RevocationRequest,
    TokenClaims,
    TokenRole,
    caller_may_call,
    key_region,
    usable_keys,
)
from .versions import VersionConstraint, parse_version, version_constraint

__all__ = [
    "ACL_RULE_ID_PATTERN", "MAX_ACL_RULES", "AclEffect", "AclEntry", "AclList", "AclRule", "CallerPatterns",
    "caller_matches",
    "CLIENT_FRAMES", "MAX_FRAME_ITEMS", "Beat", "ClientFrame", "Gone", "Join", "JoinAgent", "Joined", "Leave",
    "LoadItem", "Loads", "Renew", "SessionAnswer", "Watch",
    "BINDING_TRANSPORTS", "CardListing", "DEFAULT_PROTOCOL_VERSION", "PROTOCOL_VERSION_LABEL", "TRANSPORT_BINDINGS",
    "a2a_interface",
    "AGENT_ID_PATTERN", "AGENT_ID_RE", "AGENT_PATTERN_RE", "AgentChange", "AgentId", "AgentList", "AgentRecord",
    "CAPABILITY_NAME_PATTERN", "CallClaims", "Capability", "CapabilitySummary", "CredentialRequest", "IssuedCredential", "ChangeEvent", "ChangeKind", "Count", "DEFAULT_FAILURE_THRESHOLD",
    "DEFAULT_LEASE_TTL_MS", "DEFAULT_PROBE_INTERVAL_MS", "DEFAULT_PROBE_TIMEOUT_MS", "DEFAULT_SUCCESS_THRESHOLD",
    "DEFAULT_WEIGHT", "DeleteReason", "EndpointName", "ErrorBody", "Forwarding", "Heartbeat", "HeartbeatResponse", "LoadReportResponse", "INT64_MAX",
    "JsonValue", "KEY_ID_PATTERN", "MAX_KEY_SET_BYTES", "MAX_REGION_KEYS", "KeySet", "LABEL_KEY_PATTERN", "Load", "Locality", "LongText", "MAX_JSON_DEPTH", "MAX_LEASE_TTL_MS",
    "MIN_LEASE_TTL_MS", "MULTI_LINE_PATTERN", "Match", "MatchKind", "Millis", "Outcome", "OutcomeReport",
    "OutcomeReports", "Probe", "PublicKey", "REGION_PATTERN", "ROUTABLE_STATUSES", "Region", "RegisterResponse", "Registration",
    "RegionSummary", "RevocationRequest", "RouteRequest", "RouteTarget", "RouteTicket", "SINGLE_LINE_PATTERN", "Scope", "SearchHit",
    "SearchResponse", "ShortText", "Snapshot", "Status", "Strict", "SummaryView", "TOKEN_ID_PATTERN", "TRACE_ID_PATTERN", "TRANSPORT_PATTERN", "TokenClaims", "TokenRole",
    "ENDPOINT_NAME_PATTERN", "NOT_IN_ONE_LINE", "check_url", "MAX_TOKEN_EXPIRY_S",
    "VersionConstraint", "caller_may_call", "compat", "check_json_value", "compile_pattern", "key_region", "parse_version", "usable_keys", "version_constraint",
]
