"""Shapes of the answers the handlers write as dictionaries, for the document to describe.

The fuzz test (``tests/http/test_fuzz.py``) fails when a handler and its shape here drift apart.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Deregistered(Shape):
    """``DELETE /v1/agents/{agent_id}``: the tombstone's region version."""

    agent_id: str
    version: int
    deregistered: Literal[True]


class Accepted(Shape):
    """How many reports or route events were taken."""

    accepted: int = Field(ge=0)


class DecisionEntry(Shape):
    """One line of the decision log (``node.decisions``): a route decision, a reported outcome, or
    an admin's action on the agent."""

    kind: Literal["decision", "outcome", "admin"]
    at_ms: int
    trace_id: str | None = Field(default=None, description="The collaboration's trace (absent on a refusal that "
                                                             "named none, or an outcome on another node's ticket)")
    ticket_id: str | None = None
    node_region: str
    caller: str
    result: str | None = Field(default=None, description='Decisions: "ok" or the refusal\'s error code')
    agent_id: str | None = None
    region: str | None = None
    locality: str | None = None
    match: str | None = Field(default=None, description="exact, pattern, agent_id or semantic")
    capability: str | None = None
    score: float | None = None
    alternates: list[str] | None = None
    detail: str | None = None
    outcome: str | None = Field(default=None, description="Outcomes: success, error, timeout …")
    latency_ms: float | None = None
    action: str | None = Field(default=None, description="Admin actions: status, weight, status_weight, deregister, "
                                                         "revoke_tokens")
    version: int | None = Field(default=None, description="Admin actions: the record's region version after it")


class AgentDecisions(Shape):
    """``GET /v1/agents/{agent_id}/decisions``: this node's recent entries about the agent, newest first."""

    agent_id: str
    region: str
    node_id: str
    count: int = Field(ge=0)
    decisions: list[DecisionEntry]


class ProbeResult(Shape):
    """One probe the leader ran (``node.duties.prober``)."""

    kind: Literal["liveness", "readiness"]
    at_ms: int
    ok: bool
    latency_ms: float = Field(ge=0)
    error: str | None = Field(description="Why it failed (None when it passed)")


class AgentProbes(Shape):
    """``GET /v1/agents/{agent_id}/probes``: the probe results this node kept, newest first."""

    agent_id: str
    region: str
    node_id: str
    leader: bool = Field(description="This node is its region's leader, the one that probes (a follower has none)")
    probes: list[ProbeResult]


class AgentChanged(Shape):
    """``PATCH /v1/admin/agents/{agent_id}``: the record after the change."""

    agent_id: str
    region: str
    version: int
    status: Literal["ready", "degraded", "busy", "draining", "unready"]
    weight: int = Field(ge=0)
    changed: bool = Field(description="False when the agent had that status and weight already")


class AgentTokensRevoked(Shape):
    """``POST /v1/admin/agents/{agent_id}/revoke-tokens``: the agent's tokens issued so far are refused."""

    agent_id: str
    region: str
    issued_until_s: int = Field(description="Agent tokens of this id issued at or before this second (since the "
                                            "epoch) are refused; one issued later is accepted")
    new: bool = Field(description="False when such a revocation was in force already")
    poll_interval_ms: int = Field(description="Every node of the region refuses them within about this long")
    peers: list[str] = Field(description="The regions the federation sends the revocation to")


class KeyRotated(Shape):
    """``POST /v1/admin/keys/rotate``: the key this node signs route credentials with from now on."""

    region: str
    kid: str = Field(description="<region>.<thumbprint>; the old key stays in the key set until its lease ends")
    rotations: int = Field(ge=0, description="Rotations by this node since it started")


class BreakerEntry(Shape):
    agent_id: str
    state: Literal["closed", "open", "half_open"]
    error_factor: float = Field(ge=0, le=1, description="The routing weight's factor from reported errors (1 = clean)")


class Breakers(Shape):
    """``GET /v1/breakers``: what this node learnt from call outcome reports (each replica its own)."""

    region: str
    node_id: str
    breakers: list[BreakerEntry]


class TokenRevoked(Shape):
    """``POST /v1/admin/tokens/revoke``: the token is refused in this region until it expires."""

    region: str
    jti: str
    revoked_until_ms: int = Field(description="The deny-list entry ends with the token (its exp, in ms)")
    new: bool = Field(description="False when the token was on the list already, or has expired")
    expired: bool = Field(description="The token had expired already: nothing to refuse")
    poll_interval_ms: int = Field(description="Every node of the region refuses it within about this long")
    peers: list[str] = Field(description="The regions the federation sends the revocation to over Kafka, where "
                                         "it takes effect within about a second (empty: no federation)")


class AclChanged(Shape):
    """``PUT``/``DELETE /v1/acl/{rule_id}``: the entry as the region holds it now."""

    region: str
    rule: dict[str, Any] = Field(description="An AclEntry: id, rule (null once deleted), origin, at_ms")
    version: int = Field(description="The rules' version in this region after the change")
    poll_interval_ms: int = Field(description="Every node of the region applies it within about this long")


class Regions(Shape):
    """``GET /v1/regions``: this node and, with federation, its view of every peer."""

    region: str
    node_id: str
    version: int
    agents: int
    leader: bool
    peers: list[dict[str, Any]] = Field(description="Freshness, lag and counts per peer region (federation only).")


class QuarantinedItem(Shape):
    """One stored value that did not parse (``node.store.quarantine``)."""

    source: str
    key: str
    error: str
    agent_id: str | None
    first_seen_ms: int
    last_seen_ms: int
    seen: int


class QuarantineList(Shape):
    region: str
    count: int
    total: int
    items: list[QuarantinedItem]


class VectorRequest(Shape):
    """``POST /v1/semantic/vectors``: the cache keys a peer wants (``topology.composition.discovery``)."""

    keys: list[Annotated[str, Field(max_length=200)]] = Field(max_length=1_000)


class VectorResponse(Shape):
    vectors: dict[str, str] = Field(description="Cache key → base64 of little-endian float32 values.")


class FederationStatus(BaseModel):
    """``GET /v1/federation/status`` (its parts are federation's own counters)."""

    model_config = ConfigDict(extra="allow")

    region: str
    topic: str
    beacon_topic: str
    watermark: int
    live_count: int
    digest: str
    publisher: dict[str, Any]
    consumer: dict[str, Any]
    anti_entropy: dict[str, Any]
    peers: list[dict[str, Any]]


class ExportedAgentCard(BaseModel):
    """An A2A Agent Card (v1.0) as the registry serves it: the card the agent registered as it was
    given (a v0.3 card converted as the A2A SDK reads it) with the registry's extension
    (urn:agent-reach:a2a:registry:v1) appended to ``capabilities.extensions`` — a signed card keeps
    its signatures, verified over the card without that extension — or, for an agent registered by hand, a card
    made from its record; the registry's own card at ``/.well-known/agent-card.json``."""

    model_config = ConfigDict(extra="allow")

    name: str
    supportedInterfaces: list[dict[str, Any]] = Field(min_length=1)
    skills: list[dict[str, Any]] = Field(description="Empty for an agent registered without capabilities.")


class Health(Shape):
    status: Literal["ok"]
    region: str
    node_id: str


class Ready(Shape):
    status: Literal["ready"]
    region: str
    version: int


class Unready(Shape):
    status: Literal["unready"]
    region: str
    state: str
    store: str
