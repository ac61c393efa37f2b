"""Who a request is from and what it is told when refused: a bearer token's claims and role,
and the JSON error body every route answers with. This module does no I/O.
"""

from __future__ import annotations

import enum

from pydantic import Field

from .fields import SINGLE_LINE_PATTERN, Count, Strict


class ErrorBody(Strict):
    error: str = Field(description="snake_case code, e.g. no_agent_available")
    message: str
    field: str | None = None
    details: dict[str, object] | None = None


class TokenRole(str, enum.Enum):
    """admin: anything; agent: act for its own agent_id; caller: resolve, search, send, report;
    peer: another region's node (snapshot and vectors, which show every record)."""

    ADMIN = "admin"
    AGENT = "agent"
    CALLER = "caller"
    PEER = "peer"


class TokenClaims(Strict):
    """What a bearer token asserts; signed with the cluster secret."""

    sub: str = Field(max_length=200, pattern=SINGLE_LINE_PATTERN)
    role: TokenRole
    exp: Count = Field(description="Expiry, seconds since the epoch.")
    iat: Count
