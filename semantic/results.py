"""What a search answers: its hits, how they were ranked, and the score a router should trust.

Thresholds (``SUGGESTED_MIN_SCORE_*``): the hybrid one is the tuning set's threshold that routes
the fewest unanswerable queries while refusing at most 5% of the answerable ones (a multiple of
0.005; ``bench.semantic.refusal_threshold``): 0.205 refuses 4.1% and routes 43.9% of the tuning
set's, 10.4% / 43.6% of the blind set's and 6.5% / 43.8% of the held-out set's (at the former
0.18: 1.0% / 61.0%, 5.7% / 53.8%, 3.2% / 50.0%). Near-miss requests score like real ones, so no
single threshold reaches 5% refused with 40% routed on the other sets. Rules over the top hit's
score with its margin to the runner-up, its coverage or its closest text's cosine, fitted on the
tuning set (logistic), refused more on the blind set at that budget (11.4-18.7%) and no less on
the held-out set (6.5-9.7%): the top score alone stays. The lexical threshold 0.07 is the
first round's (the Chinese set's zh->zh slice rests on it); lexical mode on the English sets
refuses 19.6-29.0% of their answerable queries. The threshold follows the ranking that scored
a result (``SearchResult.suggested_threshold``; a mostly-Chinese query is ranked lexically in
hybrid mode); another model needs its own measurement (``semantic_threshold`` in the node's
settings).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .ranking import Ranking, SearchHit

__all__ = [
    "SearchMode",
    "SearchResult",
    "SearchTimings",
    "SUGGESTED_MIN_SCORE_HYBRID",
    "SUGGESTED_MIN_SCORE_LEXICAL",
    "SUGGESTED_MIN_SCORE_HYBRID_CJK",
    "suggested_min_score",
]

SUGGESTED_MIN_SCORE_HYBRID = 0.205
# A query mostly in Chinese, Japanese or Korean is ranked by the multilingual encoder alone and
# its BM25 coverage counts bigrams: its scores live on a scale of their own.
SUGGESTED_MIN_SCORE_HYBRID_CJK = 0.205
SUGGESTED_MIN_SCORE_LEXICAL = 0.07


class SearchMode(str, Enum):
    """What the facade can do: both signals, or BM25 only (no embedder)."""

    HYBRID = "hybrid"
    LEXICAL = "lexical"


def suggested_min_score(ranking: SearchMode | Ranking | str) -> float:
    """The score a top hit needs before a router trusts it, for the packaged model, by the
    ranking that scored it (a :class:`SearchMode` names its default ranking).

    Hybrid and lexical scores live on different scales (coverage alone is rarely above 0.3), so
    a hit is held to the threshold of the ranking that produced it. Raises ``ValueError`` for
    the vector ranking: it is a diagnostic, and no threshold is calibrated for it.
    """
    value = ranking.value if isinstance(ranking, Enum) else str(ranking)
    if value == Ranking.HYBRID.value:
        return SUGGESTED_MIN_SCORE_HYBRID
    if value == Ranking.LEXICAL.value:
        return SUGGESTED_MIN_SCORE_LEXICAL
    raise ValueError(f"no refusal threshold is calibrated for the {value!r} ranking (hybrid or lexical only)")


@dataclass(frozen=True)
class SearchTimings:
    """Where a search spent its time, in milliseconds."""

    encode_ms: float = 0.0
    rank_ms: float = 0.0


@dataclass(frozen=True)
class SearchResult:
    """Hits best first, one per owner, and how they were ranked."""

    query: str
    mode: SearchMode
    ranking: Ranking
    hits: list[SearchHit]
    timings: SearchTimings = field(default_factory=SearchTimings)
    corrected_query: str | None = None  # what was ranked, when spelling correction changed the query
    mostly_cjk: bool = False  # the query is mostly Chinese, Japanese or Korean (its own hybrid threshold)

    @property
    def best(self) -> SearchHit | None:
        return self.hits[0] if self.hits else None

    @property
    def suggested_threshold(self) -> float | None:
        """The score :attr:`best` needs to be trusted, by :attr:`ranking` (a mostly-Chinese query
        is ranked lexically even in hybrid mode); None for the diagnostic vector ranking."""
        if self.ranking is Ranking.VECTOR:
            return None
        if self.ranking is Ranking.HYBRID and self.mostly_cjk:
            return SUGGESTED_MIN_SCORE_HYBRID_CJK
        return suggested_min_score(self.ranking)
