"""Routing decisions: which agent should this caller talk to right now.

Candidates come in priority levels: the caller's preferred region (if any), the local region,
then fresh peer regions nearest first, and last the stale peers (used only when nothing fresher
can serve). Like Envoy's priority levels, each level takes traffic in proportion to its healthy
share times the overprovisioning factor (1.4), and the shortfall spills to the next level, so a
region that lost part of its capacity sheds only the part it cannot carry.

Within a level, an agent's effective weight is its registered weight × a status factor
(degraded/busy lower it) × a load factor (from heartbeats) × an error factor (from outcome
reports); the choice is weighted-random, less the agents the caller's own failures ejected for it.
A conversation_id pins the choice with weighted rendezvous hashing while the pinned agent stays a
candidate. Routing reads only memory; the semantic fallback (a :class:`Matcher`) is the only await.

A call never goes to the calling agent itself, whatever the match (the caller's token subject is
its agent id); the semantic fallback skips agents registered with ``semantic_fallback: false`` and
is off for a request with ``semantic: false``. The ticket's target carries a route credential
(:mod:`node.trust.credentials`) when the router has an issuer.

The candidates and their weights are :mod:`node.routing.candidates`; the semantic fallback's ranking is
:mod:`node.routing.fallback`. This module picks the level, the agent and the alternates, and signs.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

import orjson

from ..core import NoAgentAvailable, PeerUnreachable, now_ms
from ..core.models import AgentRecord, Locality, MatchKind, RouteRequest, RouteTicket, Scope, TokenClaims, compat
from ..delivery import OutcomeTracker
from ..trust import RegionAcl, Signer, admits
from ..view import AgentIndex
from .candidates import (
    ALL_WEIGHT_FACTORS,
    DEFAULT_MAX_EJECTION_FRACTION,
    Candidate,
    CandidateTables,
    Level,
    Source,
    Table,
    WeightFactor,
    as_seen_by,
)
from .fallback import MATCHES_ASKED, Matcher, SemanticMatch, SemanticMatches, choose, semantic_levels
from .remote import PeerForwarder, PeerView, RemoteCatalog
from .spill import ForwardedDecision, ForwardTo, forwarded_levels, level_shares


class CredentialIssuer(Protocol):
    """Signs route credentials (:class:`node.trust.credentials.RegionKeys` is one)."""

    def issue(self, *, caller: TokenClaims, agent_id: str, capability: str | None, ticket_id: str, index: int,
              expires_at_ms: int, now_ms_: int) -> str: ...

__all__ = [
    "ALL_WEIGHT_FACTORS", "CALLER_ITSELF", "DEFAULT_OVERPROVISIONING_FACTOR", "DEFAULT_TICKET_TTL_MS", "Candidate",
    "CredentialIssuer", "Decision",
    "Matcher", "PeerView", "RegionView", "RemoteCatalog", "Router", "SemanticMatch", "SemanticMatches", "WeightFactor",
]

DEFAULT_TICKET_TTL_MS = 10_000
DEFAULT_OVERPROVISIONING_FACTOR = 1.4
MAX_ALTERNATES = 2
ALTERNATE_SAMPLING_MIN = 8
CALLER_ITSELF = "caller_itself"  # the rejection reason of the calling agent's own record
EXACT_MATCHES: dict[MatchKind, dict[str, object]] = {
    kind: {"kind": kind.value, "capability": None, "version": None, "score": 1.0}
    for kind in (MatchKind.EXACT, MatchKind.PATTERN, MatchKind.AGENT_ID, MatchKind.TAG)}


class RegionView(Protocol):
    """What the router reads of its own region (``RegionCache`` is one)."""

    index: AgentIndex
    preserving: bool  # self-preservation: leases are not expired lazily while it holds

    def routable_now_ms(self) -> int:
        """Leases that ended before this instant are certainly over."""
        ...


@dataclass(slots=True, kw_only=True)
class Decision:
    """A routing decision; ``ticket()`` is its pydantic form, ``to_json()`` its wire form."""

    ticket_id: str
    trace_id: str
    target: Candidate
    alternates: list[Candidate]
    match: dict[str, object]
    issued_at_ms: int
    expires_at_ms: int
    caller: str
    signature: str
    credential: str | None = None
    # How many of target + alternates are of the target's level, drawn as Midzuno's sample (the
    # target by weight, the others uniformly): a caller drawing each call among them by weight sends
    # each agent its weight's share. 0: not drawn (a semantic match is ranked, not drawn).
    drawn: int = 0

    def as_dict(self, *, weights: bool = False, remote: bool = False) -> dict[str, object]:
        """The ticket as plain data; ``weights`` adds each drawn target's effective weight (see ``drawn``);
        ``remote`` (a resolve forwarded from another region) addresses the targets as a caller there."""
        target = self.target.target if self.credential is None else {**self.target.target,
                                                                      "credential": self.credential}
        alternates = [candidate.target for candidate in self.alternates]
        if remote:
            target = _as_remote(target, self.target.record)
            alternates = [_as_remote(t, c.record) for t, c in zip(alternates, self.alternates)]
        if weights and self.drawn:
            target = {**target, "weight": self.target.weight}
            alternates[:self.drawn - 1] = [{**c.target, "weight": c.weight} for c in self.alternates[:self.drawn - 1]]
        return {
            "ticket_id": self.ticket_id, "trace_id": self.trace_id, "target": target,
            "alternates": alternates, "match": self.match,
            "locality": self.target.target["locality"], "issued_at_ms": self.issued_at_ms,
            "expires_at_ms": self.expires_at_ms, "caller": self.caller, "signature": self.signature,
        }

    def to_json(self, *, weights: bool = False, remote: bool = False) -> bytes:
        """The ticket as JSON, without building pydantic models (the resolve hot path)."""
        return orjson.dumps(self.as_dict(weights=weights, remote=remote))

    def ticket(self) -> RouteTicket:
        return RouteTicket.model_validate(self.as_dict())


def _as_remote(target: dict[str, object], record: AgentRecord) -> dict[str, object]:
    """A target as a caller in another region reaches it: the agent's external endpoint (if any)."""
    return {**target, "endpoint": record.endpoints.get("external", record.endpoints["primary"]), "locality": "remote"}


class Router:
    """Turns a :class:`RouteRequest` into a signed :class:`RouteTicket`.

    ``clock`` is the time the router routes at (ms since the epoch): tickets' issue and expiry,
    breaker cool-downs, error decay. Leases are judged by ``cache.routable_now_ms()``.
    ``credentials`` signs the route credential of each ticket's target (None: tickets carry none).
    """

    def __init__(self, cache: RegionView, signer: Signer, outcomes: OutcomeTracker, *,
                 ticket_ttl_ms: int = DEFAULT_TICKET_TTL_MS,
                 overprovisioning_factor: float = DEFAULT_OVERPROVISIONING_FACTOR,
                 semantic_threshold: float | None = None, semantic_lexical_threshold: float | None = None,
                 factors: WeightFactor = ALL_WEIGHT_FACTORS,
                 max_ejection_fraction: float = DEFAULT_MAX_EJECTION_FRACTION,
                 rng: random.Random | None = None,
                 clock: Callable[[], int] = now_ms, credentials: CredentialIssuer | None = None) -> None:
        if ticket_ttl_ms <= 0 or overprovisioning_factor < 1.0:
            raise ValueError("ticket_ttl_ms must be positive and overprovisioning_factor at least 1.0")
        self._tables = CandidateTables(outcomes=outcomes, factors=factors,
                                       max_ejection_fraction=max_ejection_fraction)
        self.factors = factors
        self.max_ejection_fraction = max_ejection_fraction
        self.cache = cache
        self.region = cache.index.region
        self.signer = signer
        self.outcomes = outcomes
        self.ticket_ttl_ms = ticket_ttl_ms
        self.overprovisioning_factor = overprovisioning_factor
        self.semantic_threshold, self.semantic_lexical_threshold = semantic_threshold, semantic_lexical_threshold
        self.clock = clock
        self.credentials = credentials
        self.remote: RemoteCatalog | None = None
        self.forwarder: PeerForwarder | None = None  # asks summary-only peers' nodes (node.routing.spill)
        self.matcher: Matcher | None = None
        self.acl: RegionAcl | None = None  # the region's ACL rules (node.parts sets them)
        self._random = rng or random.Random()
        self._local_source: Source | None = None
        self._peer_sources: dict[str, Source] = {}

    # -- public ------------------------------------------------------------------------------

    async def resolve(self, request: RouteRequest, caller: TokenClaims) -> RouteTicket:
        """A ticket, trying the semantic fallback when the exact stages find nobody.

        Raises :class:`NoAgentAvailable` with the reason of every stage.
        """
        return (await self.decide(request, caller)).ticket()

    async def decide(self, request: RouteRequest, caller: TokenClaims) -> Decision | ForwardedDecision:
        """Like :meth:`resolve`, as a :class:`Decision` (or the ticket of a summary-only peer's node)."""
        unanswered: dict[str, str] = {}
        try:
            while True:
                try:
                    return self.decide_exact(request, caller, unanswered=unanswered)
                except ForwardTo as forward:
                    decision = await self._forward(forward.region, request, caller, unanswered)
                    if decision is not None:
                        return decision
        except NoAgentAvailable as exc:
            # Tags filter what the names select; the fallback ranks by meaning and knows no tags.
            if not (request.capability and request.semantic and not request.tags and self.matcher is not None):
                raise
            return await self._route_semantic(request, caller, exc)

    def route(self, request: RouteRequest, caller: TokenClaims) -> RouteTicket:
        """The exact stages only (memory only, no await)."""
        return self.decide_exact(request, caller).ticket()

    def decide_exact(self, request: RouteRequest, caller: TokenClaims, *,
                     unanswered: dict[str, str] | None = None) -> Decision:
        """The exact stages; raises :class:`ForwardTo` when the level drawn is a summary-only peer
        (pass ``unanswered``, the peers that did not serve a forward of this request, to draw again)."""
        now = self.clock()
        reasons: dict[str, str] = {}
        fresh, stale = self._levels(request, caller, now, reasons, unanswered or {})
        return self._decide(fresh, stale, request, caller, now, reasons, self._exact_match(request))

    async def _forward(self, region: str, request: RouteRequest, caller: TokenClaims,
                       unanswered: dict[str, str]) -> ForwardedDecision | None:
        """The ticket of ``region``'s node, or None (why in ``unanswered``: draw again without it)."""
        if self.forwarder is None:
            unanswered[region] = "no forwarder attached"
            return None
        try:
            ticket = compat.read_python(RouteTicket, await self.forwarder.resolve(region, request, caller))
        except (PeerUnreachable, NoAgentAvailable) as exc:
            unanswered[region] = exc.message
            return None
        except ValueError as exc:  # pydantic's ValidationError: the peer answered something else
            unanswered[region] = f"its node answered no route ticket ({str(exc)[:200]})"
            return None
        return ForwardedDecision.of(ticket)

    # -- levels ------------------------------------------------------------------------------

    def _sources(self, request: RouteRequest) -> list[Source]:
        """The local region, then (unless the request is local-only) the peers, nearest first.

        A source is reused while it still describes its region: building one costs about as
        much as the rest of a cached table lookup, and the local lease horizon only moves with
        the lease sync (about once a second), a peer's staleness more rarely still.
        """
        index, horizon = self.cache.index, self.cache.routable_now_ms()
        local = self._local_source
        if local is None or local.index is not index or local.lease_horizon_ms != horizon:
            local = self._local_source = Source(region=self.region, index=index, locality=Locality.LOCAL,
                                                lease_horizon_ms=horizon)
        if request.scope is Scope.LOCAL or self.remote is None:
            return [local]
        sources = [local]
        for peer in self.remote.peers():
            source, stale = self._peer_sources.get(peer.region), peer.stale
            if source is None or source.index is not peer.index or source.stale != stale:
                source = self._peer_sources[peer.region] = Source(region=peer.region, index=peer.index,
                                                                  locality=Locality.REMOTE, stale=stale)
            sources.append(source)
        return sources

    def _levels(self, request: RouteRequest, caller: TokenClaims, now: int, reasons: dict[str, str],
                unanswered: dict[str, str]) -> tuple[list[Level], list[Level]]:
        """The fresh levels in priority order, and the stale ones (last resort)."""
        levels: list[Level] = []
        stale_levels: list[Level] = []
        for source in self._sources(request):
            (stale_levels if source.stale else levels).append(self._level(source, request, caller, now, reasons))
        if request.scope is Scope.LOCAL:
            reasons["remote"] = "scope=local"
        elif self.remote is not None:
            for level in forwarded_levels(self.remote.peers(), request, caller, unanswered=unanswered, reasons=reasons):
                (stale_levels if level.stale else levels).append(level)
        if request.preferred_region:
            levels.sort(key=lambda level: level.name != request.preferred_region)
        if request.scope is Scope.GLOBAL:
            replicated = [level for level in levels if not level.forwarded]
            levels = [Level(name="global", candidates=[c for level in replicated for c in level.candidates],
                            registered_weight=sum(level.registered_weight for level in replicated)),
                      *(level for level in levels if level.forwarded)]
        return levels, stale_levels

    def _level(self, source: Source, request: RouteRequest, caller: TokenClaims, now: int,
               reasons: dict[str, str]) -> Level:
        table = self._tables.table(source, request, now, self.cache.preserving)
        itself = caller.sub in table.agent_ids
        ejected = self.outcomes.ejected_for(caller.sub, now_ms=now)  # by the caller's own failures
        acl, restricted = self.acl, table.has_acl or (self.acl is not None and self.acl.active)
        if not (restricted or request.exclude or itself or ejected):
            if not table.candidates:
                reasons[source.label] = self._why_empty(request, as_seen_by(table, source.index, caller, acl))
            return table.level
        excluded = set(request.exclude)
        visible = table.candidates
        if restricted:
            visible = [c for c in visible if admits(caller, c.record, capability=c.capability, acl=acl)]
        candidates = [c for c in visible if c.record.agent_id not in excluded and c.record.agent_id != caller.sub
                      and c.record.agent_id not in ejected]
        if len(candidates) < len(table.candidates):
            # Agents the caller may not see are not counted as matched: the reasons must not
            # reveal that they exist.
            rejected = dict(table.rejected)
            if itself:
                rejected[CALLER_ITSELF] = 1
            if mine := sum(1 for c in visible if c.record.agent_id in ejected and c.record.agent_id not in excluded):
                rejected["circuit_open"] = rejected.get("circuit_open", 0) + mine
            others = len(visible) - len(candidates) - int(itself) - mine
            if others:
                rejected["excluded"] = others
            table = replace(table, rejected=rejected, matched=table.matched - (len(table.candidates) - len(visible)))
        if not candidates:
            reasons[source.label] = self._why_empty(request, as_seen_by(table, source.index, caller, acl))
        return Level(name=source.region, candidates=candidates, registered_weight=table.registered_weight,
                     stale=source.stale)

    @staticmethod
    def _why_empty(request: RouteRequest, table: Table) -> str:
        if request.tags and table.matched and table.rejected.get("tags") == table.matched:
            named = f"capability {request.capability!r}" if request.capability else "a capability"
            return f"no agent offers {named} tagged {', '.join(request.tags)} ({table.matched} without the tags)"
        if table.matched == 0:
            if request.agent_id:
                return f"no agent {request.agent_id}"
            if request.pattern:
                with_capability = f" with capability {request.capability}" if request.capability else ""
                return f"no agent matches {request.pattern}{with_capability}"
            if request.capability:
                return f"no agent has capability {request.capability!r}"
            return f"no agent has a capability tagged {', '.join(request.tags)}"
        detail = ", ".join(f"{count} {reason}" for reason, count in sorted(table.rejected.items()))
        itself = "; a call never goes to the calling agent itself" if CALLER_ITSELF in table.rejected else ""
        return f"{table.matched} matched, none routable ({detail}){itself}"

    # -- decision ----------------------------------------------------------------------------

    def _decide(self, fresh: list[Level], stale: list[Level], request: RouteRequest, caller: TokenClaims,
                now: int, reasons: dict[str, str], match: dict[str, object]) -> Decision:
        chosen_level = self._pick_level(fresh, request) or self._pick_level(stale, request)
        if chosen_level is None:
            raise NoAgentAvailable(self._no_agent_message(request), details={"stages": reasons})
        if chosen_level.forwarded:
            raise ForwardTo(chosen_level.name, reasons)
        if request.conversation_id:
            target = _rendezvous(chosen_level.candidates, request.conversation_id)
        else:
            target = self._weighted(chosen_level.candidates, chosen_level.cumulative)
        alternates, same_level = self._alternates(target, chosen_level, itertools.chain(fresh, stale))
        if target.capability is not None:
            match = {**match, "capability": target.capability, "version": target.version}
        return self._ticket(target, alternates, match, request, caller, now, drawn=1 + same_level)

    def _pick_level(self, levels: list[Level], request: RouteRequest) -> Level | None:
        if len(levels) == 1:  # a node without peers, or a local-only request: nothing to share
            return levels[0] if levels[0].candidates or levels[0].forwarded else None
        usable = [level for level in levels if level.candidates or level.forwarded]
        if not usable:
            return None
        if request.conversation_id or len(usable) == 1:
            return usable[0]
        peers = {peer.region: peer for peer in self.remote.peers()} if self.remote is not None else {}
        shares = level_shares(levels, request, home=self.region, peers=peers,
                              overprovisioning_factor=self.overprovisioning_factor)
        total = sum(shares)
        if total <= 0:
            return usable[0]
        draw = self._random.random() * total
        for level, share in zip(levels, shares):
            draw -= share
            if share > 0 and draw < 0:
                return level
        return usable[-1]

    def _weighted(self, candidates: list[Candidate], cumulative: list[float] | None = None) -> Candidate:
        if len(candidates) == 1:
            return candidates[0]
        if cumulative:
            position = bisect.bisect_right(cumulative, self._random.random() * cumulative[-1])
            return candidates[min(position, len(candidates) - 1)]
        total = sum(candidate.weight for candidate in candidates)
        draw = self._random.random() * total
        for candidate in candidates:
            draw -= candidate.weight
            if draw < 0:
                return candidate
        return candidates[-1]

    def _alternates(self, target: Candidate, level: Level, levels: Iterable[Level]) -> tuple[list[Candidate], int]:
        """Up to ``MAX_ALTERNATES`` others of the target's level, drawn uniformly, then the heaviest of
        the other levels; and how many are of the target's level.

        Uniformly, because the target was drawn by weight: that makes the level's part of the ticket
        Midzuno's sample (first unit by weight, the rest uniformly), under which a per-call draw among
        its targets by weight — what the SDK does with a cached ticket — sends each agent exactly its
        weight's share over many tickets. Drawing the alternates by weight too would count weight twice.
        """
        pool = level.candidates
        if len(pool) > ALTERNATE_SAMPLING_MIN:  # large pools: positions drawn, the pool not copied
            picked = (pool[position] for position in self._random.sample(range(len(pool)), MAX_ALTERNATES + 1))
            alternates = [candidate for candidate in picked if candidate is not target][:MAX_ALTERNATES]
        else:
            rest = [candidate for candidate in pool if candidate is not target]
            alternates = self._random.sample(rest, min(MAX_ALTERNATES, len(rest)))
        same_level = len(alternates)
        for other in levels:
            if len(alternates) >= MAX_ALTERNATES:
                break
            if other is level or not other.candidates:
                continue
            alternates.append(max(other.candidates, key=lambda c: c.weight))
        return alternates, same_level

    def _ticket(self, target: Candidate, alternates: list[Candidate], match: dict[str, object],
                request: RouteRequest, caller: TokenClaims, now: int, *, drawn: int = 0) -> Decision:
        ids = os.urandom(24).hex()
        ticket_id = ids[:16]
        expires = now + self.ticket_ttl_ms
        agents = [target.record.agent_id, *(c.record.agent_id for c in alternates)]
        capabilities = [target.capability, *(c.capability for c in alternates)]
        # "k": what each target was matched by, for the credentials of the alternates (issued later)
        signature = self.signer.sign_ticket({"t": ticket_id, "a": agents, "c": caller.sub, "e": expires,
                                             "k": capabilities})
        credential = None
        if self.credentials is not None:
            credential = self.credentials.issue(caller=caller, agent_id=agents[0], capability=target.capability,
                                                ticket_id=ticket_id, index=0, expires_at_ms=expires, now_ms_=now)
        self.outcomes.issued(target.record.agent_id, now_ms=now, ticket_id=ticket_id)
        return Decision(ticket_id=ticket_id, trace_id=request.trace_id or ids[16:], target=target,
                        alternates=alternates, match=match, issued_at_ms=now, expires_at_ms=expires,
                        caller=caller.sub, signature=signature, credential=credential, drawn=drawn)

    @staticmethod
    def _exact_match(request: RouteRequest) -> dict[str, object]:
        if request.agent_id:
            return EXACT_MATCHES[MatchKind.AGENT_ID]
        if request.pattern:
            return EXACT_MATCHES[MatchKind.PATTERN]
        return EXACT_MATCHES[MatchKind.EXACT if request.capability else MatchKind.TAG]

    @staticmethod
    def _no_agent_message(request: RouteRequest) -> str:
        wanted = (request.agent_id or request.pattern or
                  (f"capability {request.capability}" if request.capability else f"tags {', '.join(request.tags)}"))
        return f"no agent available for {wanted}; see details.stages for why each stage found nobody"

    # -- semantic ----------------------------------------------------------------------------

    async def _route_semantic(self, request: RouteRequest, caller: TokenClaims, exact: NoAgentAvailable
                              ) -> Decision:
        reasons: dict[str, str] = dict(exact.details["stages"]) if exact.details else {}  # type: ignore[arg-type]
        matcher = self.matcher
        if matcher is None:
            raise exact

        def visible(region: str, agent_id: str) -> bool:
            record = self._record(region, agent_id)
            return record is not None and record.semantic_fallback and admits(caller, record, acl=self.acl)

        found = await matcher.match(request.capability or "", k=MATCHES_ASKED, allow=visible)
        hits = found.matches
        now = self.clock()
        configured = self.semantic_lexical_threshold if found.ranking == "lexical" else self.semantic_threshold
        threshold = configured if configured is not None else found.threshold
        above = [hit for hit in hits if hit.score >= threshold]
        good = [hit for hit in above if hit.agent_id != caller.sub]
        if not good:
            if above:  # the caller described itself: never route it to itself
                reasons["semantic"] = (f"the only match above the threshold {threshold:.2f} is the caller itself "
                                       f"({caller.sub} at {above[0].score:.2f}); a call never goes to the calling "
                                       "agent")
            else:
                best = f"; best {hits[0].agent_id} at {hits[0].score:.2f}" if hits else ""
                reasons["semantic"] = f"no match above the threshold {threshold:.2f} ({found.ranking} ranking{best})"
            raise NoAgentAvailable(self._no_agent_message(request), details={"stages": reasons})
        levels = semantic_levels(good, self._sources(request), request=request, caller=caller,
                                 tables=self._tables, now_ms=now, acl=self.acl)
        choice = choose(good, levels, max_alternates=MAX_ALTERNATES)
        if choice is None:
            reasons["semantic"] = f"{len(good)} matched above the threshold, none routable"
            raise NoAgentAvailable(self._no_agent_message(request), details={"stages": reasons})
        return self._ticket(choice.target, choice.alternates, choice.match, request, caller, now)

    def _record(self, region: str, agent_id: str) -> AgentRecord | None:
        if region == self.region:
            return self.cache.index.get(agent_id)
        for peer in self.remote.peers() if self.remote is not None else ():
            if peer.region == region:
                return peer.index.get(agent_id)
        return None


def _rendezvous(candidates: list[Candidate], key: str) -> Candidate:
    """Weighted highest-random-weight: stable per key while the candidate set holds."""
    best, best_score = candidates[0], -math.inf
    for candidate in candidates:
        digest = hashlib.blake2b(f"{key}\x00{candidate.record.agent_id}".encode(), digest_size=8).digest()
        unit = (int.from_bytes(digest, "big") + 1) / (2**64 + 2)
        score = candidate.record.weight / -math.log(unit) if candidate.record.weight > 0 else -math.inf
        if score > best_score:
            best, best_score = candidate, score
    return best
