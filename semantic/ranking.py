"""Ranking: how an owner's score is formed from its documents' cosines and BM25 coverages.

One owner (agent) is scored from three kinds of vectors and two lexical indexes, all held by
:class:`~semantic.holdings.Holdings` for :class:`~semantic.search.SemanticSearch`:

* the agent level — a vector (the normalised mean of its description's, capabilities' and
  example requests' vectors) and a BM25 entry of every field of the agent, keyed by owner id;
* each capability document — a vector and a BM25 entry, keyed by doc id;
* each example request of a capability — a vector of its own, keyed by example key. Examples
  are written the way people ask ("add this taxi receipt to my expenses"), so a query close to
  an example is close to that capability even when it shares little with the description.

Every owner is scored for every query, in a few array operations over :class:`OwnerLayout`
(where each owner's rows and BM25 slots are), and the cost is that of the matrix products, not
of a Python loop per candidate. Past ``candidate_pool`` owners (512), the single texts' cosines
(most of those products) are read for the pool's owners alone: the best by the score without
them (:func:`candidate_pool`); at 10,000 capabilities every tuning query's top 10 was the same.

The formula (weights in :class:`Weights`, chosen in ``semantic/search.py``'s docstring)::

    best(C)    = max(cos(C), cos(each example request of C))
    closest    = max over the owner's capabilities C of best(C)    (its closest capability or example)
    cosine(C)  = (1 - example_weight) * cos(C) + example_weight * best(C)
    part(x)    = vector_weight * cosine + (1 - vector_weight) * coverage        (hybrid)
    C          = the capability of the owner with the best part(cosine(C), coverage(C)): the one named
    cosine     = agent_vector_weight  * cos(agent doc)      + (1 - agent_vector_weight)  * closest
    coverage   = agent_lexical_weight * coverage(agent doc) + (1 - agent_lexical_weight) * coverage(C)
    score      = part(cosine, coverage)   (Ranking.VECTOR: cosine; Ranking.LEXICAL: coverage)

The agent vector says what the agent is as a whole; ``closest`` is a max-similarity over its
single texts (people ask the way its example requests are written). Examples still lift the
capability they belong to when the matched capability is chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from .lexical import LexicalScores

__all__ = ["Ranking", "SearchHit", "Weights", "OwnerLayout", "QuerySignals", "rank_owners", "ExampleGroups",
           "best_cosines", "CandidatePool", "candidate_pool"]


class Ranking(str, Enum):
    """Which signal orders a single search (diagnostics and evaluation; default follows the mode)."""

    HYBRID = "hybrid"
    VECTOR = "vector"
    LEXICAL = "lexical"


@dataclass(frozen=True)
class SearchHit:
    """One owner (agent), its score, and the capability of it that matched best.

    ``capability`` is None only for an owner without capability documents (``doc_id`` is then
    its description document). ``vector_score`` and ``lexical_score`` are the two parts of
    ``score`` with the agent and capability levels already weighted in (so that in hybrid
    ranking ``score = vector_weight * vector_score + (1 - vector_weight) * lexical_score``);
    ``vector_score`` is None in lexical mode.
    """

    owner_id: str
    capability: str | None
    doc_id: str
    score: float
    vector_score: float | None
    lexical_score: float


@dataclass(frozen=True)
class Weights:
    """The shares of the score's parts (each within [0, 1]; see the module docstring)."""

    vector: float
    agent_vector: float
    agent_lexical: float
    example: float

    def __post_init__(self) -> None:
        for name in ("vector", "agent_vector", "agent_lexical", "example"):
            weight = getattr(self, name)
            if not 0.0 <= weight <= 1.0:
                raise ValueError(f"{name}_weight must be within [0, 1], got {weight}")


@dataclass(frozen=True)
class ExampleGroups:
    """Example rows grouped by capability: ``order`` sorts example rows by capability row,
    ``starts`` opens each capability's run in that order, ``capability_rows`` names each run."""

    order: np.ndarray
    starts: np.ndarray
    capability_rows: np.ndarray

    @classmethod
    def of(cls, capability_row_of_example: np.ndarray) -> ExampleGroups:
        order = np.argsort(capability_row_of_example, kind="stable")
        sorted_rows = capability_row_of_example[order]
        starts = np.flatnonzero(np.r_[True, sorted_rows[1:] != sorted_rows[:-1]]) if len(order) else order
        return cls(order=order, starts=starts, capability_rows=sorted_rows[starts])


def best_cosines(capability_cosines: np.ndarray, example_cosines: np.ndarray, groups: ExampleGroups) -> np.ndarray:
    """``best(C)`` of the module docstring for every capability row at once (one reduction per
    capability run, no Python loop)."""
    if not len(example_cosines):
        return capability_cosines
    closest = np.maximum.reduceat(example_cosines[groups.order], groups.starts)
    best = capability_cosines.copy()
    best[groups.capability_rows] = np.maximum(capability_cosines[groups.capability_rows], closest)
    return best


@dataclass(frozen=True)
class OwnerLayout:
    """Where every owner's documents sit in the indexes, as arrays, so that one query scores all
    owners in a few vectorised steps. Rebuilt after a mutation (rows and slots move); -1 marks a
    document without a vector or a BM25 entry.

    Capability documents ("entries") are grouped by owner, in each owner's document order, so the
    first best entry of a group is the capability an owner is named by (as a loop would pick).
    """

    owner_ids: list[str]
    tie_rank: np.ndarray  # position of each owner id in sorted order: equal scores break by id
    agent_rows: np.ndarray
    agent_slots: np.ndarray
    named_without_capability: list[str]  # the doc id naming an owner without capabilities
    entry_doc_ids: list[str]
    entry_rows: np.ndarray
    entry_slots: np.ndarray
    group_starts: np.ndarray  # first entry of each owner that has capabilities
    group_owners: np.ndarray  # that owner's position in owner_ids

    @classmethod
    def of(cls, owner_docs: Mapping[str, Sequence[str]], capability_of: Callable[[str], str | None], *,
           agent_row: Callable[[str], int | None], agent_slot: Callable[[str], int | None],
           capability_row: Callable[[str], int | None], capability_slot: Callable[[str], int | None]
           ) -> OwnerLayout:
        owner_ids = list(owner_docs)
        entry_doc_ids: list[str] = []
        group_starts: list[int] = []
        group_owners: list[int] = []
        for position, owner_id in enumerate(owner_ids):
            capabilities = [doc_id for doc_id in owner_docs[owner_id] if capability_of(doc_id) is not None]
            if capabilities:
                group_starts.append(len(entry_doc_ids))
                group_owners.append(position)
                entry_doc_ids.extend(capabilities)
        tie_rank = np.empty(len(owner_ids), dtype=np.int64)
        tie_rank[np.argsort(np.array(owner_ids, dtype=object), kind="stable")] = np.arange(len(owner_ids))
        return cls(
            owner_ids=owner_ids,
            tie_rank=tie_rank,
            agent_rows=_positions(owner_ids, agent_row),
            agent_slots=_positions(owner_ids, agent_slot),
            named_without_capability=[owner_docs[owner_id][0] for owner_id in owner_ids],
            entry_doc_ids=entry_doc_ids,
            entry_rows=_positions(entry_doc_ids, capability_row),
            entry_slots=_positions(entry_doc_ids, capability_slot),
            group_starts=np.array(group_starts, dtype=np.int64),
            group_owners=np.array(group_owners, dtype=np.int64),
        )


def _positions(keys: Sequence[str], position_of: Callable[[str], int | None]) -> np.ndarray:
    positions = (position_of(key) for key in keys)
    return np.fromiter((-1 if position is None else position for position in positions), dtype=np.int64,
                       count=len(keys))


@dataclass(frozen=True)
class QuerySignals:
    """One query's raw signals: cosines by vector row (None without a query vector; with
    ``capability_best``, :func:`best_cosines`, by capability row too) and BM25 scores (None for
    the vector ranking)."""

    agent_cosines: np.ndarray | None
    capability_cosines: np.ndarray | None
    capability_best: np.ndarray | None
    agent_lexical: LexicalScores | None
    capability_lexical: LexicalScores | None


def _cosines(similarities: np.ndarray | None, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cosine, has a cosine) of each row; NaN where there is none."""
    present = rows >= 0 if similarities is not None else np.zeros(len(rows), dtype=bool)
    if similarities is None or not len(rows):
        return np.full(len(rows), np.nan), present
    values = similarities[np.where(present, rows, 0)].astype(np.float64)
    return np.where(present, values, np.nan), present


def _coverages(lexical: LexicalScores | None, slots: np.ndarray) -> np.ndarray:
    return np.zeros(len(slots)) if lexical is None else lexical.coverage_of_slots(slots)


def _part(weights: Weights, ranking: Ranking, cosine: np.ndarray, has_cosine: np.ndarray,
          coverage: np.ndarray) -> np.ndarray:
    if ranking is Ranking.VECTOR:
        return np.where(has_cosine, cosine, 0.0)
    if ranking is Ranking.LEXICAL:
        return coverage
    return np.where(has_cosine, weights.vector * cosine + (1.0 - weights.vector) * coverage, coverage)


@dataclass(frozen=True)
class CandidatePool:
    """The owners a query's second stage scores whole (a mask by owner position) and the vector
    rows of their capabilities and example requests."""

    owners: np.ndarray
    capability_rows: np.ndarray
    example_rows: np.ndarray


def candidate_pool(layout: OwnerLayout, groups: ExampleGroups, agent_cosines: np.ndarray,
                   agent_lexical: LexicalScores | None, weights: Weights, size: int) -> CandidatePool | None:
    """The ``size`` owners with the best score without their single texts' cosines (the agent
    vector's share and the coverage), or None when there are no more owners than that.

    The first stage of a large index: the capabilities' and example requests' cosines (most of a
    query's reading of the vectors) are then computed for these owners' rows alone."""
    if len(layout.owner_ids) <= size:
        return None
    cosine, has_cosine = _cosines(agent_cosines, layout.agent_rows)
    coverage = weights.agent_lexical * _coverages(agent_lexical, layout.agent_slots)
    first = np.where(has_cosine, weights.vector * weights.agent_vector * cosine + (1.0 - weights.vector) * coverage,
                     coverage)
    owners = np.zeros(len(layout.owner_ids), dtype=bool)
    owners[np.argpartition(-first, size - 1)[:size]] = True
    lengths = np.diff(np.r_[layout.group_starts, len(layout.entry_rows)]).astype(np.int64)
    rows = layout.entry_rows[owners[np.repeat(layout.group_owners, lengths)]]
    rows = rows[rows >= 0]
    runs = np.diff(np.r_[groups.starts, len(groups.order)]).astype(np.int64)
    example_rows = groups.order[np.isin(np.repeat(groups.capability_rows, runs), rows)]
    return CandidatePool(owners=owners, capability_rows=rows, example_rows=example_rows)


def rank_owners(layout: OwnerLayout, signals: QuerySignals, *, weights: Weights, ranking: Ranking, k: int,
                allow: Callable[[str], bool] | None, capability_of: Callable[[str], str | None],
                candidates: np.ndarray | None = None) -> list[SearchHit]:
    """The ``k`` best owners allowed by ``allow`` (called at most once per owner), best first,
    scored by the formula of the module docstring for every owner at once (``candidates``: a
    mask by owner position, the only owners that may be returned)."""
    owners = len(layout.owner_ids)
    agent_cosine, agent_has = _cosines(signals.agent_cosines, layout.agent_rows)
    agent_coverage = _coverages(signals.agent_lexical, layout.agent_slots)
    entry_cosine, entry_has = _cosines(signals.capability_cosines, layout.entry_rows)
    entry_best, _ = _cosines(signals.capability_best, layout.entry_rows)
    entry_coverage = _coverages(signals.capability_lexical, layout.entry_slots)

    closest, best_has, best_coverage = agent_cosine.copy(), agent_has.copy(), agent_coverage.copy()
    best_entry = np.full(owners, -1, dtype=np.int64)
    touched = agent_coverage > 0.0  # without vectors, an owner must share a word with the query
    if len(layout.entry_doc_ids):
        lifted = entry_cosine + weights.example * (entry_best - entry_cosine)
        entry_part = _part(weights, ranking, lifted, entry_has, entry_coverage)
        lengths = np.diff(np.r_[layout.group_starts, len(entry_part)])
        top = np.maximum.reduceat(entry_part, layout.group_starts)
        maxima = np.flatnonzero(entry_part == np.repeat(top, lengths))
        group_of = np.repeat(np.arange(len(lengths)), lengths)[maxima]
        first = maxima[np.r_[True, group_of[1:] != group_of[:-1]]]  # the first best entry of each group
        holders = layout.group_owners
        best_entry[holders] = first
        closest[holders] = np.fmax.reduceat(entry_best, layout.group_starts)  # NaN: no vector
        best_has[holders] = np.maximum.reduceat(entry_has, layout.group_starts)
        best_coverage[holders] = entry_coverage[first]
        touched[holders] |= np.maximum.reduceat(entry_coverage > 0.0, layout.group_starts)
    has_capability = best_entry >= 0
    vector_share = np.where(has_capability, weights.agent_vector, 1.0)
    lexical_share = np.where(has_capability, weights.agent_lexical, 1.0)
    has_cosine = agent_has & best_has
    cosine = vector_share * agent_cosine + (1.0 - vector_share) * closest
    coverage = lexical_share * agent_coverage + (1.0 - lexical_share) * best_coverage
    score = _part(weights, ranking, cosine, has_cosine, coverage)

    reached = agent_has | touched if signals.agent_cosines is not None else touched
    eligible = np.flatnonzero(reached if candidates is None else reached & candidates)
    hits: list[SearchHit] = []
    for position in _best_first(score, layout.tie_rank, eligible, k, allow, layout.owner_ids):
        entry = int(best_entry[position])
        doc_id = layout.entry_doc_ids[entry] if entry >= 0 else layout.named_without_capability[position]
        hits.append(SearchHit(
            owner_id=layout.owner_ids[position],
            capability=capability_of(doc_id),
            doc_id=doc_id,
            score=float(score[position]),
            vector_score=float(cosine[position]) if has_cosine[position] else None,
            lexical_score=float(coverage[position]),
        ))
    return hits


def _best_first(score: np.ndarray, tie_rank: np.ndarray, eligible: np.ndarray, k: int,
                allow: Callable[[str], bool] | None, owner_ids: Sequence[str]) -> list[int]:
    """Positions of the ``k`` best eligible owners that ``allow`` admits, by score then owner id.

    Looks at a window a few times ``k`` wide first (every owner tied with its last one included)
    and widens it only when ``allow`` turns most of it down; verdicts are remembered.
    """
    verdicts: dict[int, bool] = {}
    window = max(4 * k, 32)
    while True:
        if window < len(eligible):
            scores = score[eligible]
            cut = scores[np.argpartition(-scores, window - 1)[window - 1]]
            chosen = eligible[scores >= cut]
        else:
            chosen = eligible
        ordered = chosen[np.lexsort((tie_rank[chosen], -score[chosen]))]
        accepted: list[int] = []
        for position in ordered.tolist():
            if allow is not None:
                verdict = verdicts.get(position)
                if verdict is None:
                    verdict = verdicts[position] = bool(allow(owner_ids[position]))
                if not verdict:
                    continue
            accepted.append(position)
            if len(accepted) == k:
                return accepted
        if len(chosen) >= len(eligible):
            return accepted
        window *= 4
