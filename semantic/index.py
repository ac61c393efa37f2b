"""VectorIndex: exact cosine top-k over a dense float32 matrix of unit vectors.

Exact search is the right tool at registry scale (10^3..10^5 capabilities): one matrix-vector
product over 10k x 384 floats takes about a millisecond, needs no training, and never misses.
Rows live in a pre-allocated matrix that grows by doubling; removal moves the last row into the
hole (swap-remove), so every mutation is O(dimension), never a rebuild.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .errors import InvalidVectorError

__all__ = ["VectorIndex", "DEFAULT_INITIAL_CAPACITY", "one_blas_thread"]

DEFAULT_INITIAL_CAPACITY = 1024
DEFAULT_BLAS_THREADS = 1
_NORM_FLOOR = 1e-6


@functools.lru_cache(maxsize=1)
def _blas_controller() -> Any:
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


def _blas_threads_limited(threads: int | None) -> contextlib.AbstractContextManager[Any]:
    # The encoder's torch thread pool and OpenBLAS's both busy-wait on the same cores; letting
    # the matrix-vector product fan out to every core doubled the query encode time on 2 cores
    # (p50 8 -> 19 ms, p99 > 100 ms). A product this size is memory-bound: one thread is enough.
    controller = _blas_controller() if threads is not None else None
    if controller is None:
        return contextlib.nullcontext()
    return controller.limit(limits=threads, user_api="blas")


def one_blas_thread() -> contextlib.AbstractContextManager[Any]:
    """BLAS held to one thread for the products of one query (one limit for all of them: setting
    and restoring the limit costs ~0.1-0.3 ms, more than a product at 1,000 rows)."""
    return _blas_threads_limited(DEFAULT_BLAS_THREADS)


class VectorIndex:
    """Document id -> unit vector, with exact cosine top-k.

    Vectors are re-normalised on insert, so scores are cosine similarities in [-1, 1].
    ``blas_threads`` caps BLAS threads during the similarity product (needs ``threadpoolctl``,
    which sentence-transformers brings; the cap is process-wide for the ~1 ms it lasts);
    ``None`` leaves BLAS alone. Not thread-safe: use from one thread (the event loop) only.
    """

    def __init__(
        self,
        *,
        dimension: int,
        initial_capacity: int = DEFAULT_INITIAL_CAPACITY,
        blas_threads: int | None = DEFAULT_BLAS_THREADS,
    ) -> None:
        if blas_threads is not None and blas_threads < 1:
            raise ValueError(f"blas_threads must be >= 1 or None, got {blas_threads}")
        if dimension < 1:
            raise ValueError(f"dimension must be >= 1, got {dimension}")
        if initial_capacity < 1:
            raise ValueError(f"initial_capacity must be >= 1, got {initial_capacity}")
        self._dimension = dimension
        self._blas_threads = blas_threads
        self._matrix = np.zeros((initial_capacity, dimension), dtype=np.float32)
        self._ids: list[str] = []
        self._row_of: dict[str, int] = {}

    @property
    def dimension(self) -> int:
        return self._dimension

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._row_of

    def ids(self) -> Sequence[str]:
        """Document ids in row order: a live view, do not modify; valid until the next mutation."""
        return self._ids

    def row_of(self, doc_id: str) -> int | None:
        """Row of ``doc_id`` in :meth:`similarities` output, or None if absent."""
        return self._row_of.get(doc_id)

    def vector(self, doc_id: str) -> np.ndarray:
        """A copy of the stored unit vector of ``doc_id``; raises ``KeyError`` if absent."""
        return self._matrix[self._row_of[doc_id]].copy()

    def upsert(self, doc_id: str, vector: np.ndarray) -> None:
        """Insert or replace the vector of ``doc_id``."""
        self.upsert_many([doc_id], np.asarray(vector, dtype=np.float32).reshape(1, -1))

    def upsert_many(self, doc_ids: Sequence[str], vectors: np.ndarray) -> None:
        """Insert or replace several vectors; ``vectors`` is ``(len(doc_ids), dimension)``.

        Raises :class:`InvalidVectorError` (and changes nothing) on a wrong shape, a non-finite
        value or a zero vector.
        """
        matrix = self._validated(vectors, expected_rows=len(doc_ids))
        if len(set(doc_ids)) != len(doc_ids):
            raise InvalidVectorError("doc_ids passed to upsert_many must be unique")
        new_count = sum(1 for doc_id in doc_ids if doc_id not in self._row_of)
        self._reserve(len(self._ids) + new_count)
        for doc_id, vector in zip(doc_ids, matrix):
            row = self._row_of.get(doc_id)
            if row is None:
                row = len(self._ids)
                self._ids.append(doc_id)
                self._row_of[doc_id] = row
            self._matrix[row] = vector

    def remove(self, doc_id: str) -> bool:
        """Remove ``doc_id``; returns whether it was present. O(dimension)."""
        row = self._row_of.pop(doc_id, None)
        if row is None:
            return False
        last = len(self._ids) - 1
        if row != last:
            moved = self._ids[last]
            self._matrix[row] = self._matrix[last]
            self._ids[row] = moved
            self._row_of[moved] = row
        self._ids.pop()
        self._matrix[last] = 0.0
        return True

    def remove_many(self, doc_ids: Iterable[str]) -> int:
        """Remove several ids; returns how many were present."""
        return sum(1 for doc_id in doc_ids if self.remove(doc_id))

    def similarities(self, query_vector: np.ndarray) -> np.ndarray:
        """Cosine similarity of the query with every row, aligned with :meth:`ids`."""
        query = self.unit_query(query_vector)
        with _blas_threads_limited(self._blas_threads):
            return self.products(query)

    def unit_query(self, query_vector: np.ndarray) -> np.ndarray:
        """``query_vector`` checked (:class:`InvalidVectorError`) and scaled to unit length."""
        return self._validated(query_vector, expected_rows=1)[0]

    def products(self, query: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Every row's dot product with ``query``, a float32 vector of this index's dimension that
        the caller checked (:meth:`unit_query`, then scaled as it likes); BLAS threads as they are
        (:func:`one_blas_thread` around a query's products). With ``rows``, only those rows are
        multiplied (the others read -1, below any cosine)."""
        if rows is None:
            return self._matrix[: len(self._ids)] @ query
        products = np.full(len(self._ids), -1.0, dtype=np.float32)
        products[rows] = self._matrix[rows] @ query
        return products

    def top_k(
        self,
        query_vector: np.ndarray,
        k: int,
        allow: Callable[[str], bool] | None = None,
    ) -> list[tuple[str, float]]:
        """The ``k`` best (doc_id, cosine) pairs, best first, among ids that ``allow`` accepts.

        ``allow`` is called on candidates in score order until ``k`` are accepted (possibly more
        than once per id when the search window widens), so a selective filter costs more calls,
        never a wrong answer. Ties break by row order.
        """
        if k < 1 or not self._ids:
            return []
        scores = self.similarities(query_vector)
        return top_k_of_scores(self._ids, scores, k, allow)

    def _reserve(self, rows: int) -> None:
        capacity = self._matrix.shape[0]
        if rows <= capacity:
            return
        while capacity < rows:
            capacity *= 2
        grown = np.zeros((capacity, self._dimension), dtype=np.float32)
        grown[: len(self._ids)] = self._matrix[: len(self._ids)]
        self._matrix = grown

    def _validated(self, vectors: np.ndarray, *, expected_rows: int) -> np.ndarray:
        matrix = np.asarray(vectors, dtype=np.float32)
        if matrix.ndim == 1:
            matrix = matrix.reshape(1, -1)
        if matrix.ndim != 2 or matrix.shape != (expected_rows, self._dimension):
            raise InvalidVectorError(
                f"expected {expected_rows} vector(s) of dimension {self._dimension}, got shape "
                f"{np.shape(vectors)}; was the index built for another embedding model?"
            )
        if not np.all(np.isfinite(matrix)):
            raise InvalidVectorError("vectors must be finite (no NaN or inf)")
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        if np.any(norms < _NORM_FLOOR):
            raise InvalidVectorError("zero-length vectors cannot be compared by cosine")
        return matrix / norms


def top_k_of_scores(
    ids: Sequence[str],
    scores: np.ndarray,
    k: int,
    allow: Callable[[str], bool] | None = None,
) -> list[tuple[str, float]]:
    """Best ``k`` (id, score) of aligned ``ids``/``scores``, filtered by ``allow``, best first."""
    count = len(ids)
    if k < 1 or count == 0:
        return []
    if allow is None:
        if k >= count:
            order = np.argsort(-scores, kind="stable")
        else:
            partition = np.argpartition(-scores, k - 1)[:k]
            order = partition[np.argsort(-scores[partition], kind="stable")]
        return [(ids[row], float(scores[row])) for row in order]
    # With a filter, look at a window a few times larger than k first and only sort the whole
    # array when the filter rejects most of it.
    window = min(count, max(4 * k, 32))
    while True:
        if window >= count:
            order = np.argsort(-scores, kind="stable")
        else:
            partition = np.argpartition(-scores, window - 1)[:window]
            order = partition[np.argsort(-scores[partition], kind="stable")]
        accepted: list[tuple[str, float]] = []
        for row in order:
            doc_id = ids[row]
            if allow(doc_id):
                accepted.append((doc_id, float(scores[row])))
                if len(accepted) == k:
                    return accepted
        if window >= count:
            return accepted
        window = min(count, window * 4)
