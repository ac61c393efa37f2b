"""The router's semantic fallback: when no agent has the capability asked for by name, the
attached :class:`Matcher` reads the request's capability as natural language.

Matches are ranked, not drawn: the best-scoring routable agent is the target (a fresher region
before a stale one), the next best are the alternates. A match counts only above the
threshold the matcher gives with its matches (calibrated for the ranking that scored them: a
mostly-Chinese request is ranked by its words, on another scale than a hybrid score) or the
node's ``semantic_threshold`` (hybrid) or ``semantic_lexical_threshold`` (lexical), so "close
enough" never means "anything at all". Never the caller itself, never an agent registered with
``semantic_fallback: false``. The router owns the await and the reasons; this module turns scored
hits into candidates and a choice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..core.models import Locality, MatchKind, RouteRequest, TokenClaims
from ..trust import RegionAcl, admits
from .candidates import Candidate, CandidateTables, Level, Source, route_target, version_of

__all__ = ["Matcher", "SemanticChoice", "SemanticMatch", "SemanticMatches", "choose", "semantic_levels"]

MATCHES_ASKED = 10  # the k of Matcher.match: enough to find a routable one behind a few that are not


@dataclass(frozen=True, slots=True)
class SemanticMatch:
    agent_id: str
    region: str
    capability: str | None
    score: float


@dataclass(frozen=True, slots=True)
class SemanticMatches:
    """Scored matches, best first, and the score one needs to be trusted: calibrated for the
    ranking that scored them (``ranking``, e.g. "hybrid" or "lexical")."""

    matches: list[SemanticMatch]
    threshold: float
    ranking: str


class Matcher(Protocol):
    """Natural-language capability matching (attached by the composition root)."""

    async def match(self, text: str, *, k: int, allow: Callable[[str, str], bool] | None = None
                    ) -> SemanticMatches:
        """Up to ``k`` matches among the agents ``allow(region, agent_id)`` admits, with their threshold."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class SemanticChoice:
    """The best routable match, the next best as alternates, and the ticket's ``match`` field."""

    target: Candidate
    alternates: list[Candidate]
    match: dict[str, object]


def semantic_levels(hits: Sequence[SemanticMatch], sources: Sequence[Source], *, request: RouteRequest,
                    caller: TokenClaims, tables: CandidateTables, now_ms: int,
                    acl: RegionAcl | None = None) -> list[Level]:
    """One level per source with its routable hits (fresh sources first), weighted but unfiltered
    by the error factor: the score orders them, not the weight."""
    by_region: dict[str, list[SemanticMatch]] = {}
    for hit in hits:
        by_region.setdefault(hit.region, []).append(hit)
    excluded = set(request.exclude)
    levels = []
    for source in sources:
        candidates = []
        # Remote leases are the peer replica's business (it drops what its home expired).
        horizon = source.lease_horizon_ms if source.locality is Locality.LOCAL else None
        for hit in by_region.get(source.region, []):
            record = source.index.get(hit.agent_id)
            if (record is None or record.agent_id in excluded or record.agent_id == caller.sub
                    or not record.semantic_fallback
                    or not admits(caller, record, capability=hit.capability, acl=acl)):
                continue
            if record.agent_id in source.index.suspects or tables.unroutable(record, now_ms=now_ms,
                                                                             lease_horizon_ms=horizon):
                continue
            candidates.append(Candidate(record=record, weight=tables.weight(record),
                                        target=route_target(record, source), capability=hit.capability,
                                        version=version_of(record, hit.capability)))
        levels.append(Level(name=source.region, candidates=candidates, registered_weight=0.0, stale=source.stale))
    return sorted(levels, key=lambda level: level.stale)


def choose(hits: Sequence[SemanticMatch], levels: Sequence[Level], *, max_alternates: int) -> SemanticChoice | None:
    """The best-scoring candidate of the first level that has one (None: no level has any)."""
    level = next((level for level in levels if level.candidates), None)
    if level is None:
        return None
    scores = {(hit.region, hit.agent_id): hit for hit in hits}

    def score(candidate: Candidate) -> float:
        return scores[(candidate.record.region, candidate.record.agent_id)].score

    target = max(level.candidates, key=score)
    hit = scores[(target.record.region, target.record.agent_id)]
    alternates = sorted((c for lv in levels for c in lv.candidates if c is not target),
                        key=lambda c: -score(c))[:max_alternates]
    match = {"kind": MatchKind.SEMANTIC.value, "capability": hit.capability, "score": round(hit.score, 4),
             "version": version_of(target.record, hit.capability)}
    return SemanticChoice(target=target, alternates=alternates, match=match)
