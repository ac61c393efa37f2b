"""The agents one session carries (``node.http.sessions``), and the frame a session sends most.

A :class:`Roster` keeps, per agent, what the token it joined with said (a :class:`Member`), and
which of them may not renew now (the token expired or was revoked). That is worked out for the
whole roster when it can have changed — the deny list moved (``RevocationList.stable_until``),
a deny-list entry or a member's token ends, an agent joined — not once per renewal: 100,000 agents
renewing every 10 s are 10,000 renewals a second, and the answer changes a few times a day.

:func:`plain_renewal` reads the renew frame of lease-only beats of joined agents (what the SDK
sends every interval) with ``orjson`` and a few checks instead of the frame models: its agent ids
were validated when they joined. Any other frame, or one that is not quite that, is left to the
models (``CLIENT_FRAMES``), whose errors name the problem.
"""

from __future__ import annotations

import orjson

from ..core import NodeError, Unauthorized
from ..core.models import MAX_FRAME_ITEMS, TokenClaims
from ..trust import RevocationList

__all__ = ["Member", "PlainRenewal", "Roster", "plain_renewal"]


class Member:
    """What a renewal checks again of the token an agent joined with: its expiry, and revocation
    by its id, by the id of the token it was forwarded for, or by subject. Not the claims object
    (about 1.3 KiB with its strings): a node holds 100,000 agents on sessions and more."""

    __slots__ = ("exp", "iat", "role", "sub", "jti", "fwd")

    def __init__(self, claims: TokenClaims, agent_id: str) -> None:
        self.exp, self.iat, self.role, self.jti, self.fwd = claims.exp, claims.iat, claims.role, claims.jti, claims.fwd
        self.sub = agent_id if claims.sub == agent_id else claims.sub  # an agent's own token: the id already held

    def claims(self) -> TokenClaims:
        """The claims again (checked when the agent joined), for a beat that goes the HTTP way."""
        return TokenClaims.model_construct(sub=self.sub, role=self.role, exp=self.exp, iat=self.iat, jti=self.jti,
                                           fwd=self.fwd)


class Roster:
    """A session's members by agent id, and which of them may not renew, as of the last check."""

    __slots__ = ("members", "_refused", "_generation", "_until_ms")

    def __init__(self) -> None:
        self.members: dict[str, Member] = {}
        self._refused: dict[str, NodeError] = {}
        self._generation = -1  # the deny list's generation at the last check
        self._until_ms = 0  # the last check holds until then (0: check again)

    def __len__(self) -> int:
        return len(self.members)

    def join(self, agent_id: str, member: Member, revocations: RevocationList, now_ms: int) -> None:
        """Carry ``agent_id``, whose token (``member``) was just verified: not expired, not revoked.
        A roster checked against the deny list as it is now stays so (no check of 1,000 agents
        again at the first renewal after a join); one that was not is checked at the next."""
        generation, stable_until = revocations.stable_until(now_ms)
        if not self.members:
            self._refused, self._generation, self._until_ms = {}, generation, stable_until
        self.members[agent_id] = member
        if generation == self._generation:
            self._refused.pop(agent_id, None)
            self._until_ms = min(self._until_ms, member.exp * 1000)

    def leave(self, agent_id: str) -> bool:
        self._refused.pop(agent_id, None)
        return self.members.pop(agent_id, None) is not None

    def refused(self, revocations: RevocationList, now_ms: int) -> dict[str, NodeError]:
        """The members that may not renew at ``now_ms``, and why (usually none)."""
        generation, stable_until = revocations.stable_until(now_ms)
        if generation != self._generation or now_ms >= self._until_ms:
            self._check(revocations, now_ms, generation, stable_until)
        return self._refused

    def refusal(self, agent_id: str, revocations: RevocationList, now_ms: int) -> NodeError | None:
        """Why ``agent_id`` may not renew over this session now (not joined, its token expired or
        revoked), or None."""
        if agent_id not in self.members:
            return Unauthorized(f"agent {agent_id} has not joined this session: send a join frame with its token",
                                code="not_joined")
        return self.refused(revocations, now_ms).get(agent_id)

    def _check(self, revocations: RevocationList, now_ms: int, generation: int, stable_until: int) -> None:
        refused: dict[str, NodeError] = {}
        until = stable_until
        now_s = now_ms / 1000
        for agent_id, member in self.members.items():
            if member.exp <= now_s:
                refused[agent_id] = Unauthorized("the token the agent joined with has expired; issue a new one and "
                                                 "join again", code="token_expired")
                continue
            until = min(until, member.exp * 1000)  # then this one expires: check again
            if revocations.refuses_token(jti=member.jti, forwarded_jti=member.fwd.jti if member.fwd else None,
                                         role=member.role, sub=member.sub, iat=member.iat):
                refused[agent_id] = Unauthorized("the token was revoked; ask for a new one ('agent-reach token issue')",
                                                 code="token_revoked")
        self._refused, self._generation, self._until_ms = refused, generation, until


class PlainRenewal:
    """A renew frame of lease-only beats of agents the session carries (:func:`plain_renewal`)."""

    __slots__ = ("id", "agents")

    def __init__(self, frame_id: int, agents: list[str]) -> None:
        self.id = frame_id
        self.agents = agents


def plain_renewal(data: str | bytes, members: dict[str, Member]) -> PlainRenewal | None:
    """``{"t": "renew", "id": N, "beats": [{"agent_id": …}, …]}`` of joined agents, read at once;
    None for anything else (then the frame models read it, and say what is wrong)."""
    try:
        frame = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if type(frame) is not dict or len(frame) != 3 or frame.get("t") != "renew":
        return None
    frame_id, beats = frame.get("id"), frame.get("beats")
    if type(frame_id) is not int or frame_id < 0 or type(beats) is not list or len(beats) > MAX_FRAME_ITEMS:
        return None
    agents: list[str] = []
    for beat in beats:
        if type(beat) is not dict or len(beat) != 1:
            return None
        agent_id = beat.get("agent_id")
        if type(agent_id) is not str or agent_id not in members:
            return None
        agents.append(agent_id)
    return PlainRenewal(frame_id, agents)
