"""The region's deny list of revoked bearer tokens, shared by its nodes through Redis.

Every token the cluster issues carries an id (``jti``, :class:`node.core.models.TokenClaims`).
Revoking one (``POST /v1/admin/tokens/revoke``, ``agent-reach token revoke``) puts its id on the
region's deny list until the token would have expired anyway::

    {prefix}:{region}:revoked          ZSET    jti -> the token's expiry (ms since the epoch)
    {prefix}:{region}:revoked:version  STRING  bumped by every revocation

A revocation is one script (:data:`REVOKE`): it drops the entries past their expiry, adds the
id (an entry only ever moves later), bumps the version and sets the set's own expiry to its
latest entry's, so the key goes away with its last entry and two revocations racing cannot
shorten it. Each node keeps the list in memory — the check on every request is a dictionary
lookup, no Redis round trip — and reads the version every ``poll_interval_ms``, the whole list
only when the version moved: a token revoked through one node is refused by every node of the
region within about one interval (:data:`DEFAULT_REVOCATION_POLL_INTERVAL_MS`). The node that
revoked it refuses it at once.

A region's list does not reach other regions, while tokens are valid in every region of the
cluster: revoke in each region (``agent-reach token revoke --all-regions`` does, from the
topology file). While Redis cannot be reached the last list read stays in force.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass

import redis.asyncio as aioredis

from ..core import StoreUnavailable, cancel_and_wait, now_ms
from ..core.models import MAX_TOKEN_EXPIRY_S
from ..store import RedisErrors, RegionStore

__all__ = ["DEFAULT_REVOCATION_POLL_INTERVAL_MS", "MAX_TOKEN_EXPIRY_S", "REVOKE", "Revocation", "RevocationList",
           "RevocationState"]

log = logging.getLogger(__name__)

DEFAULT_REVOCATION_POLL_INTERVAL_MS = 250

# KEYS: the deny list, its version. ARGV: jti, until (ms), now (ms).
# Answers {1 if the id was not on the list, the list's version}; {0, version} for a token
# that has expired already (nothing to refuse: it is refused as expired).
REVOKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
if tonumber(ARGV[2]) <= tonumber(ARGV[3]) then
  return {0, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
local added = redis.call('ZADD', KEYS[1], 'GT', ARGV[2], ARGV[1])
local version = redis.call('INCR', KEYS[2])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
return {added, version}
"""


class RevocationState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Revocation:
    """What one revocation did: ``new`` false when the id was on the list already (or the token
    had expired: ``expired``); ``version`` is the list's version after it."""

    jti: str
    until_ms: int
    new: bool
    expired: bool
    version: int


class RevocationList:
    """Revoked token ids of one region; ``async with`` (or ``start()``/``aclose()``) runs the poll."""

    def __init__(self, redis: aioredis.Redis, *, key_base: str, region: str,
                 poll_interval_ms: int = DEFAULT_REVOCATION_POLL_INTERVAL_MS) -> None:
        if poll_interval_ms <= 0:
            raise ValueError("poll_interval_ms must be positive")
        self.redis = redis
        self.region = region
        self.key = f"{key_base}:revoked"
        self.key_version = f"{key_base}:revoked:version"
        self.poll_interval_ms = poll_interval_ms
        self.state = RevocationState.NEW
        self.loads = 0
        self._revoked: dict[str, int] = {}  # jti -> until (ms)
        self._version: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._unreachable = False
        self._made = 0  # revocations through this list, so a read that raced one does not undo it
        self._revoke = redis.register_script(REVOKE)

    @classmethod
    def of(cls, store: RegionStore, *, poll_interval_ms: int) -> RevocationList:
        """The list of ``store``'s region, on the store's connections."""
        return cls(store.redis, key_base=store.key_base, region=store.region, poll_interval_ms=poll_interval_ms)

    async def __aenter__(self) -> RevocationList:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Load the list and start polling; raises :class:`StoreUnavailable` if Redis cannot be reached."""
        if self.state is not RevocationState.NEW:
            return
        await self.refresh()
        self.state = RevocationState.RUNNING
        self._task = asyncio.create_task(self._poll(), name=f"revocations-{self.region}")

    async def aclose(self) -> None:
        if self.state is RevocationState.CLOSED:
            return
        self.state = RevocationState.CLOSED
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    def __len__(self) -> int:
        return len(self._revoked)

    def revoked(self, jti: str, *, at_ms: int | None = None) -> bool:
        """Whether the token ``jti`` is on the list (and its entry has not ended)."""
        until = self._revoked.get(jti)
        return until is not None and until > (now_ms() if at_ms is None else at_ms)

    async def revoke(self, jti: str, *, expires_at_s: int) -> Revocation:
        """Put ``jti`` on the region's list until ``expires_at_s`` (the token's ``exp``).

        Raises:
            StoreUnavailable: Redis cannot be reached (nothing was revoked).
            ValueError: ``expires_at_s`` is past :data:`MAX_TOKEN_EXPIRY_S`.
        """
        if expires_at_s > MAX_TOKEN_EXPIRY_S:
            raise ValueError(f"exp must be at most {MAX_TOKEN_EXPIRY_S} (seconds since the epoch)")
        until, now = expires_at_s * 1000, now_ms()
        async with RedisErrors(self.region):
            added, version = await self._revoke(keys=[self.key, self.key_version], args=[jti, until, now])
        expired = until <= now
        if not expired:
            self._made += 1
            self._revoked[jti] = max(until, self._revoked.get(jti, 0))
        return Revocation(jti=jti, until_ms=until, new=bool(added), expired=expired, version=int(version))

    async def refresh(self) -> None:
        """Read the list again if its version moved; raises :class:`StoreUnavailable`."""
        made = self._made
        async with RedisErrors(self.region):
            version = await self.redis.get(self.key_version)
            if self.loads and version == self._version:
                return
            entries = await self.redis.zrangebyscore(self.key, f"({now_ms()}", "+inf", withscores=True)
        # The entries are read after the version: a revocation in between is in them, and the
        # next poll reads them again (its version differs), so nothing is missed. One made here
        # while reading may not be in them: keep what memory has and read again next time.
        if made != self._made:
            return
        self._revoked = {str(jti): int(until) for jti, until in entries}
        self._version = version
        self.loads += 1

    # -- the poll ----------------------------------------------------------------------------

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_ms / 1000)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except StoreUnavailable as exc:
                if not self._unreachable:
                    log.warning("region %s: cannot read the token deny list (%s); the last list read stays in "
                                "force", self.region, exc)
                self._unreachable = True
            except Exception:  # the poll must outlive a surprise, or revocations would stop arriving
                log.exception("region %s: reading the token deny list failed", self.region)
            else:
                if self._unreachable:
                    log.info("region %s: the token deny list is read again", self.region)
                self._unreachable = False
