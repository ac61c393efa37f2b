"""Vector caches: so that restarts and peer nodes do not re-encode texts already seen.

Keys are opaque strings built by the embedder from (model id, sha256 of the text); values are
1-D float32 numpy arrays. A cache is an optimisation: a backend failure raises
:class:`VectorCacheError`, which the embedder logs and treats as a miss.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import redis.asyncio
import redis.exceptions

from .errors import VectorCacheError

__all__ = [
    "VectorCache",
    "MemoryVectorCache",
    "RedisVectorCache",
    "LayeredVectorCache",
    "DEFAULT_MEMORY_CACHE_ENTRIES",
    "DEFAULT_REDIS_PREFIX",
    "DEFAULT_REDIS_TTL_S",
]

DEFAULT_MEMORY_CACHE_ENTRIES = 100_000  # ~150 MiB at 384 float32 dimensions
DEFAULT_REDIS_PREFIX = "agent-reach:semantic:vec:"
DEFAULT_REDIS_TTL_S = 30 * 24 * 3600  # long enough to survive restarts, short enough to drop old models' vectors

_DECODING_CLIENT = "the Redis client decodes responses to str; create it with decode_responses=False"
_VECTOR_DTYPE = np.dtype("<f4")  # explicit little-endian so peers on any platform read the same bytes


@runtime_checkable
class VectorCache(Protocol):
    """Async key -> vector store used by :class:`semantic.Embedder`."""

    async def get_many(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """Return the vectors found, keyed by key; missing keys are simply absent."""
        ...

    async def set_many(self, mapping: Mapping[str, np.ndarray]) -> None:
        """Store every (key, vector) pair; existing keys are overwritten."""
        ...


class MemoryVectorCache:
    """In-process LRU cache bounded by entry count."""

    def __init__(self, *, max_entries: int = DEFAULT_MEMORY_CACHE_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._max_entries = max_entries
        self._entries: OrderedDict[str, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def get_many(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        for key in keys:
            vector = self._entries.get(key)
            if vector is not None:
                self._entries.move_to_end(key)
                found[key] = vector
        return found

    async def set_many(self, mapping: Mapping[str, np.ndarray]) -> None:
        for key, vector in mapping.items():
            # Read-only copies: a caller mutating a returned array must not corrupt the cache.
            stored = np.array(vector, dtype=np.float32, copy=True)
            stored.setflags(write=False)
            self._entries[key] = stored
            self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)


class RedisVectorCache:
    """Vectors stored in Redis as raw little-endian float32 bytes under ``prefix + key``.

    The client must be created with ``decode_responses=False`` (vectors are binary).
    ``ttl_s=None`` keeps entries forever; otherwise every write (re)sets the expiry.
    The cache does not own the client: closing it is the caller's job.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        prefix: str = DEFAULT_REDIS_PREFIX,
        ttl_s: int | None = DEFAULT_REDIS_TTL_S,
    ) -> None:
        if ttl_s is not None and ttl_s < 1:
            raise ValueError(f"ttl_s must be >= 1 second or None, got {ttl_s}")
        self._client = client
        self._prefix = prefix
        self._ttl_s = ttl_s

    async def get_many(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        if not keys:
            return {}
        try:
            values = await self._client.mget([self._prefix + key for key in keys])
        except UnicodeDecodeError as exc:
            raise VectorCacheError(_DECODING_CLIENT) from exc
        except redis.exceptions.RedisError as exc:
            raise VectorCacheError(f"reading vectors from Redis failed: {exc}") from exc
        found: dict[str, np.ndarray] = {}
        for key, value in zip(keys, values):
            if value is None:
                continue
            if isinstance(value, str):
                raise VectorCacheError(_DECODING_CLIENT)
            if len(value) == 0 or len(value) % _VECTOR_DTYPE.itemsize:
                continue  # foreign or truncated value: a miss, overwritten on the next encode
            found[key] = np.frombuffer(value, dtype=_VECTOR_DTYPE).astype(np.float32)
        return found

    async def set_many(self, mapping: Mapping[str, np.ndarray]) -> None:
        if not mapping:
            return
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key, vector in mapping.items():
                    payload = np.ascontiguousarray(vector, dtype=_VECTOR_DTYPE).tobytes()
                    pipe.set(self._prefix + key, payload, ex=self._ttl_s)
                await pipe.execute()
        except redis.exceptions.RedisError as exc:
            raise VectorCacheError(f"writing vectors to Redis failed: {exc}") from exc


class LayeredVectorCache:
    """A fast cache in front of a shared one (typically memory over Redis).

    Reads try ``front`` first and back-fill it from ``back``; writes go to both.
    """

    def __init__(self, front: VectorCache, back: VectorCache) -> None:
        self._front = front
        self._back = back

    async def get_many(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        found = await self._front.get_many(keys)
        missing = [key for key in keys if key not in found]
        if missing:
            from_back = await self._back.get_many(missing)
            if from_back:
                await self._front.set_many(from_back)
                found.update(from_back)
        return found

    async def set_many(self, mapping: Mapping[str, np.ndarray]) -> None:
        await self._front.set_many(mapping)
        await self._back.set_many(mapping)
