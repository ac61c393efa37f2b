"""Routing at the boundary: what a caller asks for (:class:`RouteRequest`), the signed answer
(:class:`RouteTicket`) and what the caller reports back (:class:`OutcomeReport`).
This module does no I/O.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from .fields import SINGLE_LINE_PATTERN, TRACE_ID_PATTERN, AgentId, Region, ShortText, Strict, compile_pattern
from .versions import version_constraint


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
