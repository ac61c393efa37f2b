"""The OpenAPI 3.2 document of the v1 API, generated from the boundary models.

The document states what the node enforces, so that a request valid by it is accepted and
every answer conforms to it (``tests/test_fuzz.py`` runs schemathesis against a live node to
hold it to that):

* **Bodies** are the pydantic models' JSON schemas (validation mode), refined here with what
  their validators check but pydantic cannot write into a schema: URL syntax, PEP 440 versions
  and constraints, caller patterns, ``primary`` among the endpoints, dictionary keys outside
  the key pattern, bounded free-form JSON, "one of capability, agent_id or pattern" — and, for
  an A2A card, what the registration made from it must satisfy (see ``_CARD_REFINEMENTS``).
  What no schema can say is in the descriptions: two capabilities (or card skills) that give
  the same name and major version are a 422; an envelope past ``expire_at_ms`` is a 410.
* **Parameters** carry their patterns, ranges and enums (``agent_id`` is ``namespace.group.name``).
* **Responses** are listed per operation: exactly the statuses it can answer, each error with
  :class:`~node.models.ErrorBody`; ``/v1/watch`` documents each server-sent event (``hello``,
  ``change`` with a :class:`~node.models.ChangeEvent`, ``overflow``) with ``itemSchema``.
* **Routes** are the ones the node serves: ``build_openapi(region, served=…)`` drops what an
  attachment did not add (``/v1/federation/status`` without federation, the vectors route
  without discovery).

Answers the handlers write as dictionaries are described by the small models below; the fuzz
test fails when a handler and its model drift apart.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from .a2a import CardRegistration
from .envelope import DEFAULT_MAX_HOPS, Envelope, Policy, RouteEvents, SendAccepted, Trace
from .models import (
    AGENT_ID_PATTERN,
    INT64_MAX,
    LABEL_KEY_PATTERN,
    MULTI_LINE_PATTERN,
    SINGLE_LINE_PATTERN,
    TRACE_ID_PATTERN,
    AgentList,
    AgentRecord,
    ChangeEvent,
    ErrorBody,
    Heartbeat,
    HeartbeatResponse,
    OutcomeReport,
    OutcomeReports,
    RegisterResponse,
    Registration,
    RouteRequest,
    RouteTicket,
    Scope,
    SearchResponse,
    Snapshot,
)
from .search import DEFAULT_SEARCH_K, MAX_SEARCH_K

OPENAPI_VERSION = "3.2.0"
Schema = dict[str, Any]
Served = frozenset[tuple[str, str]]


# -- shapes of the answers the handlers write as dictionaries --------------------------------


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Deregistered(_Shape):
    """``DELETE /v1/agents/{agent_id}``: the tombstone's region version."""

    agent_id: str
    version: int
    deregistered: Literal[True]


class Accepted(_Shape):
    """How many reports or route events were taken."""

    accepted: int = Field(ge=0)


class Regions(_Shape):
    """``GET /v1/regions``: this node and, with federation, its view of every peer."""

    region: str
    node_id: str
    version: int
    agents: int
    leader: bool
    peers: list[dict[str, Any]] = Field(description="Freshness, lag and counts per peer region (federation only).")


class QuarantinedItem(_Shape):
    """One stored value that did not parse (``node.quarantine``)."""

    source: str
    key: str
    error: str
    agent_id: str | None
    first_seen_ms: int
    last_seen_ms: int
    seen: int


class QuarantineList(_Shape):
    region: str
    count: int
    total: int
    items: list[QuarantinedItem]


class VectorRequest(_Shape):
    """``POST /v1/semantic/vectors``: the cache keys a peer wants (``topology.discovery``)."""

    keys: list[Annotated[str, Field(max_length=200)]] = Field(max_length=1_000)


class VectorResponse(_Shape):
    vectors: dict[str, str] = Field(description="Cache key → base64 of little-endian float32 values.")


class FederationStatus(BaseModel):
    """``GET /v1/federation/status`` (its parts are federation's own counters)."""

    model_config = ConfigDict(extra="allow")

    region: str
    topic: str
    watermark: int
    live_count: int
    digest: str
    publisher: dict[str, Any]
    consumer: dict[str, Any]
    anti_entropy: dict[str, Any]
    peers: list[dict[str, Any]]


class ExportedInterface(_Shape):
    url: str
    protocolBinding: str
    protocolVersion: str


class ExportedSkill(_Shape):
    id: str
    name: str
    description: str
    tags: list[str]
    examples: list[str]


class ExportedProvider(_Shape):
    organization: str


class ExportedAgentCard(_Shape):
    """The v1.0 A2A Agent Card ``GET /v1/agents/{agent_id}/agent-card.json`` writes."""

    name: str
    description: str
    version: str
    supportedInterfaces: list[ExportedInterface] = Field(min_length=1)
    capabilities: dict[str, Any]
    defaultInputModes: list[str]
    defaultOutputModes: list[str]
    skills: list[ExportedSkill] = Field(description="Empty for an agent without capabilities.")
    provider: ExportedProvider | None = None


class Health(_Shape):
    status: Literal["ok"]
    region: str
    node_id: str


class Ready(_Shape):
    status: Literal["ready"]
    region: str
    version: int


class Unready(_Shape):
    status: Literal["unready"]
    region: str
    state: str
    store: str


class WatchHello(_Shape):
    """The first event of every watch: the region and the version the node is at."""

    region: str
    version: int


class WatchOverflow(_Shape):
    """The last event of a watcher that fell behind; reconnect with ``since=``."""

    message: str


_MODELS: list[type[BaseModel]] = [
    Registration, RegisterResponse, Heartbeat, HeartbeatResponse, AgentRecord, AgentList, RouteRequest,
    RouteTicket, OutcomeReport, OutcomeReports, Snapshot, ErrorBody, SearchResponse, CardRegistration, Envelope,
    SendAccepted, RouteEvents, Trace, Policy, ChangeEvent, Deregistered, Accepted, Regions, QuarantineList,
    VectorRequest, VectorResponse, FederationStatus, ExportedAgentCard, Health, Ready, Unready, WatchHello,
    WatchOverflow,
]


# -- what the validators check, as JSON Schema ------------------------------------------------


def _any_case(word: str) -> str:
    """A regex matching ``word`` in any letter case (JSON Schema patterns take no flags)."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


def _one_of_words(*words: str) -> str:
    return "(?:" + "|".join(_any_case(word) for word in words) + ")"


# Whitespace that Python's str.strip() removes and a single-line field may hold.
_SPACE = "[ \\u00a0\\u1680\\u2000-\\u200a\\u202f\\u205f\\u3000]*"
_SEP = "[._-]?"
# PEP 440 (packaging.version.VERSION_PATTERN), case-insensitive, without the optional ``v``.
_PEP440 = (
    "(?:[0-9]+!)?[0-9]+(?:\\.[0-9]+)*"
    f"(?:{_SEP}{_one_of_words('alpha', 'a', 'beta', 'b', 'preview', 'pre', 'c', 'rc')}{_SEP}[0-9]*)?"
    f"(?:-[0-9]+|{_SEP}{_one_of_words('post', 'rev', 'r')}{_SEP}[0-9]*)?"
    f"(?:{_SEP}{_any_case('dev')}{_SEP}[0-9]*)?"
    "(?:\\+[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*)?"
)
# node.models.parse_version: whitespace and any number of leading v's are dropped, then
# packaging's Version takes whitespace and one v again.
_VERSION = f"{_SPACE}[vV]*{_SPACE}[vV]?{_PEP440}{_SPACE}"
VERSION_PATTERN = f"^{_VERSION}$"
# node.models.VersionConstraint: a version (same major, at least it), or PEP 440 specifiers.
# The specifier grammar is larger than this (wildcards, ===, pre-releases): what is here is
# accepted, and the description says where the rest is defined.
_SPECIFIER = "(?:~= *[vV]?[0-9]+(?:\\.[0-9]+)+|(?:==|!=|<=|>=|<|>) *[vV]?[0-9]+(?:\\.[0-9]+)*)"
CONSTRAINT_PATTERN = f"^(?:{_SPACE}|{_VERSION}|{_SPACE}{_SPECIFIER}(?: *, *{_SPECIFIER})*{_SPACE})$"
CONSTRAINT_DESCRIPTION = ("'1' or 'v1.2' (same major version, at least that one) or PEP 440 specifiers such as "
                          "'>=1.2,<3'; empty accepts every version")

# IPv6 literals as RFC 3986 writes them (what ipaddress, urllib and yarl read).
_H16 = "[0-9A-Fa-f]{1,4}"
_IPV4 = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])(?:\\.(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])){3}"
_LS32 = f"(?:{_H16}:{_H16}|{_IPV4})"
IPV6_PATTERN = "(?:" + "|".join([
    f"(?:{_H16}:){{6}}{_LS32}",
    f"::(?:{_H16}:){{5}}{_LS32}",
    f"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    f"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    f"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    f"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    f"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    f"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
    f"(?:(?:{_H16}:){{0,6}}{_H16})?::",
]) + ")"
# node.models._check_url, with the host grammar of node.egress: ASCII names (IPv4 literals among
# them) or bracketed IPv6 literals. The egress policy may still refuse an address (a 422
# egress_denied); it also admits internationalised names, which this grammar leaves out.
_HOST = f"(?:[A-Za-z0-9_][A-Za-z0-9_-]{{0,62}}(?:\\.[A-Za-z0-9_][A-Za-z0-9_-]{{0,62}})*\\.?|\\[{IPV6_PATTERN}\\])"
_PORT = "(?::(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?"
_URL_TAIL = "(?:[/?#][^\\x00-\\x20\\x7f-\\x9f\\u2028\\u2029]*)?"


def url_pattern(schemes: Iterable[str]) -> str:
    """Absolute URLs with one of ``schemes``, a host, an optional port, no userinfo, no whitespace."""
    return f"^{_one_of_words(*schemes)}://{_HOST}{_PORT}{_URL_TAIL}$"


def stored_url_pattern(schemes: Iterable[str]) -> str:
    """What a stored URL is sure to be (a record may hold any URL the node accepted)."""
    return f"^{_one_of_words(*schemes)}://[^\\x00-\\x20\\x7f-\\x9f\\u2028\\u2029]+$"


NODE_SCHEMES = ("http", "https")
ENDPOINT_SCHEMES = ("http", "https", "grpc", "grpcs", "ws", "wss")
NODE_URL = {"type": "string", "maxLength": 2_000, "pattern": url_pattern(NODE_SCHEMES),
            "description": "An http(s) URL the node dials (the region's egress policy applies)."}
ENDPOINT_URL = {"type": "string", "maxLength": 2_000, "pattern": url_pattern(ENDPOINT_SCHEMES)}
STORED_NODE_URL = {"type": "string", "maxLength": 2_000, "pattern": stored_url_pattern(NODE_SCHEMES)}
STORED_ENDPOINT_URL = {"type": "string", "maxLength": 2_000, "pattern": stored_url_pattern(ENDPOINT_SCHEMES)}
AGENT_PATTERN = "^[a-z0-9_*-]+\\.[a-z0-9_*-]+\\.[a-z0-9_*-]+$"
CALLER_PATTERN = "^(?:admin|[a-z0-9_*-]+\\.[a-z0-9_*-]+\\.[a-z0-9_*-]+)$"
SINGLE_LINE = {"pattern": SINGLE_LINE_PATTERN}
MULTI_LINE = {"pattern": MULTI_LINE_PATTERN}
SHORT_TEXT = {"type": "string", "maxLength": 200, "pattern": SINGLE_LINE_PATTERN}
LABELS = {"type": "object", "maxProperties": 64, "propertyNames": {"pattern": LABEL_KEY_PATTERN},
          "additionalProperties": SHORT_TEXT}
# node.models.check_json_value: integers within int64, finite numbers, nesting at most 32 deep
# (the depth is not expressible; nothing deeper is accepted).
JSON_VALUE: Schema = {
    "description": "Any JSON value: integers within 64 bits, finite numbers, nested at most 32 levels.",
    "anyOf": [
        {"type": "null"}, {"type": "boolean"}, {"type": "string"},
        {"type": "integer", "minimum": -INT64_MAX - 1, "maximum": INT64_MAX},
        {"type": "number", "not": {"type": "integer"}},
        {"type": "array", "items": {"$ref": "#/components/schemas/JsonValue"}},
        {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/JsonValue"}},
    ],
}
_JSON_REF = {"$ref": "#/components/schemas/JsonValue"}

# Model → field → the property schema that replaces pydantic's (an optional field keeps its null).
_REGISTRATION_REFINEMENTS: dict[str, Schema] = {
    "endpoints": {"type": "object", "required": ["primary"], "minProperties": 1, "maxProperties": 16,
                  "propertyNames": {"pattern": "^[a-z][a-z0-9_-]{0,31}$"}, "additionalProperties": ENDPOINT_URL,
                  "description": "Named endpoints; 'primary' is required.",
                  "examples": [{"primary": "http://127.0.0.1:9000"}]},
    "callback_endpoint": {"anyOf": [NODE_URL, {"type": "null"}], "default": None},
    "labels": {**LABELS, "default": {}},
    "allowed_callers": {"type": "array", "maxItems": 64, "default": [],
                        "items": {"type": "string", "maxLength": 200, "pattern": CALLER_PATTERN},
                        "description": "Caller patterns allowed to see and resolve this agent "
                                       "('payment.*.*', 'admin'); empty = anyone."},
    "capabilities": {"type": "array", "maxItems": 64, "default": [],
                     "items": {"$ref": "#/components/schemas/Capability"},
                     "description": "Two capabilities with the same name and major version are a 422."},
}
# A record is what the node stored: its URLs are described by what every accepted URL is.
_RECORD_REFINEMENTS: dict[str, Schema] = {
    **_REGISTRATION_REFINEMENTS,
    "endpoints": {**_REGISTRATION_REFINEMENTS["endpoints"], "additionalProperties": STORED_ENDPOINT_URL},
    "callback_endpoint": {"anyOf": [STORED_NODE_URL, {"type": "null"}], "default": None},
    "liveness_probe": {"anyOf": [{"$ref": "#/components/schemas/ProbeRecord"}, {"type": "null"}], "default": None},
    "readiness_probe": {"anyOf": [{"$ref": "#/components/schemas/ProbeRecord"}, {"type": "null"}], "default": None},
}
_REFINEMENTS: dict[str, dict[str, Schema]] = {
    "Registration": _REGISTRATION_REFINEMENTS,
    "AgentRecord": _RECORD_REFINEMENTS,
    "Capability": {"version": {"type": "string", "maxLength": 40, "pattern": VERSION_PATTERN, "default": "1",
                               "description": "A PEP 440 version; 'v2' and '2' are the same."}},
    "Probe": {"url": NODE_URL},
    "RouteRequest": {
        "version": {"anyOf": [{"type": "string", "maxLength": 100, "pattern": CONSTRAINT_PATTERN}, {"type": "null"}],
                    "default": None, "description": CONSTRAINT_DESCRIPTION},
        "pattern": {"anyOf": [{"type": "string", "maxLength": 200, "pattern": AGENT_PATTERN}, {"type": "null"}],
                    "default": None, "description": "namespace.group.name with '*' wildcards within a segment"},
    },
    "Envelope": {
        "payload": {**_JSON_REF, "default": None},
        "extensions": {"type": "object", "maxProperties": 64, "propertyNames": {"maxLength": 200},
                       "additionalProperties": _JSON_REF, "default": {},
                       "description": "Cross-cutting context (user_id, conversation_id, locale …)."},
    },
}
# A card becomes a Registration (node.a2a.card_to_registration): its name the display name,
# its description the description, each skill a capability (tags, examples, and the skill's
# name as the description when it has none), each interface an endpoint, protocol versions and
# the provider labels. So the card's fields carry the registration's limits.
_CARD_REFINEMENTS: dict[str, dict[str, Schema]] = {
    "AgentCard": {
        "name": {**SHORT_TEXT, "minLength": 1},
        "description": {"type": "string", "maxLength": 4_000, **MULTI_LINE, "default": ""},
        "url": {"anyOf": [ENDPOINT_URL, {"type": "null"}], "default": None},
        "protocolVersion": {"anyOf": [{"type": "string", "maxLength": 32, **SINGLE_LINE}, {"type": "null"}],
                            "default": None},
        # One endpoint for the preferred interface, at most 16 in all.
        "additionalInterfaces": {"anyOf": [{"type": "array", "maxItems": 15,
                                            "items": {"$ref": "#/components/schemas/AgentInterface"}},
                                           {"type": "null"}], "default": None},
    },
    "AgentInterface": {
        "url": ENDPOINT_URL,
        "protocolVersion": {"anyOf": [{"type": "string", "maxLength": 32, **SINGLE_LINE}, {"type": "null"}],
                            "default": None},
    },
    "AgentSkill": {
        "description": {"type": "string", "maxLength": 4_000, **MULTI_LINE, "default": ""},
        "tags": {"type": "array", "maxItems": 32, "default": [],
                 "items": {"type": "string", "maxLength": 64, **SINGLE_LINE}},
        "examples": {"type": "array", "maxItems": 16, "default": [],
                     "items": {"type": "string", "maxLength": 500, **MULTI_LINE}},
    },
    "AgentProvider": {"organization": {**SHORT_TEXT}},
    # Two labels are added: a2a.protocol_version and a2a.provider.
    "CardRegistration": {"labels": {**LABELS, "maxProperties": 62, "default": {}}},
}


def _refine(schemas: dict[str, Schema], refinements: dict[str, dict[str, Schema]]) -> None:
    for name, fields in refinements.items():
        properties = schemas[name]["properties"]
        for field, schema in fields.items():
            kept = {key: properties[field][key] for key in ("title",) if key in properties[field]}
            properties[field] = {**kept, **copy.deepcopy(schema)}


def _close_pattern_properties(schema: object) -> None:
    """pydantic writes a dict with a key pattern as ``patternProperties`` alone, which admits any
    other key; the model refuses them, so say so."""
    if isinstance(schema, dict):
        if "patternProperties" in schema and "additionalProperties" not in schema:
            (pattern, values), = schema.pop("patternProperties").items()
            schema["propertyNames"] = {"pattern": pattern}
            schema["additionalProperties"] = values
        for value in schema.values():
            _close_pattern_properties(value)
    elif isinstance(schema, list):
        for value in schema:
            _close_pattern_properties(value)


def _components(max_hops: int) -> dict[str, Schema]:
    _, generated = models_json_schema([(model, "validation") for model in _MODELS],
                                      ref_template="#/components/schemas/{model}")
    schemas: dict[str, Schema] = generated["$defs"]
    _close_pattern_properties(schemas)
    schemas["ProbeRecord"] = copy.deepcopy(schemas["Probe"])
    schemas["ProbeRecord"]["properties"]["url"] = copy.deepcopy(STORED_NODE_URL)
    _refine(schemas, _REFINEMENTS)
    _refine(schemas, _CARD_REFINEMENTS)
    schemas["JsonValue"] = copy.deepcopy(JSON_VALUE)
    # node.models.RouteRequest._one_selector: a non-empty capability, agent_id or pattern.
    schemas["RouteRequest"]["anyOf"] = [_non_empty("capability"), _non_empty("agent_id"), _non_empty("pattern")]
    schemas["AgentCard"]["anyOf"] = [
        {"required": ["supportedInterfaces"], "properties": {"supportedInterfaces": {"type": "array", "minItems": 1}}},
        _non_empty("url")]
    # A skill without a description lends its name to the capability's description.
    schemas["AgentSkill"]["anyOf"] = [_non_empty("description"), {"properties": {"name": MULTI_LINE}}]
    # node.proxy: the target is routed as an agent_id or a pattern, or else the operation as a
    # capability; a string conversation_id pins the conversation; the region's hop limit.
    schemas["SendEnvelope"] = {
        "description": "An envelope to route and deliver: target_agent or operation is required; "
                       f"hop_count must be below the region's limit ({max_hops}).",
        "allOf": [{"$ref": "#/components/schemas/Envelope"}],
        "anyOf": [_non_empty("target_agent"), _non_empty("operation")],
        "properties": {
            "target_agent": {"anyOf": [{"type": "string", "maxLength": 200, "pattern": AGENT_PATTERN},
                                       {"type": "null"}]},
            "hop_count": {"type": "integer", "minimum": 0, "maximum": max_hops - 1},
            "extensions": {"type": "object", "properties": {"conversation_id": {"anyOf": [
                {"not": {"type": "string"}}, {"type": "string", "maxLength": 200, **SINGLE_LINE}]}}},
        },
    }
    # One report, or a batch of them.
    schemas["Reports"] = {"oneOf": [{"$ref": "#/components/schemas/OutcomeReport"},
                                    {"$ref": "#/components/schemas/OutcomeReports"}]}
    schemas["WatchEvent"] = {"description": "One server-sent event of /v1/watch.", "oneOf": [
        _sse_event("hello", "WatchHello"),
        {**_sse_event("change", "ChangeEvent"), "required": ["event", "data", "id"]},
        _sse_event("overflow", "WatchOverflow"),
    ]}
    return schemas


def _non_empty(field: str) -> Schema:
    return {"required": [field], "properties": {field: {"type": "string", "minLength": 1}}}


def _sse_event(kind: str, model: str) -> Schema:
    return {"type": "object", "required": ["event", "data"], "properties": {
        "event": {"const": kind},
        "id": {"type": "string", "pattern": "^[0-9]+$", "description": "The region version of the last change."},
        "data": {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"$ref": f"#/components/schemas/{model}"}},
    }}


# -- operations --------------------------------------------------------------------------------

_ERRORS = {
    400: "Malformed request: no body, or a body that is not JSON",
    401: "Missing, forged or expired token",
    403: "The token may not do this",
    404: "Not found",
    408: "The body did not arrive within the node's body_read_timeout_ms",
    409: "A concurrent change won; retry",
    410: "The envelope expired (expire_at_ms has passed)",
    413: "Body too large",
    422: "A field or parameter is invalid (field names it)",
    429: "Rate limited",
    502: "Every delivery attempt failed (details.attempts says why)",
    503: "Redis (or what the route needs) is unavailable",
}
# Every authenticated route may answer these.
_AUTH = (401, 429)
_BODY = (400, 408, 413, 422)


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str | None, description: str) -> Schema:
    schema = _ref(name) if name else {"type": "object"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int, notes: dict[int, str] | None = None, passthrough: bool = False) -> dict[str, Schema]:
    responses = {str(status): _json("ErrorBody", (notes or {}).get(status, _ERRORS[status]))
                 for status in sorted(statuses)}
    if passthrough:  # a target's own 4xx answer goes back as it is
        for status, response in responses.items():
            if status.startswith("4"):
                response["description"] += "; or the target's own answer, as it is (X-Reach-Agent names the target)"
                response["content"]["*/*"] = {"schema": {}}
    return responses


def _operation(summary: str, responses: dict[str, Schema], *, errors: Iterable[int] = (), body: str | None = None,
               body_required: bool = True, parameters: Iterable[Schema] = (), public: bool = False,
               notes: dict[int, str] | None = None, description: str | None = None,
               passthrough: bool = False) -> Schema:
    statuses = set(errors) | (set() if public else set(_AUTH)) | (set(_BODY) if body else set())
    errors_ = _errors(*statuses, notes=notes, passthrough=passthrough)
    operation: Schema = {"summary": summary, "responses": {**responses, **errors_}}
    if description:
        operation["description"] = description
    if body is not None:
        operation["requestBody"] = {"required": body_required,
                                    "content": {"application/json": {"schema": _ref(body)}}}
    if parameters:
        operation["parameters"] = list(parameters)
    if public:
        operation["security"] = []
    return operation


def _query(name: str, schema: Schema, description: str, *, required: bool = False, **extra: Any) -> Schema:
    return {"name": name, "in": "query", "required": required, "description": description, "schema": schema,
            **extra}


def _path(name: str, schema: Schema, description: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "description": description, "schema": schema}


AGENT_ID = _path("agent_id", {"type": "string", "maxLength": 200, "pattern": AGENT_ID_PATTERN},
                 "namespace.group.name, e.g. payment.risk_check.prod_01")
TRACE_ID = _path("trace_id", {"type": "string", "pattern": TRACE_ID_PATTERN}, "The collaboration's trace id")
_SCOPES = [scope.value for scope in Scope]


def _scope(default: Scope, *, all_alias: bool = True) -> Schema:
    values = _SCOPES + (["all"] if all_alias else [])
    return _query("scope", {"type": "string", "enum": values, "default": default.value},
                  "local, local-first or global" + (" ('all' = global)" if all_alias else ""))


ROUTABLE = _query("routable", {"type": "string", "enum": ["true", "false", "1", "0", "yes", "no"],
                               "default": "false"}, "true: only agents the router would consider")
PATTERN = _query("pattern", {"type": "string", "maxLength": 200, "pattern": f"^(?:{AGENT_PATTERN[1:-1]})?$"},
                 "namespace.group.name with '*' wildcards within a segment (empty: no filter)")
CAPABILITY = _query("capability", {"type": "string"}, "Only agents with this capability (empty: no filter)")


def _paths(max_hops: int) -> dict[str, dict[str, Schema]]:
    agent_lookup = (404,)
    return {
        "/v1/agents": {
            "post": _operation(
                "Register an agent (idempotent upsert)",
                {"200": _json("RegisterResponse", "Registered again: the record was replaced"),
                 "201": _json("RegisterResponse", "Registered for the first time in this region")},
                body="Registration", errors=(403, 503),
                notes={403: "The token may not act for this agent_id (agent tokens act for their own only)",
                       422: "A field is invalid (field names it); also: two capabilities with the same name and "
                            "major version, a transport the region does not allow, an address the egress policy "
                            "refuses (egress_denied)"}),
            "get": _operation("List agents", {"200": _json("AgentList", "The agents the caller may see")},
                              errors=(422,), parameters=[
                                  CAPABILITY, PATTERN,
                                  _query("label", {"type": "array", "items": {"type": "string",
                                                                              "pattern": "^[^=]+=[\\s\\S]*$"}},
                                         "key=value; repeat it for several labels", style="form", explode=True),
                                  _scope(Scope.LOCAL), ROUTABLE]),
        },
        "/v1/agents/{agent_id}": {
            "get": _operation("One agent (local or remote)", {"200": _json("AgentRecord", "The record")},
                              errors=agent_lookup, parameters=[AGENT_ID],
                              notes={404: "No such agent here or in a peer region (or the caller may not see it)"}),
            "delete": _operation("Deregister", {"200": _json("Deregistered", "Deregistered; a tombstone was written")},
                                 errors=(403, 404, 503), parameters=[AGENT_ID],
                                 notes={404: "The agent is not registered in this region"}),
        },
        "/v1/agents/{agent_id}/heartbeat": {
            "put": _operation("Renew the lease; report status and load",
                              {"200": _json("HeartbeatResponse", "The lease was renewed")},
                              body="Heartbeat", body_required=False, errors=(403, 404, 409, 503),
                              parameters=[AGENT_ID],
                              notes={404: "The agent has no lease in this region: register again"}),
        },
        "/v1/agents/{agent_id}/agent-card.json": {
            "get": _operation("The agent as an A2A Agent Card (v1.0)",
                              {"200": _json("ExportedAgentCard", "The card")}, errors=agent_lookup,
                              parameters=[AGENT_ID]),
        },
        "/v1/agent-cards": {
            "post": _operation(
                "Register an agent from an A2A Agent Card (v1.0 or v0.3)",
                {"200": _json("RegisterResponse", "Registered again"),
                 "201": _json("RegisterResponse", "Registered for the first time in this region")},
                body="CardRegistration", errors=(403, 503),
                notes={422: "A field is invalid (field names it); also: two skills whose ids give the same "
                            "capability name, an address the egress policy refuses (egress_denied)"}),
        },
        "/v1/resolve": {
            "post": _operation("Route ticket", {"200": _json("RouteTicket", "Call target; fail over to alternates")},
                               body="RouteRequest", errors=(404,),
                               notes={404: "No agent available (details.stages says why per stage)"}),
        },
        "/v1/reports": {
            "post": _operation("Report call outcomes (one report or a batch)",
                               {"200": _json("Accepted", "The reports were recorded")}, body="Reports",
                               errors=(403,),
                               notes={403: "The signature is not a ticket of this cluster, names another agent or "
                                           "caller, or is too old"}),
        },
        "/v1/search": {
            "get": _operation(
                "Natural-language search over local and remote agents",
                {"200": _json("SearchResponse", "Hits, best first")}, errors=(422, 503), parameters=[
                    _query("q", {"type": "string", "minLength": 1, "maxLength": 2_000, "pattern": "[^\\s\\x1c-\\x1f]"},
                           "What the agent should do (not only whitespace)", required=True),
                    _query("k", {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_K,
                                 "default": DEFAULT_SEARCH_K}, "How many agents"),
                    _scope(Scope.GLOBAL), ROUTABLE],
                notes={503: "No search is attached to this node"}),
        },
        "/v1/semantic/vectors": {
            "post": _operation("Cached capability-text vectors by key, for a peer region's index",
                               {"200": _json("VectorResponse", "The vectors this region holds")},
                               body="VectorRequest", errors=(403,),
                               notes={403: "Peer and admin tokens only"}),
        },
        "/v1/watch": {
            "get": _operation(
                "Server-sent change events",
                {"200": {"description": "An event stream: hello, then one change per event (id: the region "
                                        "version), ': keep-alive' comments while idle; overflow ends a watcher "
                                        "that fell behind",
                         "content": {"text/event-stream": {"itemSchema": _ref("WatchEvent")}}}},
                errors=(422,), parameters=[
                    _query("since", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                           "Replay the changes after this region version first"),
                    CAPABILITY, PATTERN]),
        },
        "/v1/regions": {"get": _operation("Topology, peer freshness, counts", {"200": _json("Regions", "OK")})},
        "/v1/federation/snapshot": {
            "get": _operation("Live local records + watermark", {"200": _json("Snapshot", "The snapshot")},
                              errors=(403, 503), notes={403: "Peer and admin tokens only"}),
        },
        "/v1/federation/status": {
            "get": _operation("Federation: this region's watermark and digest, publisher, consumer, anti-entropy, "
                              "peers", {"200": _json("FederationStatus", "OK")}, errors=(503,)),
        },
        "/v1/admin/quarantine": {
            "get": _operation("Stored records and events that do not parse, skipped by every reader",
                              {"200": _json("QuarantineList", "OK")}, errors=(403,),
                              notes={403: "Admin tokens only"}),
        },
        "/v1/send": {
            "post": _operation(
                "Proxy mode: route and deliver an envelope (hop limit, expiry, once per id)",
                {"200": {"description": "The target's answer, as it is (status, content type, body)",
                         "content": {"*/*": {"schema": {}}}},
                 "202": {"description": "delivery=callback: accepted, the result goes to the caller's registered "
                                        "callback_endpoint; or (sync) a target's own 202, as it is",
                         "content": {"application/json": {"schema": _ref("SendAccepted")}, "*/*": {"schema": {}}}},
                 "2XX": {"description": "The target's answer, as it is", "content": {"*/*": {"schema": {}}}},
                 "4XX": {"description": "The target's own 4xx answer, as it is", "content": {"*/*": {"schema": {}}}}},
                body="SendEnvelope", errors=(404, 409, 410, 429, 502, 503),
                parameters=[
                    _query("delivery", {"type": "string", "enum": ["sync", "callback"], "default": "sync"},
                           "sync: answer with the target's answer; callback: answer 202 and send the result to the "
                           "caller's registered callback_endpoint"),
                    _query("version", {"type": "string", "maxLength": 100, "pattern": CONSTRAINT_PATTERN},
                           "Capability version constraint: " + CONSTRAINT_DESCRIPTION),
                    _scope(Scope.LOCAL_FIRST, all_alias=False)],
                passthrough=True,
                notes={404: "No agent available",
                       409: "This envelope id is being delivered, or its answer was too large to keep",
                       422: "A field is invalid, hop_count reached the limit, or delivery=callback without a "
                            "registered callback_endpoint",
                       429: "Rate limited, or too many callback deliveries in flight"}),
        },
        "/v1/traces/{trace_id}": {
            "get": _operation("Route decisions, deliveries and outcomes of one trace",
                              {"200": _json("Trace", "The events the caller took part in, oldest first")},
                              errors=(404, 422, 503), parameters=[TRACE_ID],
                              notes={404: "No events of this trace that the caller took part in (traces expire)"}),
        },
        "/v1/traces": {
            "post": _operation("Record the caller's own direct-call route events",
                               {"200": _json("Accepted", "The events were recorded")}, body="RouteEvents",
                               errors=(403,), notes={403: "An event names another caller"}),
        },
        "/v1/policy": {
            "get": _operation("The region's policy for agents and the caller's token claims",
                              {"200": _json("Policy", "OK")}),
        },
        "/v1/openapi.json": {"get": _operation("This document", {"200": _json(None, "The OpenAPI document")},
                                               public=True)},
        "/healthz": {"get": _operation("Process liveness", {"200": _json("Health", "Alive")}, public=True)},
        "/readyz": {"get": _operation("Readiness (cache loaded, Redis reachable)",
                                      {"200": _json("Ready", "Ready"),
                                       "503": _json("Unready", "Draining, starting, or Redis unreachable")},
                                      public=True)},
        "/metrics": {"get": _operation("Prometheus metrics", {"200": {
            "description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}},
            public=True)},
    }


@lru_cache(maxsize=16)
def build_openapi(region: str, *, served: Served | None = None, max_hops: int = DEFAULT_MAX_HOPS) -> dict[str, object]:
    """The spec; ``region`` goes into the description only.

    ``served``: the ``(method, path)`` pairs the node serves (lower-case methods); operations
    outside it are left out. None documents every route the node can serve. ``max_hops``: the
    region's hop limit for ``/v1/send``. The result is cached and shared: do not mutate it.
    """
    paths: dict[str, dict[str, Schema]] = {}
    for path, operations in _paths(max_hops).items():
        kept = {method: operation for method, operation in operations.items()
                if served is None or (method, path) in served}
        if kept:
            paths[path] = kept
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": "Agent-Reach node API", "version": "1.0.0",
                 "description": f"Regional registry node (region {region}). Bodies are parsed strictly: an "
                                "integer is written without a fraction or exponent (100.0 is refused), a string is "
                                "never a number, an unknown field is a 422 naming it. Before a request reaches "
                                "its route, the HTTP server may answer it with the same error body: 400, 414 or "
                                "431 for a malformed request head, 408 for one that arrives too slowly, 503 when "
                                "the node holds its maximum of connections."},
        "paths": paths,
        "components": {"schemas": _components(max_hops),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }


__all__ = ["CONSTRAINT_PATTERN", "IPV6_PATTERN", "OPENAPI_VERSION", "VERSION_PATTERN", "build_openapi",
           "stored_url_pattern", "url_pattern"]
