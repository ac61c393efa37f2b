"""What a :class:`~semantic.search.SemanticSearch` holds: each owner's documents and the indexes
built from them, kept in step.

Per owner (agent) its documents, in order; from them two BM25 indexes (each capability, keyed by
doc id; one agent-level text of every field, keyed by owner id), the spelling corrector's words,
and, once the embedders are loaded, three vector indexes per model (capabilities, their example
requests, the agent vector: :class:`ModelVectors`), each model's apart. Every model's indexes see
the same upserts and removals in the same order, so a row names the same text in all of them. A mutation replaces or forgets an owner in all of them at once, and the owner
layout the ranking reads (:class:`~semantic.ranking.OwnerLayout`) is rebuilt after it.

The lexical indexes and the speller keep no term list per document: a replaced or removed text
is read back from the documents held here (``text_of``), so each is re-indexed before the
documents it was built from are dropped or replaced (~460 B per agent at 30,000).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from .documents import Document, TextFormat, agent_lexical_text, embedding_text, lexical_text
from .errors import InvalidDocumentError, SearchClosedError
from .index import VectorIndex
from .lexical import LexicalIndex
from .ranking import ExampleGroups, OwnerLayout
from .spelling import SpellingCorrector

__all__ = ["Holdings", "ModelVectors", "agent_vector"]


class ModelVectors:
    """One model's vectors: capabilities by doc id, example requests by example key
    (``"<doc_id>\n<n>"``), agents by owner id."""

    __slots__ = ("capabilities", "examples", "agents")

    def __init__(self, dimension: int) -> None:
        self.capabilities = VectorIndex(dimension=dimension)
        self.examples = VectorIndex(dimension=dimension)
        self.agents = VectorIndex(dimension=dimension)


class Holdings:
    """Each owner's documents and the lexical, spelling and vector indexes built from them.

    Config (keyword-only): ``text_format`` (how capability documents are flattened for the
    embedder), ``bm25_k1``, ``bm25_b``, ``bm25_bigrams`` (:class:`LexicalIndex`). The vector
    indexes exist only after :meth:`attach_vectors`, one :class:`ModelVectors` per model. Not safe for concurrent use: the facade
    mutates it from one event loop, with no await inside a mutation.
    """

    def __init__(self, *, text_format: TextFormat, bm25_k1: float, bm25_b: float, bm25_bigrams: bool) -> None:
        self._text_format = TextFormat(text_format)
        # Capability documents are keyed by doc id, agent-level documents by owner id.
        self.capability_lexical = LexicalIndex(k1=bm25_k1, b=bm25_b, bigrams=bm25_bigrams,
                                               text_of=self._capability_text)
        self.agent_lexical = LexicalIndex(k1=bm25_k1, b=bm25_b, bigrams=bm25_bigrams, text_of=self._agent_text)
        self.speller = SpellingCorrector(text_of=self._agent_text)
        self.models: list[ModelVectors] = []
        # Example requests: one vector each, keyed "<doc_id>\n<n>"; doc id -> its example keys.
        self._example_keys: dict[str, tuple[str, ...]] = {}
        # Bumped by every mutation (vector rows and BM25 slots move): invalidates the caches below.
        self._version = 0
        self._example_rows_cache: tuple[int, ExampleGroups] | None = None
        self._layout_cache: tuple[int, OwnerLayout] | None = None
        # Per owner its documents, in order; by doc id those that are not an agent description
        # of the conventional id ("<owner_id>#"): such a description is held as its title and
        # text alone (_Description), its id and Document made when read (~160 B per agent).
        self._owner_docs: dict[str, tuple[Document | _Description, ...]] = {}
        self._documents: dict[str, Document] = {}
        self._document_count = 0

    def attach_vectors(self, dimensions: Sequence[int]) -> None:
        """Create each model's vector indexes (the embedders are loaded; nothing is indexed yet)."""
        self.models = [ModelVectors(dimension) for dimension in dimensions]

    # The first model's indexes: where the rows the layout reads are (every model's are the same).
    @property
    def capability_vectors(self) -> VectorIndex | None:
        return self.models[0].capabilities if self.models else None

    @property
    def agent_vectors(self) -> VectorIndex | None:
        return self.models[0].agents if self.models else None

    @property
    def example_vectors(self) -> VectorIndex | None:
        return self.models[0].examples if self.models else None

    # -- reading ---------------------------------------------------------------------------

    @property
    def document_count(self) -> int:
        """Number of documents held (as upserted; agent-level texts not counted)."""
        return self._document_count

    @property
    def owner_count(self) -> int:
        return len(self._owner_docs)

    def owners(self) -> list[str]:
        return list(self._owner_docs)

    def documents_of(self, owner_id: str) -> list[Document]:
        return [held if isinstance(held, Document) else held.document(owner_id)
                for held in self._owner_docs.get(owner_id, ())]

    def capability_of(self, doc_id: str) -> str | None:
        held = self._documents.get(doc_id)  # none: a description held without its id
        return None if held is None else held.capability

    def embedding_texts(self, documents: Sequence[Document]) -> list[str]:
        """The texts encoded for one owner's ``documents``: capabilities, their example
        requests, then the descriptions (the agent vector is their mean)."""
        capabilities = [document for document in documents if document.capability is not None]
        texts = [embedding_text(document, self._text_format) for document in capabilities]
        texts.extend(example for document in capabilities for example in document.examples)
        texts.extend(embedding_text(document, TextFormat.NAME_DESCRIPTION) for document in documents
                     if document.capability is None)
        return texts

    def validate(self, owner_id: str, documents: Sequence[Document]) -> None:
        """Raise :class:`InvalidDocumentError` if a document names another owner, ids repeat, or
        an id already belongs to another owner."""
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

    def layout(self) -> OwnerLayout:
        """Where each owner's vector rows and BM25 slots are; rebuilt only after a mutation
        (registrations, not heartbeats, change documents)."""
        if self._layout_cache is None or self._layout_cache[0] != self._version:
            agent_vectors, capability_vectors = self.agent_vectors, self.capability_vectors
            layout = OwnerLayout.of(
                _DocIds(self._owner_docs), self.capability_of,
                agent_row=agent_vectors.row_of if agent_vectors is not None else _absent,
                agent_slot=self.agent_lexical.slot_of,
                capability_row=capability_vectors.row_of if capability_vectors is not None else _absent,
                capability_slot=self.capability_lexical.slot_of,
            )
            self._layout_cache = (self._version, layout)
        return self._layout_cache[1]

    def example_rows(self) -> ExampleGroups:
        """The capability row of each example vector, grouped; rebuilt only after a mutation."""
        if self.capability_vectors is None or self.example_vectors is None:
            raise SearchClosedError("no example vectors: the facade is not in hybrid mode")
        if self._example_rows_cache is None or self._example_rows_cache[0] != self._version:
            capability_rows = [self.capability_vectors.row_of(key.partition("\n")[0])
                               for key in self.example_vectors.ids()]
            rows = np.fromiter((-1 if row is None else row for row in capability_rows), dtype=np.int64,
                               count=len(capability_rows))
            if (rows < 0).any():
                raise InvalidDocumentError("an example vector outlived its capability (internal bookkeeping error)")
            self._example_rows_cache = (self._version, ExampleGroups.of(rows))
        return self._example_rows_cache[1]

    # -- mutations -------------------------------------------------------------------------

    def replace(self, owner_id: str, documents: Sequence[Document], vectors: Sequence[np.ndarray] | None) -> None:
        """Hold ``documents`` (validated) as all of ``owner_id``'s, with each model's vectors in
        :meth:`embedding_texts` order (None: lexical only); an empty list forgets the owner."""
        self._version += 1
        new_ids = {document.doc_id for document in documents}
        agent_text = agent_lexical_text(documents)
        if documents:
            self.agent_lexical.upsert(owner_id, agent_text)
            self.speller.upsert(owner_id, agent_text)
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
                self.capability_lexical.upsert(document.doc_id, lexical_text(document))
            else:  # a description is part of the agent-level document only
                self.capability_lexical.remove(document.doc_id)
                for model in self.models:
                    model.capabilities.remove(document.doc_id)
            self._documents[document.doc_id] = document  # the text the capability index now holds
        self._owner_docs[owner_id] = tuple(map(_held, documents))
        for document, held in zip(documents, self._owner_docs[owner_id]):
            if held is not document:  # a description held without its id
                del self._documents[document.doc_id]
        if vectors is not None:
            self._store_vectors(owner_id, documents, vectors)

    def remove(self, owner_id: str) -> bool:
        """Forget every document of ``owner_id``; returns whether it had any."""
        self._forget_agent(owner_id)  # first: its text is read back from the documents
        documents = self.documents_of(owner_id)
        self._document_count -= len(self._owner_docs.pop(owner_id, ()))
        for document in documents:
            self._forget(document.doc_id)
        return bool(documents)

    def _capability_text(self, doc_id: str) -> str:
        return lexical_text(self._documents[doc_id])

    def _agent_text(self, owner_id: str) -> str:
        return agent_lexical_text(self.documents_of(owner_id))

    def _store_vectors(self, owner_id: str, documents: Sequence[Document], vectors: Sequence[np.ndarray]) -> None:
        # Rows come in embedding_texts order: capabilities, then their examples, then descriptions.
        if len(vectors) != len(self.models):
            raise InvalidDocumentError(f"{len(vectors)} models' vectors for {len(self.models)} models' indexes")
        self._version += 1
        capabilities = [document for document in documents if document.capability is not None]
        capability_ids = [document.doc_id for document in capabilities]
        for model, model_vectors in zip(self.models, vectors):
            if capabilities:
                model.capabilities.upsert_many(capability_ids, model_vectors[: len(capabilities)])
        row = len(capabilities)
        for document in capabilities:
            self._forget_examples(document.doc_id)
            if document.examples:
                keys = tuple(f"{document.doc_id}\n{number}" for number in range(len(document.examples)))
                for model, model_vectors in zip(self.models, vectors):
                    model.examples.upsert_many(keys, model_vectors[row : row + len(keys)])
                self._example_keys[document.doc_id] = keys
                row += len(keys)
        for model, model_vectors in zip(self.models, vectors):
            model.agents.upsert(owner_id, agent_vector(model_vectors))

    def _forget_examples(self, doc_id: str) -> None:
        keys = self._example_keys.pop(doc_id, ())
        if keys:
            for model in self.models:
                model.examples.remove_many(keys)
        self._version += 1

    def _forget_agent(self, owner_id: str) -> None:
        self._version += 1
        self.agent_lexical.remove(owner_id)
        self.speller.remove(owner_id)
        for model in self.models:
            model.agents.remove(owner_id)

    def _forget(self, doc_id: str) -> None:
        self.capability_lexical.remove(doc_id)  # first: its text is read back from the document
        self._documents.pop(doc_id, None)
        self._forget_examples(doc_id)  # bumps _version: capability rows move on removal too
        for model in self.models:
            model.capabilities.remove(doc_id)


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
    """What is held of ``document``: a :class:`_Description` when that is all of it."""
    if (document.capability is None and not document.tags and not document.examples
            and document.doc_id == f"{document.owner_id}#"):
        return _Description(document.title, document.text)
    return document


class _DocIds(Mapping[str, Sequence[str]]):
    """Each owner's doc ids, in order, read from what is held (for the owner layout)."""

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
