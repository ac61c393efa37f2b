"""Who may reach which agent beyond its own ``allowed_callers``: the region's ACL rules, which an
admin manages at runtime (``/v1/acl``) and which travel to every region, and the caller patterns
every list of callers is made of. This module does no I/O.

A rule names agents (an agent-id pattern, ``fin.*.*``), optionally one capability of theirs, the
callers it is about (patterns as ``allowed_callers`` takes them) and its effect:

* ``deny``: those callers may not see nor call those agents (for that capability, if it names one);
* ``allow``: those agents (that capability) are for those callers only — the agents the rule
  names are hidden from every other caller, as if each had them in its ``allowed_callers``.

Admins, peers and an agent itself are never refused by a rule (as by ``allowed_callers``). A rule
without a capability decides whether an agent is shown at all (get, list, search, cards, watch,
traces, decisions) and routed to; one with a capability only whether that capability is routed to.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import AfterValidator, Field

from .fields import CAPABILITY_NAME_PATTERN, SINGLE_LINE_PATTERN, Millis, Region, Strict, compile_pattern
from .tokens import TokenRole

ACL_RULE_ID_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
MAX_ACL_RULES = 256
MAX_RULE_CALLERS = 64


def check_caller_pattern(pattern: str) -> str:
    """``pattern`` if it names callers (``admin``, an agent id, or an agent-id glob); raises ValueError."""
    if pattern != "admin":
        compile_pattern(pattern)
    return pattern


def _agent_pattern(pattern: str) -> str:
    compile_pattern(pattern)
    return pattern


CallerPattern = Annotated[str, Field(max_length=200, pattern=SINGLE_LINE_PATTERN), AfterValidator(check_caller_pattern)]
CallerPatterns = Annotated[list[CallerPattern], Field(max_length=MAX_RULE_CALLERS)]


def caller_matches(caller: str, role: TokenRole, patterns: list[str]) -> bool:
    """Whether a caller (token subject, role) is one ``patterns`` name: ``"admin"`` names the admin
    role, never a subject; anything else an exact subject or an agent-id glob."""
    for pattern in patterns:
        if pattern == "admin":
            if role is TokenRole.ADMIN:
                return True
        elif pattern == caller or compile_pattern(pattern).match(caller):
            return True
    return False


class AclEffect(str, enum.Enum):
    """``allow``: only the rule's callers reach its agents; ``deny``: the rule's callers do not."""

    ALLOW = "allow"
    DENY = "deny"


class AclRule(Strict):
    """One of the region's ACL rules (``PUT /v1/acl/{rule_id}``, ``agent-reach acl set``)."""

    agents: Annotated[str, Field(max_length=200, examples=["fin.*.*"]), AfterValidator(_agent_pattern)] = Field(
        description="The agents the rule is about: an agent id or a pattern with '*' per segment "
                    "(namespace.group.name).")
    capability: str | None = Field(
        default=None, pattern=CAPABILITY_NAME_PATTERN,
        description="Only this capability of those agents (routing by it); None: the agents as a whole.")
    callers: CallerPatterns = Field(
        min_length=1, description="The callers the rule is about: token subjects or patterns ('fin.*.*'); 'admin' "
                                  "names the admin role.")
    effect: AclEffect = AclEffect.DENY
    description: str = Field(default="", max_length=500, pattern=SINGLE_LINE_PATTERN)


class AclEntry(Strict):
    """A rule as the region holds it: with its id, the region it was set in and when (ms)."""

    id: str = Field(pattern=ACL_RULE_ID_PATTERN)
    rule: AclRule | None = Field(
        default=None, description="None: the rule was deleted (kept so an older set elsewhere loses).")
    origin: Region
    at_ms: Millis


class AclList(Strict):
    """``GET /v1/acl``: the rules in force in this region (from every region), by id."""

    region: Region
    version: int
    rules: list[AclEntry]


__all__ = ["ACL_RULE_ID_PATTERN", "MAX_ACL_RULES", "AclEffect", "AclEntry", "AclList", "AclRule", "CallerPattern",
           "CallerPatterns", "caller_matches", "check_caller_pattern"]
