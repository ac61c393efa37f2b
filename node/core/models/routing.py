"""Routing at the boundary: what a caller asks for (:class:`RouteRequest`), the signed answer
(:class:`RouteTicket`, whose targets carry route credentials), an alternate's credential
(:class:`CredentialRequest`, :class:`IssuedCredential`) and what the caller reports back
(:class:`OutcomeReport`). This module does no I/O.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from .fields import SINGLE_LINE_PATTERN, TRACE_ID_PATTERN, AgentId, Region, ShortText, Strict, compile_pattern
from .versions import version_constraint


class Scope(str, enum.Enum):
    """Which regions a request looks at: ``local`` this region only; ``local-first`` this region,
    then the peers nearest first when it cannot serve (the default of resolve, send and list);
    ``global`` every region as one pool (the default of search)."""

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
    semantic: bool = Field(default=True, description="False: never the semantic fallback, only an agent that "
                                                      "has the capability by name (or the agent_id or pattern).")
    exclude: list[AgentId] = Field(default_factory=list, max_length=64)
    tags: list[Annotated[str, Field(min_length=1, max_length=64, pattern=SINGLE_LINE_PATTERN)]] = Field(
        default_factory=list, max_length=8,
        description="Only an agent whose matched capability (an A2A card's skill) carries every one of these tags "
                    "(compared case-insensitively); alone, they select any agent with such a capability.")
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
        chosen = [name for name in ("capability", "agent_id", "pattern", "tags") if getattr(self, name)]
        if not chosen:
            raise ValueError("give one of capability, agent_id, pattern or tags")
        return self


class MatchKind(str, enum.Enum):
    EXACT = "exact"
    PATTERN = "pattern"
    AGENT_ID = "agent_id"
    TAG = "tag"
    SEMANTIC = "semantic"


class Locality(str, enum.Enum):
    LOCAL = "local"
    REMOTE = "remote"


class RouteTarget(Strict):
    agent_id: AgentId
    region: Region
    endpoint: str
    transport: str
    binding: str | None = Field(
        default=None, description="The A2A protocol binding to call the endpoint with (JSONRPC, HTTP+JSON, GRPC, "
                                  "…: the agent's preferred interface); null: the Agent-Reach envelope (or the raw "
                                  "payload, transport passthrough).")
    protocol_version: str | None = Field(default=None, description="The A2A protocol version of that interface.")
    callback_endpoint: str | None = None
    locality: Locality = Locality.LOCAL
    stale: bool = False
    credential: str | None = Field(
        default=None, description="The route credential for this target: send it as 'Authorization: Bearer "
                                  "<credential>'. The ticket's target carries one; an alternate's is issued when "
                                  "the caller fails over to it (POST /v1/credentials).")
    weight: float | None = Field(
        default=None, ge=0, description="Asked for with POST /v1/resolve?weights=true: the target's effective weight "
                                        "when the ticket was issued (registered weight x status, load and error "
                                        "factors). A caller that reuses the ticket draws each call among the targets "
                                        "that carry one, in proportion to it. Null: fail over to it, never draw it.")


class Match(Strict):
    """How the target was found: by name (``exact``, ``pattern``, ``agent_id``) or by the semantic
    fallback (``semantic``, with its ``score``), and which of its capabilities matched."""

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


class CredentialRequest(Strict):
    """Ask for the route credential of one of a ticket's alternates (the target's came with it)."""

    signature: str = Field(max_length=4_000, description="The ticket's signature.")
    agent_id: AgentId = Field(description="The alternate to be called.")


class IssuedCredential(Strict):
    """A route credential for one target of a ticket; it expires with the ticket."""

    agent_id: AgentId
    credential: str
    expires_at_ms: int


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
