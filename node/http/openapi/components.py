"""The document's ``components.schemas``: the boundary models' JSON schemas (validation mode),
refined with what their validators enforce, plus the schemas composed from them.
"""

from __future__ import annotations

import copy

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ...core import Envelope, Policy, RouteEvents, SendAccepted, Trace, TraceResult
from ...core.a2a import CardRegistration
from ...core.models import (
    AclList,
    AclRule,
    AgentChange,
    AgentList,
    AgentRecord,
    ChangeEvent,
    CredentialRequest,
    ErrorBody,
    Heartbeat,
    HeartbeatResponse,
    IssuedCredential,
    KeySet,
    Load,
    LoadReportResponse,
    OutcomeReport,
    OutcomeReports,
    RegisterResponse,
    Registration,
    RevocationRequest,
    RouteRequest,
    RouteTicket,
    SearchResponse,
    Snapshot,
)
from .patterns import AGENT_PATTERN, JSON_VALUE, MULTI_LINE, SINGLE_LINE, STORED_NODE_URL, Schema
from .refinements import CARD_REFINEMENTS, REFINEMENTS, close_pattern_properties, refine
from .shapes import (
    Accepted,
    AclChanged,
    AgentChanged,
    AgentDecisions,
    AgentProbes,
    AgentTokensRevoked,
    Breakers,
    Deregistered,
    ExportedAgentCard,
    FederationStatus,
    Health,
    KeyRotated,
    QuarantineList,
    Ready,
    Regions,
    TokenRevoked,
    Unready,
    VectorRequest,
    VectorResponse,
)
from .watch_events import WatchExpired, WatchHello, WatchLeases, WatchOverflow, WatchRevoked, watch_event_schema

_MODELS: list[type[BaseModel]] = [
    Registration, RegisterResponse, Heartbeat, HeartbeatResponse, Load, LoadReportResponse, AgentRecord, AgentList, RouteRequest,
    RouteTicket, OutcomeReport, OutcomeReports, Snapshot, ErrorBody, SearchResponse, CardRegistration, Envelope,
    SendAccepted, RouteEvents, Trace, Policy, ChangeEvent, Deregistered, Accepted, Regions, QuarantineList,
    VectorRequest, VectorResponse, FederationStatus, ExportedAgentCard, Health, Ready, Unready, WatchHello,
    WatchOverflow, WatchRevoked, WatchExpired, CredentialRequest, IssuedCredential, KeySet, KeyRotated, Breakers, TokenRevoked, RevocationRequest,
    AgentDecisions, AclList, AclRule, AclChanged, TraceResult, AgentProbes, AgentChange, AgentChanged,
    AgentTokensRevoked, WatchLeases,
]


def components(max_hops: int) -> dict[str, Schema]:
    """Every schema the document refers to: the models' JSON schemas, refined, and the composed
    ones (``SendEnvelope`` with the region's hop limit ``max_hops``, ``Reports``, ``WatchEvent``)."""
    _, generated = models_json_schema([(model, "validation") for model in _MODELS],
                                      ref_template="#/components/schemas/{model}")
    schemas: dict[str, Schema] = generated["$defs"]
    close_pattern_properties(schemas)
    schemas["ProbeRecord"] = copy.deepcopy(schemas["Probe"])
    schemas["ProbeRecord"]["properties"]["url"] = copy.deepcopy(STORED_NODE_URL)
    refine(schemas, REFINEMENTS)
    refine(schemas, CARD_REFINEMENTS)
    schemas["JsonValue"] = copy.deepcopy(JSON_VALUE)
    # node.core.models.RouteRequest._one_selector: a non-empty capability, agent_id or pattern.
    schemas["RouteRequest"]["anyOf"] = [_non_empty("capability"), _non_empty("agent_id"), _non_empty("pattern"),
                                        {"required": ["tags"], "properties": {"tags": {"type": "array", "minItems": 1}}}]
    # node.core.models.AgentChange._something: a status or a weight.
    schemas["AgentChange"]["anyOf"] = [{"required": ["status"], "properties": {"status": {"type": "string"}}},
                                       {"required": ["weight"], "properties": {"weight": {"type": "integer"}}}]
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
    schemas["WatchEvent"] = watch_event_schema()
    return schemas


def _non_empty(field: str) -> Schema:
    return {"required": [field], "properties": {field: {"type": "string", "minLength": 1}}}
