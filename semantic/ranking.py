"""Ranking: how an owner's score is formed from its documents' cosines and BM25 coverages.

One owner (agent) is scored from three kinds of vectors and two lexical indexes, all held by
:class:`~semantic.search.SemanticSearch`:

* the agent-level document (display name, description, every capability's fields) — a vector
  and a BM25 entry, keyed by owner id;
* each capability document — a vector and a BM25 entry, keyed by doc id;
* each example request of a capability — a vector of its own, keyed by example key. Examples
  are written the way people ask ("add this taxi receipt to my expenses"), so a query close to
  an example is close to that capability even when it shares little with the description.

The formula (weights in :class:`Weights`, chosen in ``semantic/search.py``'s docstring)::

    cosine(C)  = (1 - example_weight) * cos(C) + example_weight * max(cos(C), best example of C)
    part(x)    = vector_weight * cosine + (1 - vector_weight) * coverage        (hybrid)
    C          = the capability of the owner with the best part(cosine(C), coverage(C))
    cosine     = agent_vector_weight  * cos(agent doc)      + (1 - agent_vector_weight)  * cosine(C)
    coverage   = agent_lexical_weight * coverage(agent doc) + (1 - agent_lexical_weight) * coverage(C)
    score      = part(cosine, coverage)   (Ranking.VECTOR: cosine; Ranking.LEXICAL: coverage)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from .index import VectorIndex, top_k_of_scores
from .lexical import LexicalIndex

__all__ = ["Ranking", "SearchHit", "Weights", "LevelSignals", "OwnerScorer", "ExampleGroups", "lifted_cosines"]


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


@dataclass(frozen=True, slots=True)
class _Parts:
    """Cosine (None without vectors) and lexical coverage of one document."""

    cosine: float | None
    coverage: float


class LevelSignals:
    """The query's scores on one level (agent or capability): cosines and BM25 coverage."""

    def __init__(self, vectors: VectorIndex | None, similarities: np.ndarray | None, lexical: LexicalIndex | None,
                 query: str) -> None:
        self.vectors = vectors
        self.similarities = similarities  # aligned with vectors.ids(); None without a query vector
        self.lexical = None if lexical is None else lexical.score(query)

    def cosine(self, key: str) -> float | None:
        if self.similarities is None or self.vectors is None:
            return None
        row = self.vectors.row_of(key)
        return None if row is None else float(self.similarities[row])

    def coverage(self, key: str) -> float:
        return self.lexical.coverage_of(key) if self.lexical is not None else 0.0

    def top(self, pool: int, allow: Callable[[str], bool] | None) -> list[str]:
        keys: list[str] = []
        if self.similarities is not None and self.vectors is not None:
            keys.extend(key for key, _ in top_k_of_scores(self.vectors.ids(), self.similarities, pool, allow))
        if self.lexical is not None:
            keys.extend(key for key, _ in top_k_of_scores(self.lexical.doc_ids, self.lexical.normalized(), pool,
                                                          allow))
        return keys


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


def lifted_cosines(capability_cosines: np.ndarray, example_cosines: np.ndarray, groups: ExampleGroups,
                   example_weight: float) -> np.ndarray:
    """``cosine(C)`` of the module docstring for every capability row at once (one reduction per
    capability run, no Python loop)."""
    if not len(example_cosines) or example_weight <= 0.0:
        return capability_cosines
    closest = np.maximum.reduceat(example_cosines[groups.order], groups.starts)
    lifted = capability_cosines.copy()
    own = capability_cosines[groups.capability_rows]
    lifted[groups.capability_rows] = own + example_weight * np.maximum(closest - own, 0.0)
    return lifted


class OwnerScorer:
    """Scores owners for one query from the agent, capability and example signals."""

    def __init__(self, *, weights: Weights, ranking: Ranking, agent: LevelSignals, capability: LevelSignals,
                 capability_of: Callable[[str], str | None]) -> None:
        self._weights = weights
        self._ranking = ranking
        self._agent = agent
        self._capability = capability  # its similarities already lifted by examples (lifted_cosines)
        self._capability_of = capability_of

    def _part(self, parts: _Parts) -> float:
        if self._ranking is Ranking.VECTOR:
            return parts.cosine if parts.cosine is not None else 0.0
        if self._ranking is Ranking.LEXICAL or parts.cosine is None:
            return parts.coverage
        return self._weights.vector * parts.cosine + (1.0 - self._weights.vector) * parts.coverage

    def _capability_parts(self, doc_id: str) -> _Parts:
        return _Parts(self._capability.cosine(doc_id), self._capability.coverage(doc_id))

    def score(self, owner_id: str, doc_ids: Sequence[str]) -> SearchHit:
        """The hit of ``owner_id`` whose documents are ``doc_ids`` (its description among them)."""
        agent_parts = _Parts(self._agent.cosine(owner_id), self._agent.coverage(owner_id))
        best_doc: str | None = None
        best_parts = agent_parts
        best_score = -np.inf
        for doc_id in doc_ids:
            if self._capability_of(doc_id) is None:
                continue
            parts = self._capability_parts(doc_id)
            score = self._part(parts)
            if score > best_score:
                best_doc, best_parts, best_score = doc_id, parts, score
        if best_doc is None:  # no capabilities: the agent-level document alone, named by its description
            vector_share = lexical_share = 1.0
            best_doc = doc_ids[0]
        else:
            vector_share, lexical_share = self._weights.agent_vector, self._weights.agent_lexical
        cosine = None
        if agent_parts.cosine is not None and best_parts.cosine is not None:
            cosine = vector_share * agent_parts.cosine + (1.0 - vector_share) * best_parts.cosine
        coverage = lexical_share * agent_parts.coverage + (1.0 - lexical_share) * best_parts.coverage
        return SearchHit(
            owner_id=owner_id,
            capability=self._capability_of(best_doc),
            doc_id=best_doc,
            score=self._part(_Parts(cosine, coverage)),
            vector_score=cosine,
            lexical_score=coverage,
        )
