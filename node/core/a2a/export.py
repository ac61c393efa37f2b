"""Agent Cards the registry serves: an agent's, and its own.

An agent registered from its card gets that card back as it was given — a v0.3 card converted
to v1.0 the way the A2A SDK reads it (:mod:`node.core.a2a.convert`) — with one thing added: the
registry's extension (:data:`REGISTRY_EXTENSION_URI`) appended to ``capabilities.extensions``,
whose ``params`` say what only the registry knows (region, status, readiness, lease, how to be
routed). Nothing of the agent's is changed. A signed card keeps its ``signatures`` and gets the
extension too: what the registry says of an agent is always its own word (a client that
verifies the signatures checks them over the card without that extension), and an extension
that only passes for the registry's is never served. An agent registered by
hand gets a card made from its record; its interfaces name the binding it speaks (an A2A one
for ``a2a+…`` transports, ``AGENT-REACH+<TRANSPORT>`` for the Agent-Reach envelope) and its
``securitySchemes`` say how to authenticate: the route credential a resolve hands out, as
``Authorization: Bearer``. The registry's own card describes it as an agent whose skills are
resolve, search and the agent list, and whose interface is the v1 API. This module does no I/O.
"""

from __future__ import annotations

from typing import Any

from ..models import AgentRecord, a2a_interface
from .convert import as_v1
from .registration import REGISTRY_EXTENSION_URI, registry_like

ENVELOPE_BINDING_PREFIX = "AGENT-REACH+"
REGISTRY_BINDING = "AGENT-REACH-V1"
ROUTE_CREDENTIAL_SCHEME = "agentReachRouteCredential"
REGISTRY_TOKEN_SCHEME = "agentReachToken"
AGENT_CARD_PATH = "/.well-known/agent-card.json"
AGENT_CARD_ROUTE = "/agents/{agent_id}" + AGENT_CARD_PATH


def agent_card_url(node_url: str, agent_id: str) -> str:
    """Where A2A clients find an agent's card: ``A2ACardResolver(client, f"{node_url}/agents/{agent_id}")``."""
    return f"{node_url}/agents/{agent_id}{AGENT_CARD_PATH}"


def exported_card(record: AgentRecord, *, node_url: str, routable: bool) -> dict[str, Any]:
    """The v1.0 card of ``record``: as registered (plus the registry's extension), or made from the record."""
    card = as_v1(record.a2a.card) if record.a2a is not None else _record_card(record)
    capabilities = card.get("capabilities") or {}
    # Only the registry's own extension says what the registry knows: one that passes for it (a
    # card stored before such cards were refused) never goes out.
    theirs = [extension for extension in capabilities.get("extensions") or []
              if not (isinstance(extension, dict) and registry_like(extension.get("uri")))]
    capabilities["extensions"] = [*theirs, registry_extension(record, node_url=node_url, routable=routable)]
    card["capabilities"] = capabilities
    return card


def registry_extension(record: AgentRecord, *, node_url: str, routable: bool) -> dict[str, Any]:
    """What the registry adds to an agent's card: an extension of its own, never the agent's fields."""
    return {"uri": REGISTRY_EXTENSION_URI, "required": False,
            "description": "Agent-Reach registry: where the agent is registered and how callers are routed to it",
            "params": {
                "agentId": record.agent_id, "region": record.region, "status": record.status.value,
                "live": record.live, "ready": record.ready, "routable": routable,
                "leaseExpiresAtMs": record.lease_expires_at_ms, "recordVersion": record.version,
                "capabilities": [capability.name for capability in record.capabilities],
                "resolveUrl": f"{node_url}/v1/resolve", "cardUrl": agent_card_url(node_url, record.agent_id),
                "routeCredential": "POST resolveUrl with {\"agent_id\": agentId} (or a capability): the ticket's "
                                   "target.credential goes to the agent as 'Authorization: Bearer <credential>'",
            }}


def _record_card(record: AgentRecord) -> dict[str, Any]:
    """The card of an agent registered by hand (``POST /v1/agents``)."""
    binding, protocol_version = a2a_interface(None, record.transport, record.labels)
    if binding is None:
        binding, protocol_version = ENVELOPE_BINDING_PREFIX + record.transport.upper(), "1"
    interfaces = [{"url": url, "protocolBinding": binding, "protocolVersion": protocol_version}
                  for name, url in sorted(record.endpoints.items(), key=lambda item: item[0] != "primary")]
    versions = [capability.parsed_version for capability in record.capabilities]
    card: dict[str, Any] = {
        "name": record.display_name or record.agent_id,
        "description": record.description,
        "supportedInterfaces": interfaces,
        "version": str(max(versions)) if versions else "1",
        "capabilities": {},
        "securitySchemes": {ROUTE_CREDENTIAL_SCHEME: {"httpAuthSecurityScheme": {
            "scheme": "Bearer", "bearerFormat": "JWT",
            "description": "An Agent-Reach route credential (EdDSA JWT): POST /v1/resolve at the registry and send "
                           "the ticket's target.credential; the agent verifies it against the registry's "
                           "/.well-known/jwks.json"}}},
        "securityRequirements": [{"schemes": {ROUTE_CREDENTIAL_SCHEME: {"list": []}}}],
        "defaultInputModes": ["application/json"],
        "defaultOutputModes": ["application/json"],
        "skills": [{"id": capability.name, "name": capability.name, "description": capability.description,
                    "tags": capability.tags, "examples": capability.examples} for capability in record.capabilities],
    }
    if "a2a.provider" in record.labels:
        card["provider"] = {"organization": record.labels["a2a.provider"]}
    return card


_REGISTRY_SKILLS = (
    ("resolve", "Resolve an agent",
     "POST /v1/resolve with a capability, agent_id, name pattern or tags: a signed route ticket naming the agent, "
     "its endpoint and A2A binding, and the route credential to call it with.",
     ["registry", "routing"], ['{"capability": "translate.text"}', '{"tags": ["fx"]}']),
    ("search", "Search agents",
     "GET /v1/search?q=<plain language>: the agents (and their capabilities) that fit a description, best first.",
     ["registry", "search"], ["GET /v1/search?q=translate a contract into English"]),
    ("list", "List agents",
     "GET /v1/agents?capability=…&tag=…&label=k=v: the agents the caller may see; each agent's card is at "
     "/agents/{agent_id}/.well-known/agent-card.json.",
     ["registry", "discovery"], ["GET /v1/agents?tag=fx"]),
)


def registry_card(*, node_url: str, region: str, public_cards: bool) -> dict[str, Any]:
    """The registry's own Agent Card (``/.well-known/agent-card.json``, public)."""
    return {
        "name": f"Agent-Reach registry ({region})",
        "description": "The registry and router of region " + region + ": find agents by capability, tag or plain "
                       "language and get a route ticket to call them. Agent cards: /agents/{agent_id}"
                       + AGENT_CARD_PATH + ".",
        "supportedInterfaces": [{"url": f"{node_url}/v1", "protocolBinding": REGISTRY_BINDING,
                                 "protocolVersion": "1"}],
        "version": "1",
        "documentationUrl": f"{node_url}/v1/openapi.json",
        "capabilities": {"extensions": [{
            "uri": REGISTRY_EXTENSION_URI, "required": False,
            "description": "Agent-Reach registry: where its agents' cards are",
            "params": {"region": region, "agentCardUrlTemplate": agent_card_url(node_url, "{agent_id}"),
                       "publicCards": public_cards, "jwksUrl": f"{node_url}/.well-known/jwks.json"}}]},
        "securitySchemes": {REGISTRY_TOKEN_SCHEME: {"httpAuthSecurityScheme": {
            "scheme": "Bearer", "bearerFormat": "ar1",
            "description": "An Agent-Reach token (agent-reach token issue) as 'Authorization: Bearer <token>'"}}},
        "securityRequirements": [{"schemes": {REGISTRY_TOKEN_SCHEME: {"list": []}}}],
        "defaultInputModes": ["application/json"],
        "defaultOutputModes": ["application/json"],
        "skills": [{"id": skill_id, "name": name, "description": description, "tags": tags, "examples": examples}
                   for skill_id, name, description, tags, examples in _REGISTRY_SKILLS],
    }


__all__ = ["AGENT_CARD_PATH", "AGENT_CARD_ROUTE", "ENVELOPE_BINDING_PREFIX", "REGISTRY_BINDING",
           "ROUTE_CREDENTIAL_SCHEME", "agent_card_url", "exported_card", "registry_card", "registry_extension"]
