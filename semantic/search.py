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
* Request openings stripped for the embedder: 0.966 -> 0.968 / 0.926 -> 0.928 / 0.969 both.
* Example requests count in ``closest``; ``example_weight`` 0.5 now only lifts a capability by its
  closest example when the matched capability is chosen (capability@1 0.933 / 0.843 / 0.911,
  without the lift 0.933 / 0.836 / 0.911; the ranking is the same).
* Spelling correction (:mod:`semantic.spelling`): without it 0.964 / 0.922 / 0.953.
* Fusion: reciprocal-rank fusion (k 10) and per-query z-score or min-max normalisation before
  the blend, vector shares 0.5-0.9 (third round), stayed below the linear blend on the tuning and
  the blind set (at best z-score at 0.9: 0.966 / 0.923 / 0.973), and give up the absolute score
  the router's threshold needs; so did mean-centring the vectors and
  a hubness penalty (each agent's mean cosine to its k nearest agents, CSLS-style: 0.953-0.962 /
  0.905-0.910 on the first round's sets).

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

The packaged model reads English only: a query mostly in Chinese, Japanese or Korean is ranked
lexically (CJK character bigrams) even in hybrid mode, because that model's cosines between
such texts are noise (0.3 and more between unrelated ones).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from .documents import (
    DEFAULT_TEXT_FORMAT,
    Document,
    TextFormat,
    agent_lexical_text,
    embedding_query,
    embedding_text,
    lexical_text,
)
from .embedder import Embedder, packaged_model_path
from .errors import EmbedderUnavailable, InvalidDocumentError, SearchClosedError
from .index import VectorIndex
from .lexical import DEFAULT_B, DEFAULT_BIGRAMS, DEFAULT_K1, LexicalIndex, mostly_cjk
from .ranking import (
    ExampleGroups,
    OwnerLayout,
    QuerySignals,
    Ranking,
    SearchHit,
    Weights,
    best_cosines,
    rank_owners,
)
from .spelling import SpellingCorrector, read_vocabulary_file

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
    "SUGGESTED_MIN_SCORE_HYBRID",
    "SUGGESTED_MIN_SCORE_LEXICAL",
    "suggested_min_score",
]

logger = logging.getLogger(__name__)

DEFAULT_VECTOR_WEIGHT = 0.6
DEFAULT_AGENT_VECTOR_WEIGHT = 0.7
DEFAULT_AGENT_LEXICAL_WEIGHT = 1.0
DEFAULT_EXAMPLE_WEIGHT = 0.5
MAX_K = 1_000
SUGGESTED_MIN_SCORE_HYBRID = 0.205
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


class SearchState(Enum):
    """Lifecycle of a :class:`SemanticSearch`."""

    NEW = "new"
    READY = "ready"
    CLOSED = "closed"


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

    @property
    def best(self) -> SearchHit | None:
        return self.hits[0] if self.hits else None

    @property
    def suggested_threshold(self) -> float | None:
        """The score :attr:`best` needs to be trusted, by :attr:`ranking` (a mostly-Chinese query
        is ranked lexically even in hybrid mode); None for the diagnostic vector ranking."""
        return None if self.ranking is Ranking.VECTOR else suggested_min_score(self.ranking)


class SemanticSearch:
    """Owner-grouped hybrid (vector + BM25) search over agent documents, on two levels.

    Config (keyword-only):
      * ``embedder``: the :class:`Embedder` to use; ``None`` builds the default one when
        ``semantic_enabled``. The facade closes an embedder it built, not one passed in.
      * ``semantic_enabled``: ``False`` forces lexical mode (no torch needed at all).
      * ``vector_weight``: the share of cosine against BM25 coverage (module docstring).
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
        semantic_enabled: bool = True,
        vector_weight: float = DEFAULT_VECTOR_WEIGHT,
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
        self._text_format = TextFormat(text_format)
        self._semantic_enabled = semantic_enabled
        self._owns_embedder = embedder is None and semantic_enabled
        self._embedder = embedder if embedder is not None or not semantic_enabled else Embedder()
        # Capability documents are keyed by doc id, agent-level documents by owner id. Both (and
        # the speller) read a replaced or removed text back from the documents held here
        # (text_of) instead of keeping every document's terms: ~460 B per agent at 30,000.
        self._capability_lexical = LexicalIndex(k1=bm25_k1, b=bm25_b, bigrams=bm25_bigrams,
                                                text_of=self._capability_text)
        self._agent_lexical = LexicalIndex(k1=bm25_k1, b=bm25_b, bigrams=bm25_bigrams, text_of=self._agent_text)
        self._capability_vectors: VectorIndex | None = None
        self._agent_vectors: VectorIndex | None = None
        # Example requests: one vector each, keyed "<doc_id>\n<n>"; doc id -> its example keys.
        self._example_vectors: VectorIndex | None = None
        self._example_keys: dict[str, tuple[str, ...]] = {}
        # Bumped by every mutation (vector rows and BM25 slots move): invalidates the caches below.
        self._version = 0
        self._example_rows_cache: tuple[int, ExampleGroups] | None = None
        self._layout_cache: tuple[int, OwnerLayout] | None = None
        self._correct_spelling = correct_spelling
        self._strip_request_openings = strip_request_openings
        self._speller = SpellingCorrector(text_of=self._agent_text)
        self._mode = SearchMode.LEXICAL
        self._state = SearchState.NEW
        self._start_lock = asyncio.Lock()
        self.unavailable_reason: str | None = None if semantic_enabled else "disabled by config (semantic_enabled=False)"
        # Per owner its documents, in order; by doc id those that are not an agent description
        # of the conventional id ("<owner_id>#"): such a description is held as its title and
        # text alone (_Description), its id and Document made when read (~160 B per agent).
        self._owner_docs: dict[str, tuple[Document | _Description, ...]] = {}
        self._documents: dict[str, Document] = {}
        self._document_count = 0
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
                    self._capability_vectors = VectorIndex(dimension=self._embedder.dimension)
                    self._agent_vectors = VectorIndex(dimension=self._embedder.dimension)
                    self._example_vectors = VectorIndex(dimension=self._embedder.dimension)
                    self._mode = SearchMode.HYBRID
                    # An embedder without a word list (a stand-in, a tokenizer without vocabulary)
                    # leaves spelling correction off rather than guessing at typos.
                    known_words = getattr(self._embedder, "known_words", None)
                    self._speller.set_dictionary(known_words() if callable(known_words) else None)
            if self._mode is SearchMode.LEXICAL and self._correct_spelling:
                # No model loaded: the packaged model's word list still tells typos, if installed.
                self._speller.set_dictionary(_packaged_dictionary())
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
        """Number of indexed documents (as upserted; agent-level texts not counted)."""
        return self._document_count

    def owners(self) -> list[str]:
        return list(self._owner_docs)

    def documents_of(self, owner_id: str) -> list[Document]:
        return [held if isinstance(held, Document) else held.document(owner_id)
                for held in self._owner_docs.get(owner_id, ())]

    def embedding_texts(self, documents: Sequence[Document]) -> list[str]:
        """The texts this facade encodes for one owner's ``documents`` (capabilities, their
        example requests, then the descriptions; the agent vector is their mean): what a peer's
        vector cache must hold for the owner to cost no encoding."""
        capabilities = [document for document in documents if document.capability is not None]
        texts = [embedding_text(document, self._text_format) for document in capabilities]
        texts.extend(example for document in capabilities for example in document.examples)
        texts.extend(embedding_text(document, TextFormat.NAME_DESCRIPTION) for document in documents
                     if document.capability is None)
        return texts

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
            texts_by_owner = {owner_id: self.embedding_texts(documents)
                              for owner_id, documents in documents_by_owner.items()}
            vectors = await self._encode([text for texts in texts_by_owner.values() for text in texts])
            offset = 0
            for owner_id, documents in documents_by_owner.items():
                count = len(texts_by_owner[owner_id])
                owner_vectors = None if vectors is None else vectors[offset : offset + count]
                offset += count
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
        self._forget_agent(owner_id)  # first: its text is read back from the documents
        documents = self.documents_of(owner_id)
        self._document_count -= len(self._owner_docs.pop(owner_id, ()))
        for document in documents:
            self._forget(document.doc_id)
        return bool(documents)

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
            other = self._owner_of(document.doc_id)
            if other is not None and other != owner_id:
                raise InvalidDocumentError(
                    f"doc_id {document.doc_id!r} already belongs to {other!r}; "
                    f"doc ids must be unique across owners (Document.for_capability builds such ids)"
                )

    def _owner_of(self, doc_id: str) -> str | None:
        """The owner holding a document of id ``doc_id``, if one does."""
        held = self._documents.get(doc_id)
        if held is not None:
            return held.owner_id
        owner_id = doc_id[:-1]  # a description held without its id has the id "<owner_id>#"
        if doc_id.endswith("#") and any(isinstance(held, _Description) for held in self._owner_docs.get(owner_id, ())):
            return owner_id
        return None

    async def _encode(self, texts: Sequence[str]) -> np.ndarray | None:
        if self._mode is not SearchMode.HYBRID or self._embedder is None or not texts:
            return None
        return await self._embedder.encode(texts)

    def _replace(self, owner_id: str, documents: Sequence[Document], vectors: np.ndarray | None) -> None:
        # The lexical indexes read a text they replace back from the documents held (text_of):
        # each is re-indexed before the documents it was built from are dropped or replaced.
        self._version += 1
        new_ids = {document.doc_id for document in documents}
        agent_text = agent_lexical_text(documents)
        if documents:
            self._agent_lexical.upsert(owner_id, agent_text)
            self._speller.upsert(owner_id, agent_text)
        else:
            self._forget_agent(owner_id)
        for document in self.documents_of(owner_id):
            if document.doc_id not in new_ids:
                self._forget(document.doc_id)
        self._document_count += len(documents) - len(self._owner_docs.get(owner_id, ()))
        if not documents:
            self._owner_docs.pop(owner_id, None)
            return
        for document in documents:
            if document.capability is not None:
                self._capability_lexical.upsert(document.doc_id, lexical_text(document))
            else:  # a description is part of the agent-level document only
                self._capability_lexical.remove(document.doc_id)
                if self._capability_vectors is not None:
                    self._capability_vectors.remove(document.doc_id)
            self._documents[document.doc_id] = document  # the text the capability index now holds
        self._owner_docs[owner_id] = tuple(map(_held, documents))
        for document, held in zip(documents, self._owner_docs[owner_id]):
            if held is not document:  # a description held without its id
                del self._documents[document.doc_id]
        if vectors is not None:
            self._store_vectors(owner_id, documents, vectors)

    def _capability_text(self, doc_id: str) -> str:
        return lexical_text(self._documents[doc_id])

    def _agent_text(self, owner_id: str) -> str:
        return agent_lexical_text(self.documents_of(owner_id))

    def _store_vectors(self, owner_id: str, documents: Sequence[Document], vectors: np.ndarray) -> None:
        # Rows come in embedding_texts order: capabilities, then their examples, then descriptions.
        if self._capability_vectors is None or self._agent_vectors is None or self._example_vectors is None:
            return
        self._version += 1
        capabilities = [document for document in documents if document.capability is not None]
        if capabilities:
            self._capability_vectors.upsert_many([document.doc_id for document in capabilities],
                                                 vectors[: len(capabilities)])
        row = len(capabilities)
        for document in capabilities:
            self._forget_examples(document.doc_id)
            if document.examples:
                keys = tuple(f"{document.doc_id}\n{number}" for number in range(len(document.examples)))
                self._example_vectors.upsert_many(keys, vectors[row : row + len(keys)])
                self._example_keys[document.doc_id] = keys
                row += len(keys)
        self._agent_vectors.upsert(owner_id, agent_vector(vectors))

    def _forget_examples(self, doc_id: str) -> None:
        keys = self._example_keys.pop(doc_id, ())
        if keys and self._example_vectors is not None:
            self._example_vectors.remove_many(keys)
        self._version += 1

    def _forget_agent(self, owner_id: str) -> None:
        self._version += 1
        self._agent_lexical.remove(owner_id)
        self._speller.remove(owner_id)
        if self._agent_vectors is not None:
            self._agent_vectors.remove(owner_id)

    def _forget(self, doc_id: str) -> None:
        self._capability_lexical.remove(doc_id)  # first: its text is read back from the document
        self._documents.pop(doc_id, None)
        self._forget_examples(doc_id)  # bumps _version: capability rows move on removal too
        if self._capability_vectors is not None:
            self._capability_vectors.remove(doc_id)

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
        if self._mode is SearchMode.HYBRID:
            chosen = Ranking(ranking) if ranking is not None else Ranking.HYBRID
            if chosen is Ranking.HYBRID and self._unreadable(query):
                chosen = Ranking.LEXICAL
        else:
            chosen = Ranking.LEXICAL
        if not query.strip() or not self._owner_docs:
            return SearchResult(query, self._mode, chosen, [])

        encode_started = time.perf_counter()
        searched = self._speller.correct(query) if self._correct_spelling else query
        query_vector: np.ndarray | None = None
        if chosen is not Ranking.LEXICAL and self._embedder is not None and self._agent_vectors is not None:
            embedded = embedding_query(searched) if self._strip_request_openings else searched
            query_vector = (await self._embedder.encode([embedded]))[0]
        rank_started = time.perf_counter()
        # No await from here on: the indexes cannot change under the ranking.
        hits = self._rank(searched, query_vector, k, chosen, allow)
        finished = time.perf_counter()
        timings = SearchTimings(
            encode_ms=(rank_started - encode_started) * 1000.0,
            rank_ms=(finished - rank_started) * 1000.0,
        )
        return SearchResult(query, self._mode, chosen, hits, timings,
                            corrected_query=searched if searched != query else None)

    def _capability_cosines(self, query_vector: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Capability cosines, and each capability's or its closest example request's, whichever
        is higher (:func:`~semantic.ranking.best_cosines`), by capability row."""
        if self._capability_vectors is None:
            raise SearchClosedError("no capability vectors: the facade is not in hybrid mode")
        cosines = self._capability_vectors.similarities(query_vector)
        if self._example_vectors is None or not len(self._example_vectors):
            return cosines, cosines
        return cosines, best_cosines(cosines, self._example_vectors.similarities(query_vector), self._example_rows())

    def _example_rows(self) -> ExampleGroups:
        # Rebuilt only after a vector mutation (registrations, not heartbeats, change documents).
        if self._example_rows_cache is None or self._example_rows_cache[0] != self._version:
            capability_rows = [self._capability_vectors.row_of(key.partition("\n")[0])  # type: ignore[union-attr]
                           for key in self._example_vectors.ids()]  # type: ignore[union-attr]
            rows = np.fromiter((-1 if row is None else row for row in capability_rows), dtype=np.int64,
                               count=len(capability_rows))
            if (rows < 0).any():
                raise InvalidDocumentError("an example vector outlived its capability (internal bookkeeping error)")
            self._example_rows_cache = (self._version, ExampleGroups.of(rows))
        return self._example_rows_cache[1]

    def _unreadable(self, query: str) -> bool:
        # An English-only model maps Chinese text to vectors that all look alike (cosines of 0.3
        # and more between unrelated texts): for such a query only the words can rank.
        embedder = self._embedder
        return embedder is not None and getattr(embedder, "english_only", False) and mostly_cjk(query)

    def _rank(
        self,
        query: str,
        query_vector: np.ndarray | None,
        k: int,
        ranking: Ranking,
        allow: Callable[[str], bool] | None,
    ) -> list[SearchHit]:
        agent_cosines = capability_cosines = capability_best = None
        if query_vector is not None and self._agent_vectors is not None and self._capability_vectors is not None:
            agent_cosines = self._agent_vectors.similarities(query_vector)
            capability_cosines, capability_best = self._capability_cosines(query_vector)
        lexical = ranking is not Ranking.VECTOR
        signals = QuerySignals(
            agent_cosines=agent_cosines,
            capability_cosines=capability_cosines,
            capability_best=capability_best,
            agent_lexical=self._agent_lexical.score(query) if lexical else None,
            capability_lexical=self._capability_lexical.score(query) if lexical else None,
        )
        return rank_owners(self._layout(), signals, weights=self._weights, ranking=ranking, k=k, allow=allow,
                           capability_of=self._capability_of)

    def _capability_of(self, doc_id: str) -> str | None:
        held = self._documents.get(doc_id)  # none: a description held without its id
        return None if held is None else held.capability

    def _layout(self) -> OwnerLayout:
        # Rebuilt only after a mutation (registrations, not heartbeats, change documents).
        if self._layout_cache is None or self._layout_cache[0] != self._version:
            agent_vectors, capability_vectors = self._agent_vectors, self._capability_vectors
            layout = OwnerLayout.of(
                _DocIds(self._owner_docs), self._capability_of,
                agent_row=agent_vectors.row_of if agent_vectors is not None else _absent,
                agent_slot=self._agent_lexical.slot_of,
                capability_row=capability_vectors.row_of if capability_vectors is not None else _absent,
                capability_slot=self._capability_lexical.slot_of,
            )
            self._layout_cache = (self._version, layout)
        return self._layout_cache[1]


class _Description:
    """An agent description of the conventional id ``"<owner_id>#"`` as held: its title and text
    (a Document and its id string cost ~160 B more per agent)."""

    __slots__ = ("title", "text")

    def __init__(self, title: str, text: str) -> None:
        self.title = title
        self.text = text

    def document(self, owner_id: str) -> Document:
        return Document.for_description(owner_id=owner_id, title=self.title, description=self.text)


def _held(document: Document) -> Document | _Description:
    """What the facade holds of ``document``: a :class:`_Description` when that is all of it."""
    if (document.capability is None and not document.tags and not document.examples
            and document.doc_id == f"{document.owner_id}#"):
        return _Description(document.title, document.text)
    return document


class _DocIds(Mapping[str, Sequence[str]]):
    """Each owner's doc ids, in order, read from what the facade holds (for the owner layout)."""

    def __init__(self, owner_docs: Mapping[str, tuple[Document | _Description, ...]]) -> None:
        self._owner_docs = owner_docs

    def __getitem__(self, owner_id: str) -> list[str]:
        return [held.doc_id if isinstance(held, Document) else f"{owner_id}#" for held in self._owner_docs[owner_id]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._owner_docs)

    def __len__(self) -> int:
        return len(self._owner_docs)


def _absent(key: str) -> None:
    return None


def agent_vector(vectors: np.ndarray) -> np.ndarray:
    """An agent's vector: the normalised mean of its description's, capabilities' and example
    requests' vectors (each part read whole, where one long passage of them all would run past
    the 128 word pieces the packaged model was trained on)."""
    mean = vectors.mean(axis=0)
    norm = float(np.linalg.norm(mean))
    return mean / norm if norm > 1e-6 else vectors[0]  # parts that cancel out: the first alone


def _packaged_dictionary() -> frozenset[str] | None:
    """The packaged model's word list (a plain file: no torch needed); None when not installed."""
    try:
        return read_vocabulary_file(packaged_model_path() / "vocab.txt")
    except EmbedderUnavailable:
        return None
