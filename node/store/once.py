"""Once per envelope id: a send is delivered at most once across all replicas of a region.

The envelope id, scoped by the caller's identity, is claimed in the region's Redis with
``SET NX``; a repeated id — concurrent or later, on this replica or another — gets the stored
answer instead of a second delivery. A send that fails releases its claim, so the caller may
retry with the same id. Key (under the region's hash tag, next to :mod:`node.store`'s)::

    {prefix}:{region}:send:{caller}:{envelope_id}  STRING  the claim, then the stored answer (TTL)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis import asyncio as aioredis

from ..core import Conflict, StoreUnavailable
from .region import RedisErrors, RegionStore

_POLL_INTERVAL_S = 0.02  # how often a duplicate on another replica re-reads the first send's claim

# Compare-and-delete: release a claim only if it is still ours.
_RELEASE = """
local cur = redis.call('GET', KEYS[1])
if cur and string.find(cur, ARGV[1], 1, true) then return redis.call('DEL', KEYS[1]) end
return 0
"""


class DeliveryInProgress(Conflict):
    """Another send with the same envelope id is still being delivered: retry later with the same id."""

    code = "delivery_in_progress"


@dataclass(slots=True)
class Answer:
    """What a send answered; stored so a duplicate gets the same answer."""

    status: int
    content_type: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    too_large: bool = False

    def dump(self) -> str:
        return orjson.dumps({"state": "done", "status": self.status, "content_type": self.content_type,
                             "headers": self.headers, "too_large": self.too_large,
                             "body": "" if self.too_large else base64.b64encode(self.body).decode()}).decode()

    @classmethod
    def load(cls, data: dict[str, Any]) -> Answer:
        return cls(status=int(data["status"]), content_type=str(data["content_type"]),
                   body=base64.b64decode(data.get("body") or ""), headers=dict(data.get("headers") or {}),
                   too_large=bool(data.get("too_large")))


class OnceCache:
    """Runs a delivery at most once per key across all replicas of a region.

    Concurrent duplicates in this process wait on the first one's future; duplicates on other
    replicas poll the stored claim until the answer is there.
    """

    def __init__(self, redis: aioredis.Redis, *, key_base: str, region: str, node_id: str, ttl_ms: int,
                 pending_ttl_ms: int, max_body_bytes: int) -> None:
        self.redis = redis
        self.prefix = f"{key_base}:send:"
        self.region = region
        self.node_id = node_id
        self.ttl_ms = ttl_ms
        self.pending_ttl_ms = pending_ttl_ms
        self.max_body_bytes = max_body_bytes
        self._release = self.redis.register_script(_RELEASE)
        self._inflight: dict[str, asyncio.Future[Answer]] = {}
        self.waiting = 0  # duplicates now waiting for a first send's answer

    @classmethod
    def of(cls, store: RegionStore, *, node_id: str, ttl_ms: int, pending_ttl_ms: int,
           max_body_bytes: int) -> OnceCache:
        """The once-per-id claims beside ``store``: its connection, its key base, its region."""
        return cls(store.redis, key_base=store.key_base, region=store.region, node_id=node_id, ttl_ms=ttl_ms,
                   pending_ttl_ms=pending_ttl_ms, max_body_bytes=max_body_bytes)

    def key(self, caller: str, envelope_id: str) -> str:
        return f"{self.prefix}{caller}:{envelope_id}"

    async def run(self, key: str, deliver: Callable[[], Awaitable[Answer]], *, wait_s: float) -> tuple[Answer, bool]:
        """``(answer, duplicate)``: the stored answer of an earlier send, or ``deliver()``'s.

        Raises what ``deliver`` raises (to concurrent duplicates too, which did not deliver),
        :class:`DeliveryInProgress` when another replica's send outlasts ``wait_s``.
        """
        deadline = time.monotonic() + wait_s
        while True:
            local = self._inflight.get(key)
            if local is not None:
                self.waiting += 1
                try:
                    return await asyncio.shield(local), True
                except _ClaimAgain:
                    continue
                finally:
                    self.waiting -= 1
            future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
            self._inflight[key] = future
            try:
                answer, duplicate = await self._claim_and_deliver(key, deliver, deadline)
            except _ClaimAgain as exc:
                _fail(future, exc)
                continue
            except asyncio.CancelledError:
                _fail(future, DeliveryInProgress("the first send of this envelope id was cancelled; "
                                                 "retry with the same id", field="id"))
                raise
            except Exception as exc:
                _fail(future, exc)
                raise
            else:
                future.set_result(answer)
                return answer, duplicate
            finally:
                if self._inflight.get(key) is future:
                    del self._inflight[key]

    async def _claim_and_deliver(self, key: str, deliver: Callable[[], Awaitable[Answer]],
                                 deadline: float) -> tuple[Answer, bool]:
        token = os.urandom(8).hex()
        claim = orjson.dumps({"state": "pending", "node": self.node_id, "token": token}).decode()
        async with RedisErrors(self.region):
            claimed = await self.redis.set(key, claim, nx=True, px=self.pending_ttl_ms)
        if not claimed:
            stored = await self._wait_stored(key, deadline)
            if stored is None:
                raise _ClaimAgain()  # the other send failed and released the id: claim it ourselves
            return stored, True
        try:
            answer = await deliver()
        except BaseException:
            # A claim left behind lapses after pending_ttl_ms; releasing it only lets a retry in sooner.
            with contextlib.suppress(StoreUnavailable):
                async with RedisErrors(self.region):
                    await self._release(keys=[key], args=[token])
            raise
        await self._store(key, answer)
        return answer, False

    async def _store(self, key: str, answer: Answer) -> None:
        if len(answer.body) > self.max_body_bytes:
            answer = Answer(answer.status, answer.content_type, b"", dict(answer.headers), too_large=True)
        async with RedisErrors(self.region):
            await self.redis.set(key, answer.dump(), px=self.ttl_ms)

    async def _wait_stored(self, key: str, deadline: float) -> Answer | None:
        self.waiting += 1
        try:
            return await self._poll_stored(key, deadline)
        finally:
            self.waiting -= 1

    async def _poll_stored(self, key: str, deadline: float) -> Answer | None:
        while True:
            async with RedisErrors(self.region):
                raw = await self.redis.get(key)
            if raw is None:
                return None
            data = orjson.loads(raw)
            if data.get("state") == "done":
                return Answer.load(data)
            if time.monotonic() >= deadline:
                raise DeliveryInProgress("a send with this envelope id is still being delivered; "
                                         "retry later with the same id to get its answer", field="id")
            await asyncio.sleep(_POLL_INTERVAL_S)


class _ClaimAgain(Exception):
    """The id's earlier send failed and released it: try to claim it again."""


def _fail(future: asyncio.Future[Answer], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
        future.exception()  # mark it retrieved: there may be no concurrent duplicate waiting


__all__ = ["Answer", "DeliveryInProgress", "OnceCache"]
