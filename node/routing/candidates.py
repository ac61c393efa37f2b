"""Who may serve a request, and how much traffic each should take: the router's candidate tables.

A :class:`Source` is one region's index as the router sees it for one request (its locality,
whether the peer is stale, the instant before which leases have certainly passed). From a
source and a request's selector, :class:`CandidateTables` derives a :class:`Table`: the routable
agents with their effective weight (registered weight × status factor × load factor × error
factor, each part switched by :class:`WeightFactor`) and the running sums a weighted draw
bisects. Tables of capability requests are kept and rebuilt only when something they were
derived from moves, so the resolve hot path is a lookup, not a scan of the pool.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from itertools import accumulate, compress
from typing import TypeVar

from ..core.models import (
    AgentRecord,
    Capability,
    Locality,
    RouteRequest,
    Status,
    TokenClaims,
    VersionConstraint,
    a2a_interface,
    compile_pattern,
    version_constraint,
)
from ..delivery import ERROR_RECHECK_MS, OutcomeTracker
from ..trust import RegionAcl, admits
from ..view import AgentIndex

__all__ = ["ALL_WEIGHT_FACTORS", "Candidate", "CandidateTables", "Level", "Source", "Table", "WeightFactor",
           "capability_of", "tagged", "version_of"]

STATUS_FACTORS = {Status.READY: 1.0, Status.DEGRADED: 0.5, Status.BUSY: 0.2}
DEFAULT_CAPACITY = 10  # the load factor's capacity for an agent without max_concurrency
DEFAULT_MAX_EJECTION_FRACTION = 0.5
MAX_TABLES = 4_096
PATCH_MIN = 16  # a table is patched for up to max(this, an eighth of its candidates) changed agents
MAX_TIME_MS = 2**62
_FEW_CHANGED = 8  # up to this many changed agents, each is searched for in the pool's ids (list.index)
T = TypeVar("T")


class WeightFactor(enum.Flag):
    """The parts of an agent's effective weight. All of them in production; subsets in
    bench/routing.py, to show that the blend beats each part alone."""

    WEIGHT = enum.auto()  # the registered weight (without it every agent weighs 1)
    STATUS = enum.auto()  # degraded ×0.5, busy ×0.2
    LOAD = enum.auto()    # ÷ (1 + (inflight + queued) / capacity), from heartbeats
    ERRORS = enum.auto()  # the decaying error penalty from outcome reports

    @classmethod
    def from_names(cls, names: Iterable[str]) -> WeightFactor:
        """``{"weight", "load"}`` → ``WEIGHT | LOAD``; raises ValueError naming what is unknown."""
        factors = cls(0)
        for name in names:
            try:
                factors |= cls[name.upper()]
            except KeyError:
                known = ", ".join(sorted(member.name.lower() for member in cls))  # type: ignore[union-attr]
                raise ValueError(f"unknown weight factor {name!r}; use {known}") from None
        return factors


ALL_WEIGHT_FACTORS = WeightFactor.WEIGHT | WeightFactor.STATUS | WeightFactor.LOAD | WeightFactor.ERRORS


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    """One region's agents as the router sees them for one request."""

    region: str
    index: AgentIndex
    locality: Locality
    # Nothing heard from the peer lately: its level serves only when no fresher one can.
    stale: bool = False
    # A lease that ended at or before this instant has passed (see RegionCache.routable_now_ms);
    # None where leases are not judged here (a peer's replica drops what its home expired).
    lease_horizon_ms: int | None = None

    @property
    def label(self) -> str:
        """The source's name in the reasons of a NoAgentAvailable."""
        if self.locality is Locality.LOCAL:
            return "local"
        return f"region {self.region}{' (stale)' if self.stale else ''}"


@dataclass(slots=True, eq=False, kw_only=True)
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


@dataclass(slots=True, kw_only=True)
class Table:
    """The routable agents of one (source, selector), derived from an index and kept until stale.

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
    # The table as a priority level, for requests with nothing to filter out (no ACL in the
    # table, nothing excluded, not the caller's own record): it shares the table's lists, and
    # every such request shares it.
    level: Level
    agent_ids: set[str] = field(default_factory=set)  # of the candidates: is the caller among them?
    # The candidates' ids and weights, in order: a patch needs no Python step per candidate.
    ids: list[str] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    # Per agent, what it added to the counts above: its reason in ``rejected`` and the weight it
    # added to ``registered_weight`` — so a change to a few agents patches the table (_patch).
    reasons: dict[str, str] = field(default_factory=dict)
    counted: dict[str, float] = field(default_factory=dict)
    ejecting: bool = False  # breakers had agents of the pool to eject (ejected or let back by the cap)


@dataclass(slots=True, kw_only=True)
class Level:
    """Candidates of one priority level (a region), after the request's own filters.

    Read-only once built: a table's unfiltered level serves many requests.
    """

    name: str
    candidates: list[Candidate]
    registered_weight: float
    stale: bool = False
    cumulative: list[float] | None = None
    # A summary-only peer (node.routing.spill): no candidates here, its node picks; registered_weight is
    # what its summary says it can serve.
    forwarded: bool = False

    @property
    def healthy_weight(self) -> float:
        if self.cumulative:
            return self.cumulative[-1]
        return sum(candidate.weight for candidate in self.candidates)


Matched = list[tuple[AgentRecord, Capability | None]]


@dataclass(slots=True)
class _Screening:
    """What the first pass over the matched records found (see CandidateTables._screen)."""

    admitted: Matched = field(default_factory=list)
    ejected: Matched = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    registered_weight: float = 0.0
    valid_until_ms: int = MAX_TIME_MS
    reasons: dict[str, str] = field(default_factory=dict)
    counted: dict[str, float] = field(default_factory=dict)
    ejecting: bool = False

    def reject(self, agent_id: str, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        self.reasons[agent_id] = reason


class CandidateTables:
    """Builds the :class:`Table` of a (source, request) and keeps those of capability requests.

    ``outcomes`` supplies the breakers and error penalties; ``max_ejection_fraction`` caps the
    share of a pool the breakers may take out.
    """

    def __init__(self, *, outcomes: OutcomeTracker, factors: WeightFactor = ALL_WEIGHT_FACTORS,
                 max_ejection_fraction: float = DEFAULT_MAX_EJECTION_FRACTION) -> None:
        if not isinstance(factors, WeightFactor):
            raise TypeError(f"factors must be a WeightFactor (e.g. WeightFactor.WEIGHT | WeightFactor.LOAD), "
                            f"not {factors!r}; WeightFactor.from_names() reads names")
        if not 0.0 <= max_ejection_fraction <= 1.0:
            raise ValueError("max_ejection_fraction must be within [0, 1]")
        self.outcomes = outcomes
        self.factors = factors
        self.max_ejection_fraction = max_ejection_fraction
        # Read per record on the hot path of a rebuild: plain booleans, not Flag arithmetic.
        self._use_weight = WeightFactor.WEIGHT in factors
        self._use_status = WeightFactor.STATUS in factors
        self._use_load = WeightFactor.LOAD in factors
        self._use_errors = WeightFactor.ERRORS in factors
        self._tables: OrderedDict[tuple[object, ...], Table] = OrderedDict()

    def table(self, source: Source, request: RouteRequest, now_ms: int, preserving: bool) -> Table:
        """The routable agents of ``source`` for the request's selector (``preserving``: the
        local cache's self-preservation, under which lease horizons mean something else).

        Tables of capability requests are kept; pattern and agent_id requests build theirs.
        """
        if not request.capability or request.pattern or request.agent_id:
            return self._build(_matching(source.index, request), source, request, now_ms=now_ms,
                               preserving=preserving, index_generation=-1)
        name = request.capability
        key = (source.region, name, request.version,
               tuple(sorted(request.labels.items())) if request.labels else (), source.stale,
               tuple(sorted({tag.casefold() for tag in request.tags})))
        generation = source.index.capability_generation.get(name, 0)
        horizon = source.lease_horizon_ms
        table = self._tables.get(key)
        if (table is not None and table.index_generation == generation
                and table.outcome_generation == self.outcomes.generation
                and table.preserving == preserving and now_ms < table.valid_until_ms
                and (horizon is None or horizon < table.min_lease_ms)):
            return table
        patched = None
        if (table is not None and table.outcome_generation == self.outcomes.generation
                and table.preserving == preserving and now_ms < table.valid_until_ms
                and (horizon is None or horizon < table.min_lease_ms)):
            patched = self._patch(table, source, request, generation, now_ms=now_ms)
        if patched is not None:
            table = patched
        else:
            matched = [(record, capability_of(record, name))
                       for record in source.index.with_capability(name).values()]
            table = self._build(matched, source, request, now_ms=now_ms, preserving=preserving,
                                index_generation=generation)
        self._tables[key] = table
        self._tables.move_to_end(key)
        if len(self._tables) > MAX_TABLES:
            self._tables.popitem(last=False)
        return table

    def _build(self, matched: Matched, source: Source, request: RouteRequest, *, now_ms: int,
               preserving: bool, index_generation: int) -> Table:
        # Read before screening: a breaker the screening moves to half-open bumps the generation,
        # so this table is rebuilt on the next request rather than kept with a stale state.
        outcome_generation = self.outcomes.generation
        constraint = version_constraint(request.version) if request.version else None
        screening = self._screen(matched, source, request, constraint, now_ms=now_ms)
        self._cap_ejections(screening, request, now_ms=now_ms)
        candidates: list[Candidate] = []
        cumulative: list[float] = []
        level = Level(name=source.region, candidates=candidates, registered_weight=screening.registered_weight,
                      stale=source.stale, cumulative=cumulative)
        table = Table(candidates=candidates, cumulative=cumulative, registered_weight=screening.registered_weight,
                      matched=len(matched), rejected=screening.rejected, has_acl=False,
                      index_generation=index_generation, outcome_generation=outcome_generation,
                      preserving=preserving, min_lease_ms=MAX_TIME_MS, valid_until_ms=screening.valid_until_ms,
                      level=level, reasons=screening.reasons, counted=screening.counted,
                      ejecting=screening.ejecting)
        self._weigh(screening.admitted, source, table, now_ms=now_ms)
        cumulative.extend(accumulate(table.weights))
        return table

    def _patch(self, table: Table, source: Source, request: RouteRequest, generation: int, *,
               now_ms: int) -> Table | None:
        """``table`` brought up to ``generation`` by re-screening only the agents that changed
        since it was built (AgentIndex.changes_since), or None when a rebuild is due instead:
        the changes are unknown or many, or breakers eject agents of the pool (the ejection cap
        weighs the whole pool)."""
        name = request.capability or ""
        changed = source.index.changes_since(name, table.index_generation)
        if changed is None or len(changed) > max(PATCH_MIN, len(table.candidates) // 8) or table.ejecting:
            return None
        records = source.index.with_capability(name)
        pairs = [(record, capability_of(record, name)) for agent_id in sorted(changed)  # an order not by hash seed
                 if (record := records.get(agent_id)) is not None]
        constraint = version_constraint(request.version) if request.version else None
        screening = self._screen(pairs, source, request, constraint, now_ms=now_ms)
        if screening.ejected:
            return None
        rejected = dict(table.rejected)  # copies of the pool's maps (C-level), then a step per changed agent
        reasons = table.reasons.copy()
        counted = table.counted.copy()
        registered = table.registered_weight
        for agent_id in changed:
            reason = reasons.pop(agent_id, None)
            if reason is not None:
                rejected[reason] -= 1
                if not rejected[reason]:
                    del rejected[reason]
            registered -= counted.pop(agent_id, 0.0)  # whole numbers: the sum stays exact
        for reason, count in screening.rejected.items():
            rejected[reason] = rejected.get(reason, 0) + count
        reasons.update(screening.reasons)
        counted.update(screening.counted)
        registered += sum(screening.counted.values())
        gone = _places(table.ids, changed & table.agent_ids)
        candidates = _without(table.candidates, gone)
        cumulative: list[float] = []
        patched = replace(table, candidates=candidates, cumulative=cumulative, registered_weight=registered,
                          matched=len(records), rejected=rejected, index_generation=generation,
                          valid_until_ms=min(table.valid_until_ms, screening.valid_until_ms),
                          agent_ids=table.agent_ids - changed, reasons=reasons, counted=counted,
                          ids=_without(table.ids, gone), weights=_without(table.weights, gone),
                          level=Level(name=source.region, candidates=candidates, registered_weight=registered,
                                      stale=source.stale, cumulative=cumulative))
        self._weigh(screening.admitted, source, patched, now_ms=now_ms)
        cumulative.extend(accumulate(patched.weights))
        return patched

    def _screen(self, matched: Matched, source: Source, request: RouteRequest,
                constraint: VersionConstraint | None, *, now_ms: int) -> _Screening:
        """Drop what version, labels and tags exclude; sort the rest: routable, ejected, rejected (by reason)."""
        screening, suspects, horizon = _Screening(), source.index.suspects, source.lease_horizon_ms
        for record, capability in matched:
            if constraint is not None and capability is not None and not constraint.accepts(capability.parsed_version):
                screening.reject(record.agent_id, "incompatible_version")
                continue
            if request.labels and any(record.labels.get(k) != v for k, v in request.labels.items()):
                screening.reject(record.agent_id, "labels")
                continue
            if request.tags:
                capability = tagged(record, capability, request.tags)
                if capability is None:
                    screening.reject(record.agent_id, "tags")
                    continue
            screening.registered_weight += record.weight
            screening.counted[record.agent_id] = float(record.weight)
            changes_at = self.outcomes.next_change_ms(record.agent_id)
            if changes_at is not None:
                screening.valid_until_ms = min(screening.valid_until_ms, changes_at)
            problem = "suspect" if record.agent_id in suspects else self.unroutable(record, now_ms=now_ms,
                                                                                      lease_horizon_ms=horizon)
            if problem == "circuit_open":
                screening.ejected.append((record, capability))
            elif problem is not None:
                screening.reject(record.agent_id, problem)
            else:
                screening.admitted.append((record, capability))
        return screening

    def _cap_ejections(self, screening: _Screening, request: RouteRequest, *, now_ms: int) -> None:
        # Like Envoy's max_ejection_percent: breakers may take out at most this share of a pool
        # of otherwise routable agents; beyond it, overload (not agent faults) is the likelier cause
        # and ejecting more would only pile the traffic onto the rest. The least-failing return.
        ejected = screening.ejected
        screening.ejecting = bool(ejected)
        allowed = int(self.max_ejection_fraction * (len(screening.admitted) + len(ejected)))
        if len(ejected) > allowed and not request.agent_id:  # one named agent is no pool
            ejected.sort(key=lambda pair: -self.outcomes.weight_factor(pair[0].agent_id, now_ms=now_ms))
            screening.admitted += ejected[:len(ejected) - allowed]
            screening.ejected = ejected = ejected[len(ejected) - allowed:]
        if ejected:
            screening.rejected["circuit_open"] = len(ejected)
            screening.reasons.update((record.agent_id, "circuit_open") for record, _ in ejected)

    def _weigh(self, admitted: Matched, source: Source, table: Table, *, now_ms: int) -> None:
        """Add the admitted agents of positive effective weight to ``table``'s candidates, in order
        (the caller then sums ``cumulative``)."""
        horizon = source.lease_horizon_ms
        for record, capability in admitted:
            factor = self.outcomes.weight_factor(record.agent_id, now_ms=now_ms) if self._use_errors else 1.0
            if factor < 1.0:
                table.valid_until_ms = min(table.valid_until_ms, now_ms + ERROR_RECHECK_MS)
            # A peer's replica keeps the load of the agent's last full-record change (load stays
            # home): it is weighed by weight × status, the region as a whole by its summary.
            weight = self.weight(record, load=source.locality is Locality.LOCAL) * factor
            if weight <= 0:
                table.rejected["zero_weight"] = table.rejected.get("zero_weight", 0) + 1
                table.reasons[record.agent_id] = "zero_weight"
                continue
            table.has_acl = table.has_acl or bool(record.allowed_callers or (capability and capability.allowed_callers))
            if horizon is not None:
                table.min_lease_ms = min(table.min_lease_ms, record.lease_expires_at_ms)
            table.agent_ids.add(record.agent_id)
            table.ids.append(record.agent_id)
            table.weights.append(weight)
            table.candidates.append(Candidate(
                record=record, weight=weight, target=route_target(record, source),
                capability=capability.name if capability else None,
                version=capability.version if capability else None))

    def unroutable(self, record: AgentRecord, *, now_ms: int, lease_horizon_ms: int | None) -> str | None:
        """Why ``record`` may not be routed to now (a reason for the stages), or None."""
        if lease_horizon_ms is not None and record.lease_expires_at_ms <= lease_horizon_ms:
            return "lease_expired"
        if not record.live:
            return "not_live"
        if not record.ready:
            return "not_ready"
        if record.status not in STATUS_FACTORS:
            return record.status.value
        if not self.outcomes.admits(record.agent_id, now_ms=now_ms):
            return "circuit_open"
        return None

    def weight(self, record: AgentRecord, *, load: bool = True) -> float:
        """Weight × status factor × load factor (unless ``load`` is False), as far as they apply (the
        error factor is not here: the semantic fallback ranks by score and leaves it out)."""
        weight = float(record.weight) if self._use_weight else 1.0
        if self._use_status:
            weight *= STATUS_FACTORS[record.status]
        if self._use_load and load:
            capacity = record.max_concurrency or DEFAULT_CAPACITY
            weight /= 1.0 + (record.load.inflight + record.load.queued) / capacity
        return weight


def _places(ids: list[str], wanted: set[str]) -> list[int]:
    """Where ``wanted`` are in ``ids``, ascending (C-level: a search each for a few, else one pass)."""
    if len(wanted) <= _FEW_CHANGED:
        return sorted(ids.index(agent_id) for agent_id in wanted)
    return list(compress(range(len(ids)), map(wanted.__contains__, ids)))


def _without(items: list[T], places: list[int]) -> list[T]:
    """A copy of ``items`` without the ascending ``places`` (each deletion a C-level move)."""
    kept = items.copy()
    for place in reversed(places):
        del kept[place]
    return kept


def _matching(index: AgentIndex, request: RouteRequest) -> Matched:
    """The records a pattern or agent_id request names (with its capability, if it asks one)."""
    if request.agent_id:
        record = index.get(request.agent_id)
        if record is None:
            return []
        return [(record, capability_of(record, request.capability) if request.capability else None)]
    regex = compile_pattern(request.pattern or "*.*.*")
    found: Matched = [(record, None) for record in index if regex.match(record.agent_id)]
    if request.capability:
        found = [(r, c) for r, _ in found if (c := capability_of(r, request.capability)) is not None]
    return found


def capability_of(record: AgentRecord, name: str) -> Capability | None:
    for capability in record.capabilities:
        if capability.name == name:
            return capability
    return None


def tagged(record: AgentRecord, capability: Capability | None, tags: Iterable[str]) -> Capability | None:
    """``capability`` if it carries every tag (case-insensitively), or without one the record's first
    capability that does; None when none does."""
    wanted = {tag.casefold() for tag in tags}
    for candidate in [capability] if capability is not None else record.capabilities:
        if wanted <= {tag.casefold() for tag in candidate.tags}:
            return candidate
    return None


def version_of(record: AgentRecord, capability: str | None) -> str | None:
    found = capability_of(record, capability) if capability else None
    return found.version if found else None


def as_seen_by(table: Table, index: AgentIndex, caller: TokenClaims, acl: RegionAcl | None = None) -> Table:
    """``table``'s counts without the agents it rejected that ``caller`` may not see: a refusal's
    reasons ("1 matched, none routable (1 draining)") must not tell that they exist. Read on the
    way to a refusal only (a walk of the rejected agents)."""
    hidden: dict[str, int] = {}
    for agent_id, reason in table.reasons.items():
        record = index.get(agent_id)
        if record is not None and not admits(caller, record, acl=acl):
            hidden[reason] = hidden.get(reason, 0) + 1
    if not hidden:
        return table
    rejected = {reason: count - hidden.get(reason, 0) for reason, count in table.rejected.items()}
    return replace(table, matched=table.matched - sum(hidden.values()),
                   rejected={reason: count for reason, count in rejected.items() if count > 0})


def route_target(record: AgentRecord, source: Source) -> dict[str, object]:
    """A :class:`RouteTarget` as plain data (see ``Decision.to_json``)."""
    endpoint = record.endpoints["primary"]
    if source.locality is Locality.REMOTE:
        endpoint = record.endpoints.get("external", endpoint)
    binding, protocol_version = a2a_interface(record.a2a, record.transport, record.labels)
    return {"agent_id": record.agent_id, "region": record.region, "endpoint": endpoint,
            "transport": record.transport, "binding": binding, "protocol_version": protocol_version,
            "callback_endpoint": record.callback_endpoint,
            "locality": source.locality.value, "stale": source.stale}
