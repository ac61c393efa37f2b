"""How traffic crosses regions: the shares of the priority levels, decided by peers' summaries.

The head of the level list — the caller's preferred region, then this region (or the one
``global`` level) — takes traffic as before: each its healthy share × the overprovisioning
factor, in order. What they leave spills to the fresh peer regions together, each taking a part
proportional to what it can serve: the healthy weight its summary reports for the capability
(only the versions the request accepts), discounted by its utilisation
(``CapabilitySummary.serving_weight``). A region whose summary says nobody healthy serves gets
nothing. Peers without a usable summary (none within ``stale_after_ms``, or one older than the
replica's version), and requests a summary cannot judge (labels, tags, a pattern, an agent_id),
count the healthy weight of the replicated records instead. Stale peers
stay the last resort (the router tries them only when no fresh level can serve).

Inside a replicated region the agent is then drawn from the replica by registered weight ×
status (never its stale per-agent load: ``node.routing.candidates``). A summary-only region (beyond the
replicate depth) is a *forwarded* level: it has no records here, so when it is drawn the router
raises :class:`ForwardTo` and its async path asks that region's node (``scope=local``, and a
token marked as forwarded, so it cannot loop), falling back to the other levels when it does not
answer in time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from ..core.models import RouteRequest, RouteTicket, Scope, TokenClaims, VersionConstraint, compat, version_constraint
from .candidates import Level
from .remote import PeerView

__all__ = ["ForwardTo", "ForwardedDecision", "ForwardedTarget", "forwarded_levels", "level_shares"]


class ForwardTo(Exception):  # noqa: N818 - a control-flow signal inside the router, never raised to a caller
    """The level drawn is a summary-only region: ask its node (the router's async path catches it)."""

    def __init__(self, region: str, reasons: dict[str, str]) -> None:
        super().__init__(region)
        self.region = region
        self.reasons = reasons


def summary_judges(request: RouteRequest) -> bool:
    """Can a per-capability summary say whether a region serves ``request``?"""
    return bool(request.capability) and not (request.pattern or request.agent_id or request.labels or request.tags)


def _constraint(request: RouteRequest) -> VersionConstraint | None:
    return version_constraint(request.version) if request.version else None


def forwarded_levels(peers: Sequence[PeerView], request: RouteRequest, caller: TokenClaims, *,
                     unanswered: Mapping[str, str], reasons: dict[str, str]) -> list[Level]:
    """A level per summary-only peer whose summary says it can serve ``request`` (none for a
    local-only request, nor for one that arrived forwarded: it is never forwarded again); why each
    other one cannot goes to ``reasons``. ``unanswered``: peers that did not answer a forwarded
    resolve of this request, with why."""
    levels: list[Level] = []
    summary_only = [peer for peer in peers if not peer.replicated]
    if not summary_only or request.scope is Scope.LOCAL:
        return levels
    if caller.fwd is not None:
        reasons["summary-only regions"] = (f"the request arrived forwarded from region {caller.fwd.region}; "
                                           "a forwarded request is never forwarded again")
        return levels
    constraint = _constraint(request) if summary_judges(request) else None
    for peer in summary_only:
        label = f"region {peer.region} (summary only)"
        if peer.region in unanswered:
            reasons[label] = unanswered[peer.region]
            continue
        if not summary_judges(request):
            reasons[label] = "only capability requests (without labels or tags) are forwarded to it"
            continue
        summary = peer.summary
        if summary is None:
            reasons[label] = "no summary received lately"
            continue
        weight = summary.serving_weight(request.capability or "", constraint)
        if weight <= 0:
            reasons[label] = f"its summary has no healthy agent for capability {request.capability!r}"
            continue
        levels.append(Level(name=peer.region, candidates=[], registered_weight=weight, stale=peer.stale,
                            forwarded=True))
    return levels


def level_shares(levels: Sequence[Level], request: RouteRequest, *, home: str, peers: Mapping[str, PeerView],
                 overprovisioning_factor: float) -> list[float]:
    """Each level's share of the traffic (they sum to at most 1; see the module docstring)."""
    shares = [0.0] * len(levels)
    remaining = 1.0
    spill: list[int] = []
    for position, level in enumerate(levels):
        if level.name not in (home, request.preferred_region, "global"):
            spill.append(position)
            continue
        health = 0.0
        if level.forwarded:
            health = 1.0
        elif level.candidates and level.registered_weight > 0:
            health = min(1.0, overprovisioning_factor * level.healthy_weight / level.registered_weight)
        shares[position] = min(remaining, health)
        remaining -= shares[position]
    if not spill or remaining <= 0:
        return shares
    judged = summary_judges(request)
    constraint = _constraint(request) if judged else None
    capacities = {position: _capacity(levels[position], peers.get(levels[position].name), request, judged, constraint)
                  for position in spill}
    total = sum(capacities.values())
    if total > 0:
        for position, capacity in capacities.items():
            shares[position] = remaining * capacity / total
    return shares


def _capacity(level: Level, peer: PeerView | None, request: RouteRequest, judged: bool,
              constraint: VersionConstraint | None) -> float:
    if level.forwarded:
        return level.registered_weight  # the summary's serving weight (forwarded_levels)
    if not level.candidates:
        return 0.0
    summary = peer.summary if peer is not None and judged else None
    # A summary older than the replica (a registration arrived before the next summary) does not
    # know what the records do: they count until a summary catches up.
    if summary is not None and summary.watermark >= peer.index.version:  # type: ignore[union-attr]
        return summary.serving_weight(request.capability or "", constraint)
    return level.healthy_weight


@dataclass(slots=True)
class ForwardedTarget:
    """A target of a ticket a peer's node issued (what the decision log and metrics read)."""

    target: dict[str, object]


@dataclass(slots=True, kw_only=True)
class ForwardedDecision:
    """A decision made by a summary-only region's node: its ticket, as it signed it."""

    ticket_id: str
    trace_id: str
    target: ForwardedTarget
    alternates: list[ForwardedTarget]
    match: dict[str, object]
    issued_at_ms: int
    expires_at_ms: int
    caller: str
    signature: str
    wire: dict[str, object]

    @classmethod
    def of(cls, ticket: RouteTicket) -> ForwardedDecision:
        """From the peer's (validated) ticket; its locality is ``remote`` seen from here (the ticket's
        signature covers its id, agents, caller, expiry and capabilities, not the locality)."""
        wire = ticket.model_dump(mode="json")
        wire["locality"] = "remote"
        for target in (wire["target"], *wire["alternates"]):
            target["locality"] = "remote"
        return cls(ticket_id=ticket.ticket_id, trace_id=ticket.trace_id, target=ForwardedTarget(wire["target"]),
                   alternates=[ForwardedTarget(target) for target in wire["alternates"]], match=wire["match"],
                   issued_at_ms=ticket.issued_at_ms, expires_at_ms=ticket.expires_at_ms, caller=ticket.caller,
                   signature=ticket.signature, wire=wire)

    def as_dict(self, *, weights: bool = False, remote: bool = False) -> dict[str, object]:
        """The peer's ticket (``weights``: as the peer drew them, when it put any on its targets)."""
        return self.wire

    def to_json(self, *, weights: bool = False, remote: bool = False) -> bytes:
        return orjson.dumps(self.as_dict(weights=weights))

    def ticket(self) -> RouteTicket:
        return compat.read_python(RouteTicket, self.wire)
