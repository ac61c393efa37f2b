"""The OpenAPI 3.1 document of the v1 API, generated from the boundary models."""

from __future__ import annotations

from functools import lru_cache

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .a2a import CardRegistration
from .envelope import Envelope, Policy, RouteEvents, SendAccepted, Trace
from .models import (
    AgentList,
    AgentRecord,
    ErrorBody,
    Heartbeat,
    HeartbeatResponse,
    OutcomeReport,
    OutcomeReports,
    RegisterResponse,
    Registration,
    RouteRequest,
    RouteTicket,
    SearchResponse,
    Snapshot,
)

_MODELS: list[type[BaseModel]] = [
    Registration, RegisterResponse, Heartbeat, HeartbeatResponse, AgentRecord, AgentList, RouteRequest,
    RouteTicket, OutcomeReport, OutcomeReports, Snapshot, ErrorBody, SearchResponse, CardRegistration, Envelope,
    SendAccepted, RouteEvents, Trace, Policy,
]
_ERRORS = {"400": "Malformed request", "401": "Missing, forged or expired token", "403": "Not allowed",
           "404": "Not found", "413": "Body too large", "422": "A field is invalid", "429": "Rate limited",
           "503": "Store unavailable"}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(model: type[BaseModel] | None, description: str = "OK") -> dict[str, object]:
    if model is None:
        return {"description": description, "content": {"application/json": {"schema": {"type": "object"}}}}
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _operation(summary: str, *, body: type[BaseModel] | None = None, response: type[BaseModel] | None = None,
               parameters: list[dict[str, object]] | None = None, public: bool = False,
               media: str | None = None) -> dict[str, object]:
    responses: dict[str, object] = {"200": _json(response)}
    if media:
        responses = {"200": {"description": "OK", "content": {media: {"schema": {"type": "string"}}}}}
    for status, description in _ERRORS.items():
        responses[status] = _json(ErrorBody, description)
    operation: dict[str, object] = {"summary": summary, "responses": responses}
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(body)}}}
    if parameters:
        operation["parameters"] = parameters
    if public:
        operation["security"] = []
    return operation


def _param(name: str, where: str = "query", description: str = "", required: bool = False) -> dict[str, object]:
    return {"name": name, "in": where, "required": required or where == "path", "description": description,
            "schema": {"type": "string"}}


AGENT_ID = _param("agent_id", "path", "namespace.group.name")


@lru_cache(maxsize=8)
def build_openapi(region: str) -> dict[str, object]:
    """The spec; ``region`` goes into the description only."""
    _, schemas = models_json_schema([(model, "validation") for model in _MODELS],
                                    ref_template="#/components/schemas/{model}")
    paths: dict[str, dict[str, object]] = {
        "/v1/agents": {
            "post": _operation("Register an agent (idempotent upsert)", body=Registration, response=RegisterResponse),
            "get": _operation("List agents", response=AgentList, parameters=[
                _param("capability"), _param("pattern", description="namespace.group.name with *"),
                _param("label", description="key=value, repeatable"), _param("scope", description="local|local-first|global"),
                _param("routable", description="true: only routable agents")]),
        },
        "/v1/agents/{agent_id}": {
            "get": _operation("One agent (local or remote)", response=AgentRecord, parameters=[AGENT_ID]),
            "delete": _operation("Deregister", parameters=[AGENT_ID]),
        },
        "/v1/agents/{agent_id}/heartbeat": {
            "put": _operation("Renew the lease; report status and load", body=Heartbeat, response=HeartbeatResponse,
                              parameters=[AGENT_ID]),
        },
        "/v1/resolve": {"post": _operation("Route ticket", body=RouteRequest, response=RouteTicket)},
        "/v1/search": {"get": _operation("Natural-language search over local and remote agents",
                                         response=SearchResponse, parameters=[
                                             _param("q", required=True, description="what the agent should do"),
                                             _param("k", description="how many agents (1..100, default 10)"),
                                             _param("scope", description="local|local-first|global (default)"),
                                             _param("routable", description="true: only routable agents")])},
        "/v1/semantic/vectors": {"post": _operation(
            "Cached capability-text vectors by key, for a peer region's index (present with semantic search)")},
        "/v1/agent-cards": {"post": _operation("Register an agent from an A2A Agent Card (v1.0 or v0.3)",
                                               body=CardRegistration, response=RegisterResponse)},
        "/v1/agents/{agent_id}/agent-card.json": {"get": _operation("The agent as an A2A Agent Card (v1.0)",
                                                                    parameters=[AGENT_ID])},
        "/v1/reports": {"post": _operation("Report call outcomes", body=OutcomeReports)},
        "/v1/watch": {"get": _operation("Server-sent change events", media="text/event-stream", parameters=[
            _param("since", description="replay changes after this version"), _param("capability"), _param("pattern")])},
        "/v1/regions": {"get": _operation("Topology, peer freshness, counts")},
        "/v1/federation/snapshot": {"get": _operation("Live local records + watermark (peer and admin tokens only)",
                                                      response=Snapshot)},
        "/v1/admin/quarantine": {"get": _operation(
            "Stored records and events that do not parse, skipped by every reader (admin tokens only)")},
        "/v1/federation/status": {"get": _operation(
            "Federation: this region's watermark and digest, publisher, consumer, anti-entropy, peers "
            "(present when federation is attached)")},
        "/v1/send": {"post": _operation(
            "Proxy mode: route and deliver an envelope (hop limit, expiry, once per id); the target's answer "
            "as is, or 202 SendAccepted with delivery=callback", body=Envelope, parameters=[
                _param("delivery", description="sync (default) | callback: the result goes to the caller's "
                       "registered callback_endpoint"),
                _param("version", description="capability version constraint"),
                _param("scope", description="local|local-first|global")])},
        "/v1/traces/{trace_id}": {"get": _operation("Route decisions, deliveries and outcomes of one trace",
                                                    response=Trace, parameters=[_param("trace_id", "path")])},
        "/v1/traces": {"post": _operation("Record the caller's own direct-call route events", body=RouteEvents)},
        "/v1/policy": {"get": _operation("The region's policy for agents and the caller's token claims",
                                         response=Policy)},
        "/v1/openapi.json": {"get": _operation("This document", public=True)},
        "/healthz": {"get": _operation("Process liveness", public=True)},
        "/readyz": {"get": _operation("Readiness (cache loaded, Redis reachable)", public=True)},
        "/metrics": {"get": _operation("Prometheus metrics", public=True, media="text/plain")},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Agent-Reach node API", "version": "1.0.0",
                 "description": f"Regional registry node (region {region})."},
        "paths": paths,
        "components": {"schemas": schemas.get("$defs", {}),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }
