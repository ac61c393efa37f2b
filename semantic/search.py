"""SemanticSearch: the facade a registry node uses to find agents by plain-language request.

Each agent (owner) contributes documents (one per capability plus its description). The facade
scores an owner on two levels: the agent level (a vector, the normalised mean of the vectors of
its description, capabilities and example requests; a BM25 entry of every field: display name,
description, each capability's name, description, tags and examples) and its single texts (each
capability and each example request, whose closest one to the query counts; the best capability
names the match). Cosine similarity comes from the embedder + :class:`VectorIndex`, BM25 from
:class:`LexicalIndex` (one index per level so that each level's word statistics stay its own).
The embedder sees a query without its request opening ("could you", "I need someone to":
:func:`~semantic.documents.embedding_query`).

Score (``SearchHit.score``; :mod:`semantic.ranking` has the full formula), chosen so the router's
fallback threshold means the same thing for every query::

    closest  = the highest cosine of any capability or example request of the owner
    cosine   = agent_vector_weight  * cosine(agent document) + (1 - agent_vector_weight) * closest
    coverage = agent_lexical_weight * coverage(agent document) + (1 - agent_lexical_weight) * coverage(C)
    hybrid:  score = vector_weight * cosine + (1 - vector_weight) * coverage
    lexical: score = coverage            (Ranking.VECTOR, for diagnostics: score = cosine)

``cosine`` is in [-1, 1] (typically 0.1-0.3 for unrelated and 0.4-0.8 for matching text with
all-MiniLM-L6-v2); ``coverage`` is BM25 divided by the BM25 an ideal document would reach for
that query (in [0, 1): how much of the query's IDF-weighted words the document covers). Nothing
is normalised by the best hit of the query, so a query nobody can serve gets a low score
instead of a rescaled 1.0 (rank-based fusion or per-query min-max scaling would lose that).

How the weights were chosen (``bench/semantic.py`` prints every figure; MRR of the hybrid
ranking as tuning / blind / held-out English sets): tuned on ``tests/data/semantic_eval.json``
alone; the blind set (``semantic_eval_blind.json``, written by someone else) and the held-out set
(``semantic_eval_heldout.json``) report. Issue 11's third round grew the tuning set by 101
queries written before measuring them (short, misspelt and outcome-naming requests, and 33 near
misses nobody serves); its first 134 queries could not tell blends or thresholds apart.

* Levels (third round): the agent vector 0.7 of the cosine and the closest single text 0.3:
  0.968 / 0.928 / 0.969, against the agent level alone 0.956 / 0.925 / 0.959 and the closest
  text alone 0.945 / 0.887 / 0.924. The second round's blend, 0.4 agent and 0.6 the best
  capability's cosine lifted halfway to its closest example, gave 0.966 / 0.919 / 0.963 and lost
  to the agent level alone on the blind set. The grid (agent, best lifted capability, closest
  text; steps of 0.1, vector weight 0.55 / 0.6 / 0.65) was searched on the tuning set among the
  blends that beat each of their parts on the tuning *and* the blind set, the rule a blend must
  pass; so the blind set took part in the choice. Its overall best on the tuning set, 0.4 / 0.5 /
  0.1 (0.969), fails that rule (blind 0.921); the tie at 0.968 with 0.8 / 0 / 0.2 went to the
  held-out set (0.969 against 0.961). The closest text with the description among the texts
  measured the same (blind 0.929) and needs a description vector of its own.
* Coverage: the agent document alone (blends measured before did not earn their place).
  BM25F-style field weights (the agent text with capability names, descriptions, tags or
  examples repeated up to 3 times) and k1 / b (1.2 / 0.5, 0.75, 0.9; 0.9, 1.5 / 0.75) moved the
  tuning set's hybrid MRR by at most one query (first round's 134 queries): not taken.
* ``vector_weight`` 0.6: the tuning grid 0.5 / 0.55 / 0.6 / 0.65 / 0.7 gave 0.959 / 0.965 /
  **0.968** / 0.964 / 0.958 (held-out rises to 0.977 at 0.7, blind falls to 0.920). Hybrid
  against its parts (vector / lexical): tuning 0.968 vs 0.956 / 0.830, blind 0.928 vs 0.899 /
  0.767, held-out 0.969 vs 0.973 / 0.735 (vector alone is one query ahead there).
* Example requests count in ``closest``; ``example_weight`` 0.5 now only lifts a capability by its
  closest example when the matched capability is chosen (capability@1 0.933 / 0.843 / 0.911,
  without the lift 0.933 / 0.836 / 0.911; the ranking is the same).
* Request openings stripped for the embedder (+0.002 / +0.002 / 0); without spelling: 0.964 / 0.922 / 0.953.
* Fusion: reciprocal-rank fusion (k 10) and per-query z-score or min-max normalisation before
  the blend, vector shares 0.5-0.9 (third round), stayed below the linear blend on the tuning and
  the blind set (at best z-score at 0.9: 0.966 / 0.923 / 0.973), and give up the absolute score
  the router's threshold needs; so did mean-centring and a CSLS-style hubness penalty.

Refusal thresholds: :mod:`semantic.results`; what is held per owner: :mod:`semantic.holdings`.

Several encoders may be held (:mod:`semantic.encoders`, :mod:`semantic.blend`: MiniLM and
multilingual USE by default); a query mostly in CJK leaves the English-only MiniLM out.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from enum import Enum

import numpy as np

from .blend import (
    DEFAULT_CJK_VECTOR_WEIGHT,
    DEFAULT_ENCODER_WEIGHTS,
    DEFAULT_ENCODERS,
    QueryVectors,
    bounded_query,
    default_embedders,
    default_encoder_weights,
    embeddable,
    encode_query,
    encoder_shares,
)
from .documents import DEFAULT_TEXT_FORMAT, Document, TextFormat, embedding_query
from .embedder import Embedder
from .encoders import packaged_model_path
from .errors import EmbedderUnavailable, SearchClosedError
from .holdings import Holdings
from .index import one_blas_thread
from .lexical import DEFAULT_B, DEFAULT_BIGRAMS, DEFAULT_K1, mostly_cjk
from .ranking import QuerySignals, Ranking, SearchHit, Weights, best_cosines, candidate_pool, rank_owners
from .results import (
    SUGGESTED_MIN_SCORE_HYBRID,
    SUGGESTED_MIN_SCORE_HYBRID_CJK,
    SUGGESTED_MIN_SCORE_LEXICAL,
    SearchMode,
    SearchResult,
    SearchTimings,
    suggested_min_score,
)
from .spelling import read_vocabulary_file

__all__ = [
    "SemanticSearch",
    "SearchHit",
    "SearchResult",
    "SearchMode",
    "Ranking",
    "SearchState",
    "SearchTimings",
    "DEFAULT_VECTOR_WEIGHT",
    "DEFAULT_AGENT_VECTOR_WEIGHT",
    "DEFAULT_AGENT_LEXICAL_WEIGHT",
    "DEFAULT_EXAMPLE_WEIGHT",
    "MAX_K",
    "DEFAULT_ENCODERS",
    "DEFAULT_ENCODER_WEIGHTS",
    "default_embedders",
    "default_encoder_weights",
    "SUGGESTED_MIN_SCORE_HYBRID",
    "SUGGESTED_MIN_SCORE_HYBRID_CJK",
    "SUGGESTED_MIN_SCORE_LEXICAL",
    "suggested_min_score",
]

logger = logging.getLogger(__name__)

DEFAULT_VECTOR_WEIGHT = 0.6
DEFAULT_AGENT_VECTOR_WEIGHT = 0.7
DEFAULT_AGENT_LEXICAL_WEIGHT = 1.0
DEFAULT_EXAMPLE_WEIGHT = 0.5
MAX_K = 1_000
# Owners whose capabilities and examples a hybrid query reads at 10,000 capabilities and more
# (bench.semantic: the same top 10 as reading every owner for every tuning query).
DEFAULT_CANDIDATE_POOL = 512
class SearchState(Enum):
    """Lifecycle of a :class:`SemanticSearch`."""

    NEW = "new"
    READY = "ready"
    CLOSED = "closed"


class SemanticSearch:
    """Owner-grouped hybrid (vector + BM25) search over agent documents, on two levels.

    Config (keyword-only):
      * ``embedder``: the :class:`Embedder` to use; ``None`` builds the default one when
        ``semantic_enabled``. The facade closes an embedder it built, not one passed in.
      * ``semantic_enabled``: ``False`` forces lexical mode (no torch needed at all).
      * ``vector_weight``: the share of cosine against BM25 coverage (module docstring);
        ``cjk_vector_weight`` that of a query mostly in CJK script (None: ``vector_weight``).
      * ``candidate_pool``: with more owners than this, a hybrid query's single texts are read
        for the pool's owners alone (:func:`~semantic.ranking.candidate_pool`); None: every owner.
      * ``agent_vector_weight``, ``agent_lexical_weight``: the share of the agent-level document
        in an owner's cosine and in its BM25 coverage (0: best capability alone, 1: the agent
        document alone); the matched capability is named either way.
      * ``example_weight``: how much a capability's closest example request can lift its cosine
        (0: examples only reach BM25; see :mod:`semantic.ranking`).
      * ``correct_spelling``: rewrite likely typos of a query to the indexed word one edit away
        (:mod:`semantic.spelling`) before ranking; ``SearchResult.corrected_query`` says so.
      * ``strip_request_openings``: the embedder sees a query without its request opening ("could
        you", "I need someone to", :func:`~semantic.documents.embedding_query`); BM25 sees it whole.
      * ``text_format``: how capability documents are flattened for the embedder.
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
        embedders: Sequence[Embedder] | None = None,
        encoder_weights: Sequence[float] | None = None,
        semantic_enabled: bool = True,
        vector_weight: float = DEFAULT_VECTOR_WEIGHT,
        cjk_vector_weight: float | None = DEFAULT_CJK_VECTOR_WEIGHT,
        candidate_pool: int | None = DEFAULT_CANDIDATE_POOL,
        agent_vector_weight: float = DEFAULT_AGENT_VECTOR_WEIGHT,
        agent_lexical_weight: float = DEFAULT_AGENT_LEXICAL_WEIGHT,
        example_weight: float = DEFAULT_EXAMPLE_WEIGHT,
        correct_spelling: bool = True,
        strip_request_openings: bool = True,
        text_format: TextFormat = DEFAULT_TEXT_FORMAT,
        bm25_k1: float = DEFAULT_K1,
        bm25_b: float = DEFAULT_B,
        bm25_bigrams: bool = DEFAULT_BIGRAMS,
    ) -> None:
        self._weights = Weights(vector=vector_weight, agent_vector=agent_vector_weight,
                                agent_lexical=agent_lexical_weight, example=example_weight)
        self._cjk_weights = self._weights if cjk_vector_weight is None else replace(self._weights,
                                                                                    vector=cjk_vector_weight)
        if candidate_pool is not None and candidate_pool < 1:
            raise ValueError(f"candidate_pool must be >= 1 or None, got {candidate_pool}")
        self._candidate_pool = candidate_pool
        self._holdings = Holdings(text_format=text_format, bm25_k1=bm25_k1, bm25_b=bm25_b, bm25_bigrams=bm25_bigrams)
        self._semantic_enabled = semantic_enabled
        if embedder is not None and embedders is not None:
            raise ValueError("pass either embedder= or embedders=, not both")
        given = [embedder] if embedder is not None else list(embedders) if embedders is not None else None
        self._owns_embedder = given is None and semantic_enabled
        self._embedders: list[Embedder] = (given if given is not None else default_embedders()) if semantic_enabled else []
        if encoder_weights is None:
            encoder_weights = default_encoder_weights(self._embedders)
        if len(encoder_weights) != len(self._embedders) and self._embedders:
            raise ValueError(f"{len(encoder_weights)} encoder weights for {len(self._embedders)} embedders")
        self._shares = encoder_shares(encoder_weights) if self._embedders else ()
        self._correct_spelling = correct_spelling
        self._strip_request_openings = strip_request_openings
        self._mode = SearchMode.LEXICAL
        self._state = SearchState.NEW
        self._start_lock = asyncio.Lock()
        self.unavailable_reason: str | None = None if semantic_enabled else "disabled by config (semantic_enabled=False)"
        self._owner_generation: dict[str, int] = {}
        self._upserts_in_flight: dict[str, int] = {}
        self._generation = 0

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def mode(self) -> SearchMode:
        """``hybrid`` once the embedder is loaded, ``lexical`` otherwise."""
        return self._mode

    @property
    def suggested_threshold(self) -> float:
        """The score a top hit of the mode's default ranking needs (:func:`suggested_min_score`);
        a single result's own is :attr:`SearchResult.suggested_threshold`."""
        return suggested_min_score(self._mode)

    @property
    def state(self) -> SearchState:
        return self._state

    @property
    def embedder(self) -> Embedder | None:
        """The first of :attr:`embedders` (None without any)."""
        return self._embedders[0] if self._embedders else None

    @property
    def embedders(self) -> list[Embedder]:
        """The embedders whose vectors rank (those that loaded, once started), each model's apart."""
        return list(self._embedders)

    async def __aenter__(self) -> SemanticSearch:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Load the embedders (if enabled), side by side. Idempotent; never raises for a missing
        model: one that cannot load is left out (and named in :attr:`unavailable_reason`), and
        without any the facade serves lexically."""
        async with self._start_lock:
            if self._state is SearchState.CLOSED:
                raise SearchClosedError("the search facade was closed; create a new one")
            if self._state is SearchState.READY:
                return
            if self._embedders:
                await self._load_embedders()
            if self._embedders:
                # Nothing is indexed yet: every mutation starts the facade first.
                self._holdings.attach_vectors([embedder.dimension for embedder in self._embedders])
                self._mode = SearchMode.HYBRID
                # An embedder without a word list (a stand-in, a tokenizer without vocabulary)
                # leaves spelling correction off rather than guessing at typos.
                for embedder in self._embedders:
                    known_words = getattr(embedder, "known_words", None)
                    words = known_words() if callable(known_words) else None
                    if words:
                        break
                self._holdings.speller.set_dictionary(words)
            if self._mode is SearchMode.LEXICAL and self._correct_spelling:
                # No model loaded: the packaged model's word list still tells typos, if installed.
                self._holdings.speller.set_dictionary(_packaged_dictionary())
            self._state = SearchState.READY

    async def _load_embedders(self) -> None:
        outcomes = await asyncio.gather(*(embedder.load() for embedder in self._embedders), return_exceptions=True)
        kept, shares, reasons = [], [], []
        for embedder, share, outcome in zip(self._embedders, self._shares, outcomes):
            if isinstance(outcome, EmbedderUnavailable):
                reasons.append(str(outcome))
                logger.warning("semantic search runs without %s: %s", getattr(embedder, "model_id", "a model"),
                               outcome)
                if self._owns_embedder:
                    await embedder.aclose()
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                kept.append(embedder)
                shares.append(share)
        self._embedders = kept
        self._shares = encoder_shares(shares) if kept else ()
        if reasons:
            self.unavailable_reason = "; ".join(reasons)
            if not kept:
                logger.warning("semantic search runs lexical-only")

    async def aclose(self) -> None:
        """Close the embedders if this facade built them. Idempotent."""
        if self._state is SearchState.CLOSED:
            return
        self._state = SearchState.CLOSED
        if self._owns_embedder:
            for embedder in self._embedders:
                await embedder.aclose()

    async def _ensure_started(self) -> None:
        if self._state is SearchState.CLOSED:
            raise SearchClosedError("the search facade was closed; create a new one")
        if self._state is SearchState.NEW:
            await self.start()

    # -- mutations -------------------------------------------------------------------------

    def __len__(self) -> int:
        """Number of indexed documents (as upserted; agent-level texts not counted)."""
        return self._holdings.document_count

    def owners(self) -> list[str]:
        return self._holdings.owners()

    def documents_of(self, owner_id: str) -> list[Document]:
        return self._holdings.documents_of(owner_id)

    def embedding_texts(self, documents: Sequence[Document]) -> list[str]:
        """The texts this facade encodes for one owner's ``documents`` (capabilities, their
        example requests, then the descriptions; the agent vector is their mean): what a peer's
        vector cache must hold for the owner to cost no encoding."""
        return self._holdings.embedding_texts(documents)

    async def upsert_owner(self, owner_id: str, documents: Sequence[Document]) -> None:
        """Replace every document of ``owner_id`` with ``documents`` (an empty list removes it).

        Raises :class:`InvalidDocumentError` if a document names another owner, ids repeat, or
        an id already belongs to another owner; the embedder's errors propagate.
        """
        await self.upsert_owners({owner_id: documents})

    async def upsert_owners(self, documents_by_owner: Mapping[str, Sequence[Document]]) -> None:
        """Bulk :meth:`upsert_owner`: all new texts are encoded together (faster for snapshots)."""
        await self._ensure_started()
        holdings = self._holdings
        for owner_id, documents in documents_by_owner.items():
            holdings.validate(owner_id, documents)
        # Each upsert takes a generation per owner; a later upsert or removal of that owner
        # during our await takes a newer one, and our now-stale documents are dropped.
        generations: dict[str, int] = {}
        for owner_id in documents_by_owner:
            self._generation += 1
            generations[owner_id] = self._owner_generation[owner_id] = self._generation
            self._upserts_in_flight[owner_id] = self._upserts_in_flight.get(owner_id, 0) + 1
        try:
            texts_by_owner = {owner_id: holdings.embedding_texts(documents)
                              for owner_id, documents in documents_by_owner.items()}
            vectors = await self._encode([text for texts in texts_by_owner.values() for text in texts])
            offset = 0
            for owner_id, documents in documents_by_owner.items():
                count = len(texts_by_owner[owner_id])
                owner_vectors = None if vectors is None else [model[offset : offset + count] for model in vectors]
                offset += count
                if self._owner_generation.get(owner_id) != generations[owner_id]:
                    continue
                holdings.validate(owner_id, documents)  # another owner may have taken an id meanwhile
                holdings.replace(owner_id, documents, owner_vectors)
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
        return self._holdings.remove(owner_id)

    async def _encode(self, texts: Sequence[str]) -> list[np.ndarray] | None:
        if self._mode is not SearchMode.HYBRID or not self._embedders or not texts:
            return None
        return list(await asyncio.gather(*(embedder.encode(texts) for embedder in self._embedders)))

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
        (evaluation); in lexical mode every ranking is lexical, and so is the hybrid ranking of a
        query mostly in Chinese, Japanese or Korean when the model is English-only
        (:attr:`Embedder.english_only`, the packaged model): ``SearchResult.ranking`` says so.
        Raises ``ValueError`` for ``k`` outside 1..MAX_K and the embedder's errors.
        """
        if not 1 <= k <= MAX_K:
            raise ValueError(f"k must be within 1..{MAX_K}, got {k}")
        await self._ensure_started()
        chosen = (Ranking(ranking) if ranking is not None else Ranking.HYBRID) if self._mode is SearchMode.HYBRID \
            else Ranking.LEXICAL
        if not query.strip() or not self._holdings.owner_count:
            return SearchResult(query, self._mode, chosen, [])

        encode_started = time.perf_counter()
        bounded = bounded_query(query)
        searched = self._holdings.speller.correct(bounded) if self._correct_spelling else bounded
        vectors = QueryVectors(())
        if chosen is not Ranking.LEXICAL and self._holdings.models:
            embedded = embeddable(embedding_query(searched) if self._strip_request_openings else searched)
            vectors = await encode_query(self._embedders, self._shares, embedded)
            if not vectors and chosen is Ranking.VECTOR:  # the diagnostic ranking: every model, read or not
                vectors = await encode_query(self._embedders, self._shares, embedded, every_model=True)
            if not vectors:  # no model reads this query (nor is any free): only its words rank
                chosen = Ranking.LEXICAL
        rank_started = time.perf_counter()
        # No await from here on: the indexes cannot change under the ranking.
        hits = self._rank(searched, vectors, k, chosen, allow)
        finished = time.perf_counter()
        timings = SearchTimings(
            encode_ms=(rank_started - encode_started) * 1000.0,
            rank_ms=(finished - rank_started) * 1000.0,
        )
        return SearchResult(query, self._mode, chosen, hits, timings,
                            corrected_query=searched if searched != query else None, mostly_cjk=mostly_cjk(bounded))

    def _rank(self, query: str, vectors: QueryVectors, k: int, ranking: Ranking,
              allow: Callable[[str], bool] | None, *, pooled: bool = True) -> list[SearchHit]:
        holdings = self._holdings
        if pooled and self._candidate_pool and allow is not None:  # a fallback asks no owner twice
            allow = functools.lru_cache(maxsize=None)(allow)
        weights = self._cjk_weights if mostly_cjk(query) else self._weights
        agent_lexical = holdings.agent_lexical.score(query) if ranking is not Ranking.VECTOR else None
        cosines: tuple[np.ndarray | None, ...] = (None, None, None)
        pool = None
        if vectors and ranking is not Ranking.LEXICAL:
            # Each model's share folded into its query vector, the models' products summed.
            models = [holdings.models[position] for position, _, _ in vectors.parts]
            queries = [(model, model.agents.unit_query(vector) * np.float32(share))
                       for model, (_, share, vector) in zip(models, vectors.parts)]
            with one_blas_thread():
                agents = _summed([model.agents.products(vector) for model, vector in queries])
                if pooled and self._candidate_pool and ranking is Ranking.HYBRID:
                    pool = candidate_pool(holdings.layout(), holdings.example_rows(), agents, agent_lexical, weights,
                                          self._candidate_pool)
                rows = (None, None) if pool is None else (pool.capability_rows, pool.example_rows)
                capabilities = _summed([model.capabilities.products(vector, rows[0]) for model, vector in queries])
                examples = _summed([model.examples.products(vector, rows[1]) for model, vector in queries])
            cosines = (agents, capabilities, best_cosines(capabilities, examples, holdings.example_rows()))
        capability_lexical = None if agent_lexical is None else holdings.capability_lexical.score(query)
        signals = QuerySignals(*cosines, agent_lexical=agent_lexical,  # type: ignore[arg-type]
                               capability_lexical=capability_lexical)
        hits = rank_owners(holdings.layout(), signals, weights=weights, ranking=ranking, k=k, allow=allow,
                           capability_of=holdings.capability_of, candidates=None if pool is None else pool.owners)
        if pool is not None and len(hits) < k:  # ``allow`` turned most of the pool down: every owner, whole
            return self._rank(query, vectors, k, ranking, allow, pooled=False)
        return hits


def _summed(parts: list[np.ndarray]) -> np.ndarray:
    for part in parts[1:]:
        np.add(parts[0], part, out=parts[0])
    return parts[0]


def _packaged_dictionary() -> frozenset[str] | None:
    """The packaged model's word list (a plain file: no torch needed); None when not installed."""
    try:
        return read_vocabulary_file(packaged_model_path() / "vocab.txt")
    except EmbedderUnavailable:
        return None
