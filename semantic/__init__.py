"""Semantic discovery: find agents by a plain-language description of the job.

Imports nothing from the rest of Agent-Reach; a registry node attaches a :class:`SemanticSearch`
through its own small protocol. torch and sentence-transformers are optional: without them (or
with ``semantic_enabled=False``) search runs lexical-only (BM25) and says so (``mode="lexical"``).
"""

from .cache import LayeredVectorCache, MemoryVectorCache, RedisVectorCache, VectorCache
from .documents import (
    DEFAULT_TEXT_FORMAT,
    Document,
    TextFormat,
    embedding_text,
    lexical_text,
)
from .embedder import (
    DEFAULT_MODEL_ID,
    Embedder,
    EmbedderState,
    EmbedderStats,
    packaged_model_path,
)
from .errors import (
    EmbedderUnavailable,
    EmbeddingError,
    InvalidDocumentError,
    InvalidVectorError,
    SearchClosedError,
    SemanticError,
    VectorCacheError,
)
from .index import VectorIndex
from .lexical import LexicalIndex, LexicalScores, tokenize
from .search import (
    DEFAULT_VECTOR_WEIGHT,
    SUGGESTED_MIN_SCORE_HYBRID,
    SUGGESTED_MIN_SCORE_LEXICAL,
    Fusion,
    Ranking,
    SearchHit,
    SearchMode,
    SearchResult,
    SearchState,
    SearchTimings,
    SemanticSearch,
)

__all__ = [
    "SemanticSearch",
    "SearchResult",
    "SearchHit",
    "SearchTimings",
    "SearchMode",
    "SearchState",
    "Ranking",
    "Fusion",
    "DEFAULT_VECTOR_WEIGHT",
    "SUGGESTED_MIN_SCORE_HYBRID",
    "SUGGESTED_MIN_SCORE_LEXICAL",
    "Document",
    "TextFormat",
    "DEFAULT_TEXT_FORMAT",
    "embedding_text",
    "lexical_text",
    "Embedder",
    "EmbedderState",
    "EmbedderStats",
    "DEFAULT_MODEL_ID",
    "packaged_model_path",
    "VectorCache",
    "MemoryVectorCache",
    "RedisVectorCache",
    "LayeredVectorCache",
    "VectorIndex",
    "LexicalIndex",
    "LexicalScores",
    "tokenize",
    "SemanticError",
    "EmbedderUnavailable",
    "EmbeddingError",
    "VectorCacheError",
    "InvalidVectorError",
    "InvalidDocumentError",
    "SearchClosedError",
]
