"""Errors raised by the semantic package.

Hierarchy::

    SemanticError                 base of everything raised here
    ├── EmbedderUnavailable       torch / sentence-transformers missing or the model cannot load
    ├── EmbeddingError            the loaded model failed while encoding
    ├── EncoderBusy               too many query encodes wait already (the query is ranked without it)
    ├── VectorCacheError          the vector cache backend failed (e.g. Redis unreachable)
    ├── InvalidVectorError        a vector has the wrong shape, is not finite or is all zeros
    ├── InvalidDocumentError      a document is malformed or does not belong to its owner
    └── SearchClosedError         the component was used after ``aclose()``
"""

from __future__ import annotations

__all__ = [
    "SemanticError",
    "EmbedderUnavailable",
    "EmbeddingError",
    "EncoderBusy",
    "VectorCacheError",
    "InvalidVectorError",
    "InvalidDocumentError",
    "SearchClosedError",
]


class SemanticError(Exception):
    """Base class of every error raised by the semantic package."""


class EmbedderUnavailable(SemanticError):
    """The embedding model cannot be used: its libraries are missing or the model failed to load."""


class EmbeddingError(SemanticError):
    """The embedding model was loaded but failed while encoding texts."""


class EncoderBusy(SemanticError):
    """So many query encodes already wait for the model that one more would only add to the queue."""


class VectorCacheError(SemanticError):
    """The vector cache backend failed; callers may treat the cache as empty and carry on."""


class InvalidVectorError(SemanticError, ValueError):
    """A vector has the wrong dimension, is not finite, or has zero length."""


class InvalidDocumentError(SemanticError, ValueError):
    """A document is malformed or its owner does not match the owner it is upserted under."""


class SearchClosedError(SemanticError):
    """The embedder or search facade was used after ``aclose()``."""
