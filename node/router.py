"""Routing decisions: which agent should this caller talk to right now.

Candidates come in priority levels: the caller's preferred region (if any), the local region,
then fresh peer regions nearest first, and last the stale peers (used only when nothing fresher
can serve). Like Envoy's priority levels, each level takes traffic in proportion to its healthy
share times the overprovisioning factor (1.4), and the shortfall spills to the next level, so a
region that lost part of its capacity sheds only the part it cannot carry.

Within a level, an agent's effective weight is its registered weight × a status factor
(degraded/busy lower it) × a load factor (from heartbeats) × an error factor (from outcome
reports); the choice is weighted-random. A conversation_id pins the choice with weighted
rendezvous hashing while the pinned agent stays a candidate. Routing reads only memory; the
semantic fallback (an attached :class:`Matcher`) is the only await.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import os
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

import orjson

from .cache import AgentIndex, RegionCache
from .errors import NoAgentAvailable
from .models import (
    AgentRecord,
    Capability,
    Locality,
    MatchKind,
    RouteRequest,
    RouteTicket,
    Scope,
    Status,
    TokenClaims,
    compile_pattern,
    version_constraint,
)
from .outcomes import ERROR_RECHECK_MS, OutcomeTracker
from .remote import PeerView, RemoteCatalog  # noqa: F401 (re-exported: they were defined here)
from .security import Signer, may_see
from .store import now_ms

DEFAULT_TICKET_TTL_MS = 10_000
DEFAULT_OVERPROVISIONING_FACTOR = 1.4
MAX_ALTERNATES = 2
STATUS_FACTORS = {Status.READY: 1.0, Status.DEGRADED: 0.5, Status.BUSY: 0.2}
DEFAULT_CAPACITY = 10
MAX_TABLES = 4_096
WEIGHT_FACTORS = frozenset({"weight", "status", "load", "errors"})
DEFAULT_MAX_EJECTION_FRACTION = 0.5
MAX_TIME_MS = 2**62
ALTERNATE_SAMPLING_MIN = 8
EXACT_MATCHES: dict[MatchKind, dict[str, object]] = {
    kind: {"kind": kind.value, "capability": None, "version": None, "score": 1.0}
    for kind in (MatchKind.EXACT, MatchKind.PATTERN, MatchKind.AGENT_ID)}


@dataclass(frozen=True, slots=True)
class SemanticMatch:
    agent_id: str
    region: str
    capability: str | None
    score: float


class Matcher(Protocol):
    """Natural-language capability matching (attached by the composition root)."""

    @property
    def suggested_threshold(self) -> float:
        """The score a match needs to be trusted, for the matcher's current mode."""
        ...

    async def match(self, text: str, *, k: int, allow: Callable[[str, str], bool] | None = None
                    ) -> list[SemanticMatch]: ...


@dataclass(slots=True, eq=False)
class Candidate:
    """One routable agent with its effective weight and its ticket target (as plain data)."""

    record: AgentRecord
    weight: float
    target: dict[str, object]
    capability: str | None = None
    version: str | None = None

    @property
    def agent_id(self) -> str:
        return self.record.agent_id


@dataclass(slots=True)
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

    def as_dict(self) -> dict[str, object]:
        return {
            "ticket_id": self.ticket_id, "trace_id": self.trace_id, "target": self.target.target,
            "alternates": [candidate.target for candidate in self.alternates], "match": self.match,
            "locality": self.target.target["locality"], "issued_at_ms": self.issued_at_ms,
            "expires_at_ms": self.expires_at_ms, "caller": self.caller, "signature": self.signature,
        }

    def to_json(self) -> bytes:
        """The ticket as JSON, without building pydantic models (the resolve hot path)."""
        return orjson.dumps(self.as_dict())

    def ticket(self) -> RouteTicket:
        return RouteTicket.model_validate(self.as_dict())


@dataclass(slots=True)
class Table:
    """The routable agents of one (region, selector), derived from an index and kept until stale.

    Rebuilt when the index changes for that capability, when outcome state moves, when the
    earliest lease in it may have passed, or when ``valid_until_ms`` (a breaker cool-down, a
    decaying error penalty) comes — so the hot path is a lookup and a bisect, not a scan.
    """

    candidates: list[Candidate]
    cumulative: list[float]
    registered_weight: float
    matched: int
    rejected: dict[str, int]
    has_acl: bool
    index_generation: int
    outcome_generation: int
    preserving: bool
    min_lease_ms: int
    valid_until_ms: int


@dataclass(slots=True)
class Level:
    """Candidates of one priority level (a region), after the request's own filters."""

    name: str
    candidates: list[Candidate]
    registered_weight: float
    stale: bool = False
    cumulative: list[float] | None = None

    @property
    def healthy_weight(self) -> float:
        if self.cumulative:
            return self.cumulative[-1]
        return sum(candidate.weight for candidate in self.candidates)


class Router:
    """Turns a :class:`RouteRequest` into a signed :class:`RouteTicket`."""

    def __init__(self, cache: RegionCache, signer: Signer, outcomes: OutcomeTracker, *,
                 ticket_ttl_ms: int = DEFAULT_TICKET_TTL_MS,
                 overprovisioning_factor: float = DEFAULT_OVERPROVISIONING_FACTOR,
                 semantic_threshold: float | None = None,
                 factors: frozenset[str] = WEIGHT_FACTORS,
                 max_ejection_fraction: float = DEFAULT_MAX_EJECTION_FRACTION,
                 rng: random.Random | None = None) -> None:
        if ticket_ttl_ms <= 0 or overprovisioning_factor < 1.0:
            raise ValueError("ticket_ttl_ms must be positive and overprovisioning_factor at least 1.0")
        if not factors <= WEIGHT_FACTORS:
            raise ValueError(f"unknown weight factors {sorted(factors - WEIGHT_FACTORS)}; use {sorted(WEIGHT_FACTORS)}")
        # Which parts of the effective weight apply; all of them in production, subsets in
        # bench/routing.py to show that the blend beats each part alone.
        self.factors = factors
        self._use_errors = "errors" in factors
        if not 0.0 <= max_ejection_fraction <= 1.0:
            raise ValueError("max_ejection_fraction must be within [0, 1]")
        self.max_ejection_fraction = max_ejection_fraction
        self.cache = cache
        self.region = cache.store.region
        self.signer = signer
        self.outcomes = outcomes
        self.ticket_ttl_ms = ticket_ttl_ms
        self.overprovisioning_factor = overprovisioning_factor
        self.semantic_threshold = semantic_threshold
        self.remote: RemoteCatalog | None = None
        self.matcher: Matcher | None = None
        self._random = rng or random.Random()
        self._tables: OrderedDict[tuple[object, ...], Table] = OrderedDict()

    # -- public ------------------------------------------------------------------------------

    async def resolve(self, request: RouteRequest, caller: TokenClaims) -> RouteTicket:
        """A ticket, trying the semantic fallback when the exact stages find nobody.

        Raises :class:`NoAgentAvailable` with the reason of every stage.
        """
        return (await self.decide(request, caller)).ticket()

    async def decide(self, request: RouteRequest, caller: TokenClaims) -> Decision:
        """Like :meth:`resolve`, as a :class:`Decision`."""
        try:
            return self.decide_exact(request, caller)
        except NoAgentAvailable as exc:
            if not (request.capability and request.semantic and self.matcher is not None):
                raise
            return await self._route_semantic(request, caller, exc)

    def route(self, request: RouteRequest, caller: TokenClaims) -> RouteTicket:
        """The exact stages only (memory only, no await)."""
        return self.decide_exact(request, caller).ticket()

    def decide_exact(self, request: RouteRequest, caller: TokenClaims) -> Decision:
        now = now_ms()
        reasons: dict[str, str] = {}
        levels = self._levels(request, caller, now, reasons)
        return self._decide(levels, request, caller, now, reasons, self._exact_match(request))

    # -- candidates --------------------------------------------------------------------------

    def _levels(self, request: RouteRequest, caller: TokenClaims, now: int, reasons: dict[str, str]) -> list[Level]:
        horizon = self.cache.routable_now_ms()
        levels = [self._level(self.region, self.cache.index, request, caller, now, horizon, Locality.LOCAL,
                              stale=False, reasons=reasons)]
        stale_levels: list[Level] = []
        if request.scope is not Scope.LOCAL and self.remote is not None:
            for peer in self.remote.peers():
                stale = peer.stale
                level = self._level(peer.region, peer.index, request, caller, now, None, Locality.REMOTE,
                                    stale=stale, reasons=reasons)
                (stale_levels if stale else levels).append(level)
        elif request.scope is Scope.LOCAL:
            reasons["remote"] = "scope=local"
        if request.preferred_region:
            levels.sort(key=lambda level: level.name != request.preferred_region)
        if request.scope is Scope.GLOBAL:
            levels = [Level("global", [c for level in levels for c in level.candidates],
                            sum(level.registered_weight for level in levels))]
        return levels + stale_levels

    def _level(self, region: str, index: AgentIndex, request: RouteRequest, caller: TokenClaims, now: int,
               horizon: int | None, locality: Locality, *, stale: bool, reasons: dict[str, str]) -> Level:
        if request.capability and not request.pattern and not request.agent_id:
            table = self._table(region, index, request, now, horizon, locality, stale)
        else:
            matched = self._matching(index, request)
            table = self._build(matched, request, now, horizon, locality, stale, index_generation=-1)
        candidates = table.candidates
        cumulative: list[float] | None = table.cumulative
        if table.has_acl or request.exclude:
            excluded = set(request.exclude)
            visible = [c for c in candidates if _caller_allowed(c.record, caller)] if table.has_acl else candidates
            candidates = [c for c in visible if c.record.agent_id not in excluded]
            cumulative = None
            if len(candidates) < len(table.candidates):
                # Agents the caller may not see are not counted as matched: the reasons must not
                # reveal that they exist.
                rejected = dict(table.rejected)
                if len(candidates) < len(visible):
                    rejected["excluded"] = len(visible) - len(candidates)
                table = replace(table, rejected=rejected, matched=table.matched - (len(table.candidates) - len(visible)))
        if not candidates:
            label = "local" if locality is Locality.LOCAL else f"region {region}{' (stale)' if stale else ''}"
            reasons[label] = self._why_empty(request, table)
        return Level(region, candidates, table.registered_weight, stale, cumulative)

    def _table(self, region: str, index: AgentIndex, request: RouteRequest, now: int, horizon: int | None,
               locality: Locality, stale: bool) -> Table:
        name = request.capability or ""
        key = (region, name, request.version, tuple(sorted(request.labels.items())) if request.labels else (), stale)
        generation = index.capability_generation.get(name, 0)
        table = self._tables.get(key)
        if (table is not None and table.index_generation == generation
                and table.outcome_generation == self.outcomes.generation
                and table.preserving == self.cache.preserving and now < table.valid_until_ms
                and (horizon is None or horizon < table.min_lease_ms)):
            return table
        matched = [(record, _capability(record, name)) for record in index.with_capability(name).values()]
        table = self._build(matched, request, now, horizon, locality, stale, index_generation=generation)
        self._tables[key] = table
        self._tables.move_to_end(key)
        if len(self._tables) > MAX_TABLES:
            self._tables.popitem(last=False)
        return table

    def _build(self, matched: list[tuple[AgentRecord, Capability | None]], request: RouteRequest, now: int,
               horizon: int | None, locality: Locality, stale: bool, *, index_generation: int) -> Table:
        constraint = version_constraint(request.version) if request.version else None
        outcome_generation = self.outcomes.generation
        candidates: list[Candidate] = []
        cumulative: list[float] = []
        rejected: dict[str, int] = {}
        registered = 0.0
        running = 0.0
        has_acl = False
        min_lease = MAX_TIME_MS
        valid_until = MAX_TIME_MS
        ejected: list[tuple[AgentRecord, Capability | None]] = []
        admitted: list[tuple[AgentRecord, Capability | None]] = []
        for record, capability in matched:
            if constraint is not None and capability is not None and not constraint.accepts(capability.parsed_version):
                rejected["incompatible_version"] = rejected.get("incompatible_version", 0) + 1
                continue
            if request.labels and any(record.labels.get(k) != v for k, v in request.labels.items()):
                rejected["labels"] = rejected.get("labels", 0) + 1
                continue
            registered += record.weight
            changes_at = self.outcomes.next_change_ms(record.agent_id)
            if changes_at is not None:
                valid_until = min(valid_until, changes_at)
            problem = self._unroutable(record, now, horizon)
            if problem == "circuit_open":
                ejected.append((record, capability))
                continue
            if problem is not None:
                rejected[problem] = rejected.get(problem, 0) + 1
                continue
            admitted.append((record, capability))
        # Like Envoy's max_ejection_percent: breakers may take out at most this share of a pool
        # of otherwise routable agents; beyond it, overload (not agent faults) is the likelier cause
        # and ejecting more would only pile the traffic onto the rest. The least-failing return.
        allowed = int(self.max_ejection_fraction * (len(admitted) + len(ejected)))
        if len(ejected) > allowed and not request.agent_id:  # one named agent is no pool
            ejected.sort(key=lambda pair: -self.outcomes.weight_factor(pair[0].agent_id, now_ms=now))
            admitted += ejected[:len(ejected) - allowed]
            ejected = ejected[len(ejected) - allowed:]
        if ejected:
            rejected["circuit_open"] = len(ejected)
        for record, capability in admitted:
            factor = self.outcomes.weight_factor(record.agent_id, now_ms=now) if self._use_errors else 1.0
            if factor < 1.0:
                valid_until = min(valid_until, now + ERROR_RECHECK_MS)
            weight = self._effective_weight(record) * factor
            if weight <= 0:
                rejected["zero_weight"] = rejected.get("zero_weight", 0) + 1
                continue
            has_acl = has_acl or bool(record.allowed_callers)
            if horizon is not None:
                min_lease = min(min_lease, record.lease_expires_at_ms)
            running += weight
            cumulative.append(running)
            candidates.append(Candidate(record, weight, _target(record, locality, stale),
                                        capability.name if capability else None,
                                        capability.version if capability else None))
        return Table(candidates, cumulative, registered, len(matched), rejected, has_acl, index_generation,
                     outcome_generation, self.cache.preserving, min_lease, valid_until)

    def _matching(self, index: AgentIndex, request: RouteRequest) -> list[tuple[AgentRecord, Capability | None]]:
        if request.agent_id:
            record = index.get(request.agent_id)
            if record is None:
                return []
            return [(record, _capability(record, request.capability) if request.capability else None)]
        regex = compile_pattern(request.pattern or "*.*.*")
        found: list[tuple[AgentRecord, Capability | None]] = [
            (record, None) for record in index if regex.match(record.agent_id)]
        if request.capability:
            found = [(r, c) for r, _ in found if (c := _capability(r, request.capability)) is not None]
        return found

    @staticmethod
    def _why_empty(request: RouteRequest, table: Table) -> str:
        if table.matched == 0:
            if request.agent_id:
                return f"no agent {request.agent_id}"
            if request.pattern:
                with_capability = f" with capability {request.capability}" if request.capability else ""
                return f"no agent matches {request.pattern}{with_capability}"
            return f"no agent has capability {request.capability!r}"
        detail = ", ".join(f"{count} {reason}" for reason, count in sorted(table.rejected.items()))
        return f"{table.matched} matched, none routable ({detail})"

    def _unroutable(self, record: AgentRecord, now: int, horizon: int | None) -> str | None:
        if horizon is not None and record.lease_expires_at_ms <= horizon:
            return "lease_expired"
        if not record.live:
            return "not_live"
        if not record.ready:
            return "not_ready"
        if record.status not in STATUS_FACTORS:
            return record.status.value
        if not self.outcomes.admits(record.agent_id, now_ms=now):
            return "circuit_open"
        return None

    def _effective_weight(self, record: AgentRecord) -> float:
        """Weight × status factor × load factor (the error factor is applied by the caller)."""
        weight = float(record.weight) if "weight" in self.factors else 1.0
        if "status" in self.factors:
            weight *= STATUS_FACTORS[record.status]
        if "load" in self.factors:
            capacity = record.max_concurrency or DEFAULT_CAPACITY
            weight /= 1.0 + (record.load.inflight + record.load.queued) / capacity
        return weight

    # -- decision ----------------------------------------------------------------------------

    def _decide(self, levels: list[Level], request: RouteRequest, caller: TokenClaims, now: int,
                reasons: dict[str, str], match: dict[str, object]) -> Decision:
        fresh = [level for level in levels if not level.stale]
        stale = [level for level in levels if level.stale]
        chosen_level = self._pick_level(fresh, request) or self._pick_level(stale, request)
        if chosen_level is None:
            raise NoAgentAvailable(self._no_agent_message(request), details={"stages": reasons})
        if request.conversation_id:
            target = _rendezvous(chosen_level.candidates, request.conversation_id)
        else:
            target = self._weighted(chosen_level.candidates, chosen_level.cumulative)
        alternates = self._alternates(target, chosen_level, levels)
        if target.capability is not None:
            match = {**match, "capability": target.capability, "version": target.version}
        return self._ticket(target, alternates, match, request, caller, now)

    def _pick_level(self, levels: list[Level], request: RouteRequest) -> Level | None:
        usable = [level for level in levels if level.candidates]
        if not usable:
            return None
        if request.conversation_id or len(usable) == 1:
            return usable[0]
        shares = []
        remaining = 1.0
        for level in levels:
            health = 0.0
            if level.candidates and level.registered_weight > 0:
                health = min(1.0, self.overprovisioning_factor * level.healthy_weight / level.registered_weight)
            share = min(remaining, health)
            shares.append(share)
            remaining -= share
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

    def _alternates(self, target: Candidate, level: Level, levels: Iterable[Level]) -> list[Candidate]:
        alternates: list[Candidate] = []
        pool = level.candidates
        if len(pool) > ALTERNATE_SAMPLING_MIN and level.cumulative:
            # Large pools: weighted draws with rejection instead of copying the pool.
            for _ in range(MAX_ALTERNATES * 4):
                pick = self._weighted(pool, level.cumulative)
                if pick is not target and pick not in alternates:
                    alternates.append(pick)
                    if len(alternates) == MAX_ALTERNATES:
                        break
        if len(alternates) < MAX_ALTERNATES:
            rest = [c for c in pool if c is not target and c not in alternates]
            while rest and len(alternates) < MAX_ALTERNATES:
                pick = self._weighted(rest)
                alternates.append(pick)
                rest = [c for c in rest if c is not pick]
        for other in levels:
            if len(alternates) >= MAX_ALTERNATES:
                break
            if other is level or not other.candidates:
                continue
            alternates.append(max(other.candidates, key=lambda c: c.weight))
        return alternates

    def _ticket(self, target: Candidate, alternates: list[Candidate], match: dict[str, object],
                request: RouteRequest, caller: TokenClaims, now: int) -> Decision:
        ids = os.urandom(24).hex()
        ticket_id = ids[:16]
        trace_id = request.trace_id or ids[16:]
        expires = now + self.ticket_ttl_ms
        agents = [target.record.agent_id, *(c.record.agent_id for c in alternates)]
        signature = self.signer.sign_ticket({"t": ticket_id, "a": agents, "c": caller.sub, "e": expires})
        self.outcomes.issued(target.record.agent_id, now_ms=now)
        return Decision(ticket_id, trace_id, target, alternates, match, now, expires, caller.sub, signature)

    @staticmethod
    def _exact_match(request: RouteRequest) -> dict[str, object]:
        if request.agent_id:
            return EXACT_MATCHES[MatchKind.AGENT_ID]
        if request.pattern:
            return EXACT_MATCHES[MatchKind.PATTERN]
        return EXACT_MATCHES[MatchKind.EXACT]

    @staticmethod
    def _no_agent_message(request: RouteRequest) -> str:
        wanted = request.agent_id or request.pattern or f"capability {request.capability}"
        return f"no agent available for {wanted}; see details.stages for why each stage found nobody"

    # -- semantic ----------------------------------------------------------------------------

    async def _route_semantic(self, request: RouteRequest, caller: TokenClaims, exact: NoAgentAvailable
                              ) -> Decision:
        reasons: dict[str, str] = dict(exact.details["stages"]) if exact.details else {}  # type: ignore[arg-type]
        def visible(region: str, agent_id: str) -> bool:
            record = self._record(region, agent_id)
            return record is not None and _caller_allowed(record, caller)

        hits = await self.matcher.match(request.capability or "", k=10, allow=visible)  # type: ignore[union-attr]
        now = now_ms()
        threshold = self.semantic_threshold
        if threshold is None:
            threshold = self.matcher.suggested_threshold  # type: ignore[union-attr]
        good = [hit for hit in hits if hit.score >= threshold]
        if not good:
            best = f" (best {hits[0].agent_id} at {hits[0].score:.2f})" if hits else ""
            reasons["semantic"] = f"no match above the threshold {threshold:.2f}{best}"
            raise NoAgentAvailable(self._no_agent_message(request), details={"stages": reasons})
        levels = self._semantic_levels(good, request, caller, now)
        if not any(level.candidates for level in levels):
            reasons["semantic"] = f"{len(good)} matched above the threshold, none routable"
            raise NoAgentAvailable(self._no_agent_message(request), details={"stages": reasons})
        # Semantic matches are ranked: take the best-scoring routable agent, not a weighted draw.
        scores = {(hit.region, hit.agent_id): hit for hit in good}
        level = next(level for level in levels if level.candidates)
        target = max(level.candidates, key=lambda c: scores[(c.record.region, c.record.agent_id)].score)
        hit = scores[(target.record.region, target.record.agent_id)]
        alternates = sorted((c for lv in levels for c in lv.candidates if c is not target),
                            key=lambda c: -scores[(c.record.region, c.record.agent_id)].score)[:MAX_ALTERNATES]
        match = {"kind": MatchKind.SEMANTIC.value, "capability": hit.capability, "score": round(hit.score, 4),
                 "version": _version_of(target.record, hit.capability)}
        return self._ticket(target, alternates, match, request, caller, now)

    def _record(self, region: str, agent_id: str) -> AgentRecord | None:
        if region == self.region:
            return self.cache.index.get(agent_id)
        for peer in self.remote.peers() if self.remote is not None else ():
            if peer.region == region:
                return peer.index.get(agent_id)
        return None

    def _semantic_levels(self, hits: list[SemanticMatch], request: RouteRequest, caller: TokenClaims,
                         now: int) -> list[Level]:
        by_region: dict[str, list[SemanticMatch]] = {}
        for hit in hits:
            by_region.setdefault(hit.region, []).append(hit)
        sources: list[tuple[str, AgentIndex, Locality, bool]] = [(self.region, self.cache.index, Locality.LOCAL, False)]
        if request.scope is not Scope.LOCAL and self.remote is not None:
            sources += [(peer.region, peer.index, Locality.REMOTE, peer.stale) for peer in self.remote.peers()]
        horizon = self.cache.routable_now_ms()
        excluded = set(request.exclude)
        levels = []
        for region, index, locality, stale in sources:
            candidates = []
            for hit in by_region.get(region, []):
                record = index.get(hit.agent_id)
                if record is None or record.agent_id in excluded or not _caller_allowed(record, caller):
                    continue
                if self._unroutable(record, now, horizon if locality is Locality.LOCAL else None):
                    continue
                candidates.append(Candidate(record, self._effective_weight(record), _target(record, locality, stale),
                                            hit.capability, _version_of(record, hit.capability)))
            levels.append(Level(region, candidates, 0.0, stale))
        return sorted(levels, key=lambda level: level.stale)


def _capability(record: AgentRecord, name: str) -> Capability | None:
    for capability in record.capabilities:
        if capability.name == name:
            return capability
    return None


def _version_of(record: AgentRecord, capability: str | None) -> str | None:
    found = _capability(record, capability) if capability else None
    return found.version if found else None


def _caller_allowed(record: AgentRecord, caller: TokenClaims) -> bool:
    return may_see(caller, record.agent_id, record.allowed_callers)


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


def _target(record: AgentRecord, locality: Locality, stale: bool) -> dict[str, object]:
    """A :class:`RouteTarget` as plain data (see ``Decision.to_json``)."""
    endpoint = record.endpoints["primary"]
    if locality is Locality.REMOTE:
        endpoint = record.endpoints.get("external", endpoint)
    return {"agent_id": record.agent_id, "region": record.region, "endpoint": endpoint,
            "transport": record.transport, "callback_endpoint": record.callback_endpoint,
            "locality": locality.value, "stale": stale}
