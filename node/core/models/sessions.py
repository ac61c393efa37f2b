"""The frames of a session (``GET /v1/session``): one JSON object per WebSocket frame.

The node's side is ``node.http.sessions``, the SDK's ``node.client._session``; both read and
write these models, so they are the contract (the OpenAPI document names the route only).

===========  ===========================================================================
client       ``join`` (each agent with its own token); ``renew`` (``id``, ``beats``: agent_id,
             optional status and load — an HTTP heartbeat's body); ``load`` (``id``, ``loads``:
             agent_id, load — ``PUT …/load``); ``leave`` (agents that stop cleanly: no
             suspicion); ``watch`` (agents the process holds tickets for)
node         ``joined`` (``agents``, ``refused``); ``renewed`` / ``loaded`` (``id``, ``leases``,
             ``errors`` by agent: the HTTP error body); ``gone`` (``agents``, ``reason``:
             deregistered, expired, status, suspect, ejected); ``error``
===========  ===========================================================================
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from .fields import AgentId, Strict
from .records import Load, Status

MAX_FRAME_ITEMS = 1_000  # agents per frame
SESSION_TOKEN_CHARS = 8_192


class JoinAgent(Strict):
    agent_id: AgentId
    token: str = Field(min_length=1, max_length=SESSION_TOKEN_CHARS)


class Join(Strict):
    """Carry these agents on the session, each authorised by its own token."""

    t: Literal["join"]
    agents: list[JoinAgent] = Field(max_length=MAX_FRAME_ITEMS)


class Beat(Strict):
    agent_id: AgentId
    status: Status | None = None
    load: Load | None = None


class Renew(Strict):
    """Renew the beats' leases (with a status or load, as an HTTP heartbeat does)."""

    t: Literal["renew"]
    id: int = Field(ge=0)
    beats: list[Beat] = Field(max_length=MAX_FRAME_ITEMS)


class LoadItem(Strict):
    agent_id: AgentId
    load: Load


class Loads(Strict):
    """Report loads between renewals (``PUT …/load``)."""

    t: Literal["load"]
    id: int = Field(ge=0)
    loads: list[LoadItem] = Field(max_length=MAX_FRAME_ITEMS)


class Leave(Strict):
    """These agents stop cleanly: the session's end marks nothing for them."""

    t: Literal["leave"]
    agents: list[AgentId] = Field(max_length=MAX_FRAME_ITEMS)


class Watch(Strict):
    """Push ``gone`` when one of these agents is (the targets of tickets the process holds)."""

    t: Literal["watch"]
    agents: list[AgentId] = Field(max_length=MAX_FRAME_ITEMS)


ClientFrame = Join | Renew | Loads | Leave | Watch
CLIENT_FRAMES: TypeAdapter[ClientFrame] = TypeAdapter(Annotated[ClientFrame, Field(discriminator="t")])


class Joined(Strict):
    t: Literal["joined"]
    agents: list[AgentId]
    refused: list[dict[str, Any]]


class SessionAnswer(Strict):
    """``renewed`` (with each agent's new lease expiry, ms) or ``loaded``; errors by agent."""

    t: Literal["renewed", "loaded"]
    id: int
    leases: dict[str, int] = {}
    errors: dict[str, dict[str, Any]]


class Gone(Strict):
    t: Literal["gone"]
    agents: list[AgentId]
    reason: str


__all__ = ["CLIENT_FRAMES", "MAX_FRAME_ITEMS", "Beat", "ClientFrame", "Gone", "Join", "JoinAgent",
           "Joined", "Leave", "LoadItem", "Loads", "Renew", "SessionAnswer", "Watch"]
