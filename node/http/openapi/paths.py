"""The document's ``paths``: every route the node can serve, each operation with exactly the
statuses it can answer. ``build_openapi`` leaves out what a node does not serve.
"""

from __future__ import annotations

from ...core.a2a import AGENT_CARD_PATH, AGENT_CARD_ROUTE
from ...core.models import ACL_RULE_ID_PATTERN, INT64_MAX, KEY_ID_PATTERN, Scope
from ...routing import DEFAULT_SEARCH_K, MAX_SEARCH_K
from ...trust import JWKS_PATH
from ..console import console_files
from .operations import (
    AGENT_ID,
    CAPABILITY,
    LEASES,
    PATTERN,
    REASON,
    REMOTE,
    ROUTABLE,
    TRACE_ID,
    WEIGHTS,
    json_answer,
    operation,
    path_parameter,
    query,
    ref,
    scope_query,
)
from .patterns import CONSTRAINT_DESCRIPTION, CONSTRAINT_PATTERN, Schema

RULE_ID = path_parameter("rule_id", {"type": "string", "pattern": ACL_RULE_ID_PATTERN}, "The ACL rule's id")

Paths = dict[str, dict[str, Schema]]


def paths() -> Paths:
    """Every route, in the document's order."""
    return {**_agents(), **_routing(), **_feeds(), **_proxy(), **_service()}


def _agents() -> Paths:
    """Registration, heartbeats, lookups and A2A cards."""
    agent_lookup = (404,)
    return {
        "/v1/agents": {
            "post": operation(
                "Register an agent (idempotent upsert)",
                {"200": json_answer("RegisterResponse", "Registered again: the record was replaced"),
                 "201": json_answer("RegisterResponse", "Registered for the first time in this region")},
                body="Registration", errors=(403, 503),
                notes={403: "The token may not act for this agent_id (agent tokens act for their own only)",
                       422: "A field is invalid (field names it); also: two capabilities with the same name and "
                            "major version, a transport the region does not allow, an address the egress policy "
                            "refuses (egress_denied)"}),
            "get": operation("List agents", {"200": json_answer("AgentList", "The agents the caller may see")},
                             errors=(422,), parameters=[
                                 CAPABILITY, PATTERN,
                                 query("label", {"type": "array", "items": {"type": "string",
                                                                            "pattern": "^[^=]+=[\\s\\S]*$"}},
                                       "key=value; repeat it for several labels", style="form", explode=True),
                                 query("tag", {"type": "array", "maxItems": 8,
                                               "items": {"type": "string", "minLength": 1, "maxLength": 64}},
                                       "Only agents with a capability (an A2A skill) carrying every tag, compared "
                                       "case-insensitively (with capability: that capability); repeat it for several",
                                       style="form", explode=True),
                                 scope_query(Scope.LOCAL_FIRST), ROUTABLE]),
        },
        "/v1/agents/{agent_id}": {
            "get": operation("One agent (local or remote)", {"200": json_answer("AgentRecord", "The record")},
                             errors=(*agent_lookup, 422), parameters=[AGENT_ID],
                             notes={404: "No such agent here or in a peer region (or the caller may not see it)",
                                    422: "agent_id is not an agent id (refused before any peer region is asked)"}),
            "delete": operation("Deregister",
                                {"200": json_answer("Deregistered", "Deregistered; a tombstone was written")},
                                errors=(403, 404, 503), parameters=[AGENT_ID],
                                notes={404: "The agent is not registered in this region"}),
        },
        **_leases(),
        "/v1/agents/{agent_id}/agent-card.json": {
            "get": operation("The agent as an A2A Agent Card (v1.0), as at /agents/{agent_id}" + AGENT_CARD_PATH,
                             {"200": json_answer("ExportedAgentCard", "The card")}, errors=agent_lookup,
                             parameters=[AGENT_ID]),
        },
        AGENT_CARD_ROUTE: {"get": _optional_token(operation(
            "The agent's A2A Agent Card where A2ACardResolver looks for it (base URL /agents/{agent_id})",
            {"200": json_answer("ExportedAgentCard", "The card")}, errors=(401, 404, 429), public=True,
            parameters=[AGENT_ID],
            notes={401: "No token, and the card is not public (the registration asked for public_card, the region "
                        "allows public cards, the agent has no allowed_callers and is registered here) — the same "
                        "for an agent that does not exist; or a token that is not valid",
                   404: "No such agent here or in a peer region (or the caller may not see it)"}))},
        AGENT_CARD_PATH: {"get": operation(
            "The registry's own A2A Agent Card: its skills resolve, search and list, its interface the v1 API",
            {"200": json_answer("ExportedAgentCard", "The registry's card")}, public=True)},
        "/v1/agents/{agent_id}/decisions": {"get": _about_agent(
            "This node's recent route decisions, outcomes and admin actions about an agent", "AgentDecisions",
            "Newest first; callers other than admins, peers and the agent see only their own")},
        "/v1/agents/{agent_id}/probes": {"get": _about_agent(
            "The results of the agent's liveness and readiness probes this node ran", "AgentProbes",
            "Newest first; empty on a node that is not its region's leader (the leader runs the probes)")},
        "/v1/agent-cards": {
            "post": operation(
                "Register an agent from an A2A Agent Card (v1.0 or v0.3)",
                {"200": json_answer("RegisterResponse", "Registered again"),
                 "201": json_answer("RegisterResponse", "Registered for the first time in this region")},
                body="CardRegistration", errors=(403, 503),
                notes={422: "A field is invalid (field names it); also: two skills whose ids give the same "
                            "capability name, an address the egress policy refuses (egress_denied)"}),
        },
    }


def _about_agent(summary: str, answer: str, description: str) -> Schema:
    """A read about one agent the caller may see."""
    return operation(summary, {"200": json_answer(answer, description)}, errors=(404,), parameters=[AGENT_ID],
                     notes={404: "No such agent here or in a peer region (or the caller may not see it)"})


def _optional_token(entry: Schema) -> Schema:
    """An operation served with or without a bearer token (what it answers depends on which)."""
    return {**entry, "security": [{}, {"bearer": []}]}


def _leases() -> Paths:
    """Heartbeats and load reports."""
    return {
        "/v1/agents/{agent_id}/heartbeat": {
            "put": operation("Renew the lease; report status and load",
                             {"200": json_answer("HeartbeatResponse", "The lease was renewed")},
                             body="Heartbeat", body_required=False, errors=(403, 404, 409, 503),
                             parameters=[AGENT_ID],
                             notes={404: "The agent has no lease in this region: register again"}),
        },
        "/v1/agents/{agent_id}/load": {
            "put": operation("Report load between heartbeats (stays in this region: no version, no peer event)",
                             {"200": json_answer("LoadReportResponse", "The load was stored; the lease was not moved")},
                             body="Load", errors=(403, 404, 503), parameters=[AGENT_ID],
                             notes={404: "The agent has no lease in this region: register again"}),
        },
    }


def _routing() -> Paths:
    """Route tickets, outcome reports, search, and the vectors a peer's index fetches."""
    return {
        "/v1/resolve": {
            "post": operation("Route ticket",
                              {"200": json_answer("RouteTicket", "Call target; fail over to alternates")},
                              body="RouteRequest", errors=(404,), parameters=[WEIGHTS, REMOTE],
                              notes={404: "No agent available (details.stages says why per stage)"}),
        },
        "/v1/credentials": {
            "post": operation("The route credential of one of a ticket's alternates",
                              {"200": json_answer("IssuedCredential", "Send it as 'Authorization: Bearer …' to that "
                                                                      "agent; it expires with the ticket")},
                              body="CredentialRequest", errors=(403,),
                              notes={403: "The signature is not a ticket of this cluster, names another agent, was "
                                          "issued to another caller, or has expired"}),
        },
        "/v1/reports": {
            "post": operation("Report call outcomes (one report or a batch)",
                              {"200": json_answer("Accepted", "The reports were recorded")}, body="Reports",
                              errors=(403,),
                              notes={403: "The signature is not a ticket of this cluster, names another agent or "
                                          "caller, or is too old"}),
        },
        "/v1/search": {
            "get": operation(
                "Natural-language search over local and remote agents",
                {"200": json_answer("SearchResponse", "Hits, best first")}, errors=(422, 503), parameters=[
                    query("q", {"type": "string", "minLength": 1, "maxLength": 2_000, "pattern": "[^\\s\\x1c-\\x1f]"},
                          "What the agent should do (not only whitespace)", required=True),
                    query("k", {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_K,
                                "default": DEFAULT_SEARCH_K}, "How many agents"),
                    scope_query(Scope.GLOBAL), ROUTABLE],
                notes={503: "No search is attached to this node"}),
        },
        "/v1/semantic/vectors": {
            "post": operation("Cached capability-text vectors by key, for a peer region's index",
                              {"200": json_answer("VectorResponse", "The vectors this region holds")},
                              body="VectorRequest", errors=(403,),
                              notes={403: "Peer and admin tokens only"}),
        },
    }


def _feeds() -> Paths:
    """The change feed, the region and its peers, the quarantine."""
    return {
        "/v1/watch": {
            "get": operation(
                "Server-sent change events",
                {"200": {"description": "An event stream: hello, then one change per event (id: the region "
                                        "version), ': keep-alive' comments while idle; overflow ends a watcher "
                                        "that fell behind",
                         "content": {"text/event-stream": {"itemSchema": ref("WatchEvent")}}}},
                errors=(422, 503), notes={429: "Rate limited, or the caller holds watch_streams_per_caller streams "
                                               "already (too_many_watches)"}, parameters=[
                    query("since", {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
                          "Replay the changes after this region version first"),
                    CAPABILITY, PATTERN, LEASES]),
        },
        "/v1/session": {
            "get": operation(
                "An SDK process's session: a WebSocket carrying its agents' lease renewals and load reports",
                {"101": {"description": "Switching to a WebSocket. Frames are JSON objects: the client sends join "
                                        "(each agent with its own token), renew, load, leave and watch; the node "
                                        "answers joined, renewed, loaded, error, and pushes gone for watched agents. "
                                        "node.http.sessions holds the frames' models."}},
                errors=(400, 503), notes={400: "Not a WebSocket upgrade (websocket_required)",
                                          503: "The node is going away: open the session with another node"}),
        },
        "/v1/regions": {"get": operation("Topology, peer freshness, counts", {"200": json_answer("Regions", "OK")})},
        "/v1/federation/snapshot": {
            "get": operation("Live local records + watermark", {"200": json_answer("Snapshot", "The snapshot")},
                             errors=(403, 503), notes={403: "Peer and admin tokens only"}),
        },
        "/v1/federation/status": {
            "get": operation("Federation: this region's watermark and digest, publisher, consumer, anti-entropy, "
                             "peers", {"200": json_answer("FederationStatus", "OK")}, errors=(503,)),
        },
        "/v1/admin/keys/rotate": {
            "post": operation("Sign route credentials with a new key from now on; the old key verifies until the "
                              "credentials it signed expired", {"200": json_answer("KeyRotated", "Rotated")},
                              errors=(403, 503), notes={403: "Admin tokens only"}),
        },
        "/v1/breakers": {
            "get": operation("This node's open, half-open or penalised agents, learnt from call outcome reports",
                             {"200": json_answer("Breakers", "The agents the caller may see")}),
        },
        "/v1/admin/tokens/revoke": {
            "post": operation("Refuse a bearer token on every node of this region until it expires",
                              {"200": json_answer("TokenRevoked", "Revoked")}, body="RevocationRequest",
                              errors=(403, 503), notes={403: "Admin tokens only"}),
        },
        "/v1/acl": {
            "get": operation("The region's ACL rules in force, from every region",
                             {"200": json_answer("AclList", "OK")}, errors=(403,),
                             notes={403: "Peer and admin tokens only"}),
        },
        "/v1/acl/{rule_id}": {
            "put": operation("Set an ACL rule: it holds on every node of the region within acl_poll_interval_ms, "
                             "without any agent registering again, and reaches the peer regions",
                             {"200": json_answer("AclChanged", "Set")}, body="AclRule", errors=(403, 409, 503),
                             parameters=[RULE_ID], notes={403: "Admin tokens only", 409: "The region holds the "
                                                          "most rules it may (acl_full)"}),
            "delete": operation("Delete an ACL rule", {"200": json_answer("AclChanged", "Deleted")},
                                errors=(403, 404, 422, 503), parameters=[RULE_ID], notes={403: "Admin tokens only"}),
        },
        **_admin_agents(),
        "/v1/admin/quarantine": {
            "get": operation("Stored records and events that do not parse, skipped by every reader",
                             {"200": json_answer("QuarantineList", "OK")}, errors=(403,),
                             notes={403: "Admin tokens only"}),
        },
    }


def _admin_agents() -> Paths:
    """An admin's actions on one agent (node.http.admin), each recorded in the decision log."""
    admins_only = {403: "Admin tokens only (admins_only)"}
    return {
        "/v1/admin/agents/{agent_id}": {
            "patch": operation("Set an agent's status (draining takes it out of routing) or routing weight",
                               {"200": json_answer("AgentChanged", "Changed (or already so: changed is false)")},
                               body="AgentChange", errors=(403, 404, 409, 503), parameters=[AGENT_ID],
                               notes={**admins_only, 404: "The agent is not registered in this region",
                                      409: "A peer region keeps the agent (not_home_region), or concurrent "
                                           "changes won"}),
            "delete": operation("Deregister an agent (admin), recorded in the decision log",
                                {"200": json_answer("Deregistered", "Deregistered; a tombstone was written")},
                                errors=(403, 404, 409, 422, 503), parameters=[AGENT_ID, REASON],
                                notes={**admins_only, 404: "The agent is not registered in this region",
                                       409: "A peer region keeps the agent (not_home_region)"}),
        },
        "/v1/admin/agents/{agent_id}/revoke-tokens": {
            "post": operation("Refuse every agent token of this agent_id issued so far, in this region and its "
                              "peers", {"200": json_answer("AgentTokensRevoked", "Revoked")},
                              errors=(403, 422, 503), parameters=[AGENT_ID, REASON], notes=admins_only),
        },
    }


def _proxy() -> Paths:
    """Proxy mode, the trace log and the region's policy."""
    return {
        "/v1/send": {
            "post": operation(
                "Proxy mode: route and deliver an envelope (hop limit, expiry, once per id)",
                {"200": {"description": "The target's answer, as it is (status, content type, body)",
                         "content": {"*/*": {"schema": {}}}},
                 "202": {"description": "delivery=callback: accepted, the result goes to the caller's registered "
                                        "callback_endpoint; or (sync) a target's own 202, as it is",
                         "content": {"application/json": {"schema": ref("SendAccepted")}, "*/*": {"schema": {}}}},
                 "2XX": {"description": "The target's answer, as it is", "content": {"*/*": {"schema": {}}}},
                 "4XX": {"description": "The target's own 4xx answer, as it is", "content": {"*/*": {"schema": {}}}}},
                body="SendEnvelope", errors=(404, 409, 410, 429, 502, 503),
                parameters=[
                    query("delivery", {"type": "string", "enum": ["sync", "callback"], "default": "sync"},
                          "sync: answer with the target's answer; callback: answer 202 and send the result to the "
                          "caller's registered callback_endpoint"),
                    query("version", {"type": "string", "maxLength": 100, "pattern": CONSTRAINT_PATTERN},
                          "Capability version constraint: " + CONSTRAINT_DESCRIPTION),
                    scope_query(Scope.LOCAL_FIRST, all_alias=False)],
                passthrough=True,
                notes={404: "No agent available",
                       409: "This envelope id is being delivered, or its answer was too large to keep",
                       422: "A field is invalid, hop_count reached the limit (the highest of the envelope's, the "
                            "X-Reach-Hop stamp the sender got with the delivery it acts on, and the trace's), "
                            "X-Reach-Hop is not the node's stamp, or delivery=callback without a registered "
                            "callback_endpoint",
                       429: "A rate budget (the token's, or its budget for the capability), the trace quota, or "
                            "the token's share of callback deliveries in flight; Retry-After says when"}),
        },
        "/v1/traces/{trace_id}": {
            "get": operation("Route decisions, deliveries and outcomes of one trace",
                             {"200": json_answer("Trace", "The node's records the caller took part in (as their "
                                                          "caller or agent) and the caller's own posts, by at_ms; "
                                                          "an admin gets every writer's")},
                             errors=(404, 422, 503), parameters=[TRACE_ID],
                             notes={404: "No events of this trace that the caller took part in (traces expire)"}),
        },
        "/v1/traces/{trace_id}/result": {
            "get": operation("The final answer of the caller's own proxied delivery in this trace (sync, or the "
                             "result its callback carried), kept as long as the trace",
                             {"200": json_answer("TraceResult", "The answer, as JSON, text or base64, or only its "
                                                                "facts when larger than result_max_bytes")},
                             errors=(404, 422, 503), parameters=[TRACE_ID],
                             notes={404: "No result of this trace for this caller: only the caller that sent it reads "
                                         "it (unknown_result)"}),
        },
        "/v1/traces": {
            "post": operation("Record the caller's own direct-call route events",
                              {"200": json_answer("Accepted", "The events were recorded")}, body="RouteEvents",
                              description="A trace keeps each caller's posts apart from the node's records and from "
                                          "other callers' (the newest trace_max_events of each); they are shown to "
                                          "that caller and admins only, never to an agent they name.",
                              errors=(403, 409, 503),
                              notes={403: "An event names another caller",
                                     409: "A trace of the batch already holds the posts of trace_max_callers other "
                                          "callers (trace_full); nothing of the batch was recorded"}),
        },
        "/v1/policy": {
            "get": operation("The region's policy for agents and the caller's token claims",
                             {"200": json_answer("Policy", "OK")}),
        },
    }


def _console() -> Paths:
    """The web console's files (``node.http.console``): public; its data comes from the API with a token."""
    html = {"content": {"text/html": {"schema": {"type": "string"}}}}
    redirect = {"302": {"description": "To /ui/ (a URL fragment such as #token=… is kept by the browser)",
                        "headers": {"Location": {"schema": {"type": "string", "const": "/ui/"}}}}}
    return {
        "/": {"get": operation("The console", redirect, public=True)},
        "/ui": {"get": operation("The console", redirect, public=True)},
        "/ui/": {"get": operation("The console's page (never cached)",
                                  {"200": {"description": "The console", **html}}, public=True)},
        "/ui/{name}": {"get": operation(
            "One of the console's files (revalidated by ETag)",
            {"200": {"description": "The file",
                     "content": {"text/javascript": {"schema": {"type": "string"}},
                                 "text/css": {"schema": {"type": "string"}},
                                 "image/svg+xml": {"schema": {"type": "string"}}}},
             "304": {"description": "Unchanged since the ETag in If-None-Match"}},
            errors=(404,), public=True,
            parameters=[path_parameter("name", {"type": "string", "enum": console_files()}, "The file's name")],
            notes={404: "The console has no such file"})},
    }


def _service() -> Paths:
    """The public routes: this document, liveness, readiness, metrics."""
    return {
        "/v1/openapi.json": {"get": operation("This document", {"200": json_answer(None, "The OpenAPI document")},
                                              public=True)},
        JWKS_PATH: {"get": operation(
            "The public keys route credentials valid in this region are signed with (this region's and its peers')",
            {"200": json_answer("KeySet", "A JWK Set: Ed25519 keys for EdDSA, kid = <region>.<thumbprint>")},
            errors=(422,), public=True, parameters=[
                query("kid", {"type": "string", "pattern": KEY_ID_PATTERN},
                      "A key the caller needs: a peer's key this node does not hold yet is fetched from that peer "
                      "first")])},
        **_console(),
        "/healthz": {"get": operation("Process liveness", {"200": json_answer("Health", "Alive")}, public=True)},
        "/readyz": {"get": operation("Readiness (cache loaded, Redis reachable)",
                                     {"200": json_answer("Ready", "Ready"),
                                      "503": json_answer("Unready", "Draining, starting, or Redis unreachable")},
                                     public=True)},
        "/metrics": {"get": operation("Prometheus metrics", {"200": {
            "description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}},
            public=True)},
    }
