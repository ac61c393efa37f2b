"""SemanticSearch: the facade a registry node uses to find agents by plain-language request.

Each agent (owner) contributes documents (one per capability plus its description); a query is
scored against every document by cosine similarity (embedder + :class:`VectorIndex`) and BM25
(:class:`LexicalIndex`), the two are fused, and the best document of each owner represents it.

Score (``SearchHit.score``), chosen so the router's fallback threshold means the same thing for
every query::

    hybrid:  score = vector_weight * cosine + (1 - vector_weight) * lexical_coverage
    lexical: score = lexical_coverage
    (either multiplied by description_weight when the agent-description document matched)

``cosine`` is the similarity of the query with the matched document (in [-1, 1], typically
0.1-0.3 for unrelated and 0.4-0.8 for matching text with all-MiniLM-L6-v2), and
``lexical_coverage`` is BM25 divided by the BM25 an ideal document would reach for that query
(in [0, 1): how much of the query's IDF-weighted words the document covers). Neither part is
normalised by the best hit of the query, so a query nobody can serve gets a low score instead
of a rescaled 1.0 — rank-based fusion (RRF) or per-query min-max scaling would lose that. The
linear blend is also the ranking that measured best (see ``bench/semantic.py``).

Thresholds: on the eval set with the default model, the top hit's hybrid score was >= 0.19 for
90% of correctly answered queries (median 0.29) and <= 0.20 for every request no agent can
serve (median 0.13), hence ``SUGGESTED_MIN_SCORE_HYBRID = 0.2``. Lexical scores sit lower and
separate worse (right answers: p10 0.05, median 0.12; nobody-serves: max 0.13), hence a separate
``SUGGESTED_MIN_SCORE_LEXICAL``; a caller should pick the threshold by ``SearchResult.mode``.
Another model needs its own measurement.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from .documents import (
    DEFAULT_TEXT_FORMAT,
    Document,
    TextFormat,
    embedding_text,
    lexical_text,
)
from .embedder import Embedder
from .errors import EmbedderUnavailable, InvalidDocumentError, SearchClosedError
from .index import VectorIndex, top_k_of_scores
from .lexical import DEFAULT_B, DEFAULT_BIGRAMS, DEFAULT_K1, LexicalIndex

__all__ = [
    "SemanticSearch",
    "SearchHit",
    "SearchResult",
    "SearchMode",
    "Ranking",
    "Fusion",
    "SearchState",
    "SearchTimings",
    "DEFAULT_VECTOR_WEIGHT",
    "DEFAULT_RRF_K",
    "DEFAULT_DESCRIPTION_WEIGHT",
    "DEFAULT_CANDIDATE_POOL",
    "MAX_K",
    "SUGGESTED_MIN_SCORE_HYBRID",
    "SUGGESTED_MIN_SCORE_LEXICAL",
]

logger = logging.getLogger(__name__)

DEFAULT_VECTOR_WEIGHT = 0.6  # measured: 0.5-0.6 best on the eval set, RRF below both
DEFAULT_RRF_K = 60  # the constant of Cormack et al. (2009); larger flattens the rank curve
# A description match counts 0.8 of a capability match: the description is the generic fallback,
# and at 1.0 it won over the specific capability for a quarter of the eval queries (the hit then
# cannot say which capability matched) and lifted off-topic queries' scores.
DEFAULT_DESCRIPTION_WEIGHT = 0.8
DEFAULT_CANDIDATE_POOL = 100  # documents taken from each ranking before fusion
MAX_K = 1_000
SUGGESTED_MIN_SCORE_HYBRID = 0.2
SUGGESTED_MIN_SCORE_LEXICAL = 0.1


class SearchMode(str, Enum):
    """What the facade can do: both signals, or BM25 only (no embedder)."""

    HYBRID = "hybrid"
    LEXICAL = "lexical"


class Ranking(str, Enum):
    """Which signal orders a single search (diagnostics and evaluation; default follows the mode)."""

    HYBRID = "hybrid"
    VECTOR = "vector"
    LEXICAL = "lexical"


class Fusion(str, Enum):
    """How hybrid ranking combines the two signals."""

    LINEAR = "linear"  # vector_weight * cosine + (1 - vector_weight) * lexical coverage
    RRF = "rrf"  # reciprocal rank fusion; SearchHit.score is then still the linear blend


class SearchState(Enum):
    """Lifecycle of a :class:`SemanticSearch`."""

    NEW = "new"
    READY = "ready"
    CLOSED = "closed"


@dataclass(frozen=True)
class SearchHit:
    """One owner (agent) and the document of it that matched best.

    ``capability`` is None when the agent's description matched best. ``vector_score`` is the
    cosine of the query with that document (None in lexical mode); ``lexical_score`` is its BM25
    coverage in [0, 1); ``score`` is the absolute score described in the module docstring.
    """

    owner_id: str
    capability: str | None
    doc_id: str
    score: float
    vector_score: float | None
    lexical_score: float


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

    @property
    def best(self) -> SearchHit | None:
        return self.hits[0] if self.hits else None


class SemanticSearch:
    """Owner-grouped hybrid (vector + BM25) search over agent documents.

    Config (keyword-only):
      * ``embedder``: the :class:`Embedder` to use; ``None`` builds the default one when
        ``semantic_enabled``. The facade closes an embedder it built, not one passed in.
      * ``semantic_enabled``: ``False`` forces lexical mode (no torch needed at all).
      * ``fusion``, ``vector_weight``, ``rrf_k``: hybrid ranking (see :class:`Fusion`).
      * ``candidate_pool``: documents taken from each ranking before fusion and grouping.
      * ``text_format``: how documents are flattened for the embedder.
      * ``bm25_k1``, ``bm25_b``: Okapi BM25 parameters; ``bm25_bigrams`` also indexes
        adjacent-word pairs so word order counts ("text to speech" vs "speech to text").

    If the embedder cannot be loaded, :meth:`start` logs why, keeps serving in lexical mode and
    exposes the reason as :attr:`unavailable_reason`. Mutations and searches must come from one
    event loop; an upsert that is overtaken by a later upsert or removal of the same owner
    (while it was encoding) is dropped, so the last call wins.
    """

    def __init__(
        self,
        *,
        embedder: Embedder | None = None,
        semantic_enabled: bool = True,
        fusion: Fusion = Fusion.LINEAR,
        vector_weight: float = DEFAULT_VECTOR_WEIGHT,
        rrf_k: int = DEFAULT_RRF_K,
        candidate_pool: int = DEFAULT_CANDIDATE_POOL,
        description_weight: float = DEFAULT_DESCRIPTION_WEIGHT,
        text_format: TextFormat = DEFAULT_TEXT_FORMAT,
        bm25_k1: float = DEFAULT_K1,
        bm25_b: float = DEFAULT_B,
        bm25_bigrams: bool = DEFAULT_BIGRAMS,
    ) -> None:
        if not 0.0 <= vector_weight <= 1.0:
            raise ValueError(f"vector_weight must be within [0, 1], got {vector_weight}")
        if rrf_k < 1:
            raise ValueError(f"rrf_k must be >= 1, got {rrf_k}")
        if not 0.0 < description_weight <= 1.0:
            raise ValueError(f"description_weight must be within (0, 1], got {description_weight}")
        if candidate_pool < 1:
            raise ValueError(f"candidate_pool must be >= 1, got {candidate_pool}")
        self._fusion = Fusion(fusion)
        self._vector_weight = vector_weight
        self._rrf_k = rrf_k
        self._candidate_pool = candidate_pool
        self._description_weight = description_weight
        self._text_format = TextFormat(text_format)
        self._semantic_enabled = semantic_enabled
        self._owns_embedder = embedder is None and semantic_enabled
        self._embedder = embedder if embedder is not None or not semantic_enabled else Embedder()
        self._lexical = LexicalIndex(k1=bm25_k1, b=bm25_b, bigrams=bm25_bigrams)
        self._vectors: VectorIndex | None = None
        self._mode = SearchMode.LEXICAL
        self._state = SearchState.NEW
        self._start_lock = asyncio.Lock()
        self.unavailable_reason: str | None = None if semantic_enabled else "disabled by config (semantic_enabled=False)"
        self._documents: dict[str, Document] = {}
        self._owner_docs: dict[str, tuple[str, ...]] = {}
        self._owner_generation: dict[str, int] = {}
        self._upserts_in_flight: dict[str, int] = {}
        self._generation = 0

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def mode(self) -> SearchMode:
        """``hybrid`` once the embedder is loaded, ``lexical`` otherwise."""
        return self._mode

    @property
    def state(self) -> SearchState:
        return self._state

    @property
    def embedder(self) -> Embedder | None:
        return self._embedder

    async def __aenter__(self) -> SemanticSearch:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Load the embedder (if enabled). Idempotent; never raises for a missing model."""
        async with self._start_lock:
            if self._state is SearchState.CLOSED:
                raise SearchClosedError("the search facade was closed; create a new one")
            if self._state is SearchState.READY:
                return
            if self._embedder is not None:
                try:
                    await self._embedder.load()
                except EmbedderUnavailable as exc:
                    self.unavailable_reason = str(exc)
                    logger.warning("semantic search runs lexical-only: %s", exc)
                else:
                    # Nothing is indexed yet: every mutation starts the facade first.
                    self._vectors = VectorIndex(dimension=self._embedder.dimension)
                    self._mode = SearchMode.HYBRID
            self._state = SearchState.READY

    async def aclose(self) -> None:
        """Close the embedder if this facade built it. Idempotent."""
        if self._state is SearchState.CLOSED:
            return
        self._state = SearchState.CLOSED
        if self._owns_embedder and self._embedder is not None:
            await self._embedder.aclose()

    async def _ensure_started(self) -> None:
        if self._state is SearchState.CLOSED:
            raise SearchClosedError("the search facade was closed; create a new one")
        if self._state is SearchState.NEW:
            await self.start()

    # -- mutations -------------------------------------------------------------------------

    def __len__(self) -> int:
        """Number of indexed documents."""
        return len(self._documents)

    def owners(self) -> list[str]:
        return list(self._owner_docs)

    def documents_of(self, owner_id: str) -> list[Document]:
        return [self._documents[doc_id] for doc_id in self._owner_docs.get(owner_id, ())]

    async def upsert_owner(self, owner_id: str, documents: Sequence[Document]) -> None:
        """Replace every document of ``owner_id`` with ``documents`` (an empty list removes it).

        Raises :class:`InvalidDocumentError` if a document names another owner, ids repeat, or
        an id already belongs to another owner; the embedder's errors propagate.
        """
        await self.upsert_owners({owner_id: documents})

    async def upsert_owners(self, documents_by_owner: Mapping[str, Sequence[Document]]) -> None:
        """Bulk :meth:`upsert_owner`: all new texts are encoded together (faster for snapshots)."""
        await self._ensure_started()
        for owner_id, documents in documents_by_owner.items():
            self._validate(owner_id, documents)
        # Each upsert takes a generation per owner; a later upsert or removal of that owner
        # during our await takes a newer one, and our now-stale documents are dropped.
        generations: dict[str, int] = {}
        for owner_id in documents_by_owner:
            self._generation += 1
            generations[owner_id] = self._owner_generation[owner_id] = self._generation
            self._upserts_in_flight[owner_id] = self._upserts_in_flight.get(owner_id, 0) + 1
        try:
            ordered = [document for documents in documents_by_owner.values() for document in documents]
            vectors = await self._encode(ordered)
            offset = 0
            for owner_id, documents in documents_by_owner.items():
                owner_vectors = None if vectors is None else vectors[offset : offset + len(documents)]
                offset += len(documents)
                if self._owner_generation.get(owner_id) != generations[owner_id]:
                    continue
                self._validate(owner_id, documents)  # another owner may have taken an id meanwhile
                self._replace(owner_id, documents, owner_vectors)
        finally:
            for owner_id in generations:
                remaining = self._upserts_in_flight[owner_id] - 1
                if remaining:
                    self._upserts_in_flight[owner_id] = remaining
                else:  # bookkeeping only lives while an upsert is in flight: no growth with churn
                    del self._upserts_in_flight[owner_id]
                    del self._owner_generation[owner_id]

    def remove_owner(self, owner_id: str) -> bool:
        """Forget every document of ``owner_id``; returns whether it had any.

        An upsert of this owner still encoding when this is called will not re-add it.
        """
        if owner_id in self._owner_generation:
            self._generation += 1
            self._owner_generation[owner_id] = self._generation
        doc_ids = self._owner_docs.pop(owner_id, ())
        for doc_id in doc_ids:
            self._forget(doc_id)
        return bool(doc_ids)

    def _validate(self, owner_id: str, documents: Sequence[Document]) -> None:
        seen: set[str] = set()
        for document in documents:
            if document.owner_id != owner_id:
                raise InvalidDocumentError(
                    f"document {document.doc_id!r} belongs to {document.owner_id!r}, not {owner_id!r}"
                )
            if document.doc_id in seen:
                raise InvalidDocumentError(f"doc_id {document.doc_id!r} appears twice for {owner_id!r}")
            seen.add(document.doc_id)
            existing = self._documents.get(document.doc_id)
            if existing is not None and existing.owner_id != owner_id:
                raise InvalidDocumentError(
                    f"doc_id {document.doc_id!r} already belongs to {existing.owner_id!r}; "
                    f"doc ids must be unique across owners (Document.for_capability builds such ids)"
                )

    async def _encode(self, documents: Sequence[Document]) -> np.ndarray | None:
        if self._mode is not SearchMode.HYBRID or self._embedder is None or not documents:
            return None
        return await self._embedder.encode([embedding_text(document, self._text_format) for document in documents])

    def _replace(self, owner_id: str, documents: Sequence[Document], vectors: np.ndarray | None) -> None:
        new_ids = tuple(document.doc_id for document in documents)
        for doc_id in set(self._owner_docs.get(owner_id, ())) - set(new_ids):
            self._forget(doc_id)
        if not documents:
            self._owner_docs.pop(owner_id, None)
            return
        for document in documents:
            self._documents[document.doc_id] = document
            self._lexical.upsert(document.doc_id, lexical_text(document))
        if self._vectors is not None and vectors is not None:
            self._vectors.upsert_many(list(new_ids), vectors)
        self._owner_docs[owner_id] = new_ids

    def _forget(self, doc_id: str) -> None:
        self._documents.pop(doc_id, None)
        self._lexical.remove(doc_id)
        if self._vectors is not None:
            self._vectors.remove(doc_id)

    # -- search ----------------------------------------------------------------------------

    async def search(
        self,
        query: str,
        k: int = 10,
        allow: Callable[[str], bool] | None = None,
        *,
        ranking: Ranking | None = None,
    ) -> SearchResult:
        """The ``k`` best owners for ``query``, best first, one hit per owner.

        ``allow(owner_id)`` filters owners (e.g. ready agents of a region) before ranking; it is
        called at most once per owner per search. ``ranking`` overrides the signal used
        (evaluation); in lexical mode every ranking is lexical.
        Raises ``ValueError`` for ``k`` outside 1..MAX_K and the embedder's errors.
        """
        if not 1 <= k <= MAX_K:
            raise ValueError(f"k must be within 1..{MAX_K}, got {k}")
        await self._ensure_started()
        if self._mode is SearchMode.HYBRID:
            chosen = Ranking(ranking) if ranking is not None else Ranking.HYBRID
        else:
            chosen = Ranking.LEXICAL
        if not query.strip() or not self._documents:
            return SearchResult(query, self._mode, chosen, [])

        owner_allowed: dict[str, bool] = {}

        def doc_allowed(doc_id: str) -> bool:
            owner_id = self._documents[doc_id].owner_id
            verdict = owner_allowed.get(owner_id)
            if verdict is None:
                verdict = owner_allowed[owner_id] = bool(allow(owner_id))  # type: ignore[misc]
            return verdict

        doc_filter = doc_allowed if allow is not None else None
        encode_started = time.perf_counter()
        query_vector: np.ndarray | None = None
        if chosen is not Ranking.LEXICAL and self._embedder is not None and self._vectors is not None:
            query_vector = (await self._embedder.encode([query]))[0]
        rank_started = time.perf_counter()
        # No await from here on: the indexes cannot change under the ranking.
        similarities = None
        if query_vector is not None and self._vectors is not None:
            similarities = self._vectors.similarities(query_vector)
        hits = self._rank(query, k, chosen, similarities, doc_filter)
        finished = time.perf_counter()
        timings = SearchTimings(
            encode_ms=(rank_started - encode_started) * 1000.0,
            rank_ms=(finished - rank_started) * 1000.0,
        )
        return SearchResult(query, self._mode, chosen, hits, timings)

    def _rank(
        self,
        query: str,
        k: int,
        ranking: Ranking,
        similarities: np.ndarray | None,
        doc_filter: Callable[[str], bool] | None,
    ) -> list[SearchHit]:
        # A pool several times k deep so that grouping by owner still yields k owners when an
        # owner's several capabilities crowd the top of a ranking.
        pool = max(self._candidate_pool, 4 * k)
        lexical = self._lexical.score(query)

        vector_ranked: list[tuple[str, float]] = []
        if similarities is not None and self._vectors is not None:
            vector_ranked = top_k_of_scores(self._vectors.ids(), similarities, pool, doc_filter)
        lexical_ranked: list[tuple[str, float]] = []
        if ranking is not Ranking.VECTOR:
            lexical_ranked = top_k_of_scores(lexical.doc_ids, lexical.normalized(), pool, doc_filter)

        candidates = dict.fromkeys(doc_id for doc_id, _ in vector_ranked)
        candidates.update(dict.fromkeys(doc_id for doc_id, _ in lexical_ranked))
        cosine: dict[str, float | None] = {}
        coverage: dict[str, float] = {}
        blended: dict[str, float] = {}
        weight = self._vector_weight
        for doc_id in candidates:
            doc_cosine = None
            if similarities is not None and self._vectors is not None:
                row = self._vectors.row_of(doc_id)
                doc_cosine = None if row is None else float(similarities[row])
            cosine[doc_id] = doc_cosine
            doc_coverage = coverage[doc_id] = lexical.coverage_of(doc_id)
            if ranking is Ranking.VECTOR:
                score = doc_cosine if doc_cosine is not None else 0.0
            elif ranking is Ranking.LEXICAL or doc_cosine is None:
                score = doc_coverage
            else:
                score = weight * doc_cosine + (1.0 - weight) * doc_coverage
            if self._documents[doc_id].capability is None:
                score *= self._description_weight
            blended[doc_id] = score

        if ranking is Ranking.HYBRID and self._fusion is Fusion.RRF:
            order_key = self._reciprocal_rank(vector_ranked, lexical_ranked)
        else:
            order_key = blended

        best_of_owner: dict[str, str] = {}
        for doc_id in sorted(candidates, key=lambda doc: (-order_key.get(doc, 0.0), doc)):
            owner_id = self._documents[doc_id].owner_id
            if owner_id not in best_of_owner:
                best_of_owner[owner_id] = doc_id
                if len(best_of_owner) == k:
                    break
        hits = []
        for owner_id, doc_id in best_of_owner.items():
            document = self._documents[doc_id]
            hits.append(
                SearchHit(
                    owner_id=owner_id,
                    capability=document.capability,
                    doc_id=doc_id,
                    score=blended[doc_id],
                    vector_score=cosine[doc_id],
                    lexical_score=coverage[doc_id],
                )
            )
        return hits

    def _reciprocal_rank(
        self, vector_ranked: list[tuple[str, float]], lexical_ranked: list[tuple[str, float]]
    ) -> dict[str, float]:
        fused: dict[str, float] = {}
        for ranked in (vector_ranked, lexical_ranked):
            for rank, (doc_id, _) in enumerate(ranked, start=1):
                fused[doc_id] = fused.get(doc_id, 0.0) + 1.0 / (self._rrf_k + rank)
        return fused
