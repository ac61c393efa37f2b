"""The region's deny list of revoked bearer tokens, shared by its nodes through Redis.

Every token the cluster issues carries an id (``jti``, :class:`node.core.models.TokenClaims`).
Revoking one (``POST /v1/admin/tokens/revoke``, ``agent-reach token revoke``) puts its id on the
region's deny list until the token would have expired anyway::

    {prefix}:{region}:revoked          ZSET    jti -> the token's expiry (ms since the epoch)
    {prefix}:{region}:revoked:version  STRING  bumped by every revocation that changed the list
    {prefix}:{region}:revoked:log      STREAM  one entry per such change, id "<version>-0":
                                               jti, until (ms), origin (the region it came from)

A revocation is one script (:data:`REVOKE`): it drops the entries past their expiry, adds the
id (an entry only ever moves later: one already there until as late changes nothing), bumps
the version, logs the change and sets the set's and the log's expiry to the latest entry's, so
the keys go away with their last entry and two revocations racing cannot shorten one. Each node keeps the list in memory — the check on every request is a dictionary
lookup, no Redis round trip — and reads the version every ``poll_interval_ms``, the whole list
only when the version moved: a token revoked through one node is refused by every node of the
region within about one interval (:data:`DEFAULT_REVOCATION_POLL_INTERVAL_MS`). The node that
revoked it refuses it at once.

Tokens are valid in every region, so a revocation must reach them all: the log is what the
federation's relay (``federation.revocations``) reads to send this region's own revocations
(``origin`` = this region) to its peers over Kafka, and what a peer's revocation is applied
through (:meth:`RevocationList.apply`, ``origin`` = the peer), so nothing is sent back and
forth. :meth:`RevocationList.wait_changed` wakes the relay on a change this node made or read.
While Redis cannot be reached the last list read stays in force.

Every token of one subject (an agent's, when an admin revokes "the agent's tokens") is refused
by one entry of the same list, :meth:`RevocationList.revoke_subject`: its id is
``s-<digest of role and subject>-<cut-off>`` (a token id's alphabet, so the federation carries it
like any other), and it refuses the subject's tokens issued at or before the cut-off second, for
as long as such a token may live (tokens are issued with any lifetime, so until
:data:`MAX_TOKEN_EXPIRY_S`). A token issued after it is accepted: the agent gets a new one.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass

import redis.asyncio as aioredis

from ..core import now_ms
from ..core.models import MAX_TOKEN_EXPIRY_S, TokenClaims, TokenRole
from ..store import RedisErrors, RegionStore
from .polled import PolledList, PollState

__all__ = ["DEFAULT_REVOCATION_POLL_INTERVAL_MS", "MAX_TOKEN_EXPIRY_S", "REVOKE", "LoggedRevocation", "Revocation",
           "RevocationList", "RevocationState", "subject_entry"]

log = logging.getLogger(__name__)

DEFAULT_REVOCATION_POLL_INTERVAL_MS = 250
DEFAULT_LOG_MAXLEN = 10_000  # the log only has to cover what the relay has not sent yet
_SUBJECT_ENTRY = re.compile(r"^s-([0-9a-f]{40})-([0-9]{1,12})$")


def _subject_digest(role: TokenRole, subject: str) -> str:
    return hashlib.sha256(f"{role.value}\n{subject}".encode()).hexdigest()[:40]


def subject_entry(role: TokenRole, subject: str, *, issued_until_s: int) -> str:
    """The deny-list id refusing every token of ``subject`` (as ``role``) issued at or before
    ``issued_until_s`` (seconds since the epoch)."""
    return f"s-{_subject_digest(role, subject)}-{issued_until_s}"

# KEYS: the deny list, its version, its log. ARGV: jti, until (ms), now (ms), origin, log maxlen.
# Answers {1 if the id was not on the list, the list's version, 1 if the list changed};
# {0, version, 0} for a token that has expired already (nothing to refuse: it is refused as
# expired) or that the list holds until as late already.
REVOKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
local ends = tonumber(ARGV[2])
local before = redis.call('ZSCORE', KEYS[1], ARGV[1])
if ends <= tonumber(ARGV[3]) or (before and tonumber(before) >= ends) then
  return {0, tonumber(redis.call('GET', KEYS[2]) or '0'), 0}
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
local version = redis.call('INCR', KEYS[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], version .. '-0', 'jti', ARGV[1], 'until', ARGV[2],
           'origin', ARGV[4])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
redis.call('PEXPIREAT', KEYS[3], last[2])
local added = 1
if before then added = 0 end
return {added, version, 1}
"""


RevocationState = PollState  # its states, under the name it had


@dataclass(frozen=True, slots=True)
class Revocation:
    """What one revocation did: ``new`` false when the id was on the list already (or the token
    had expired: ``expired``); ``changed`` when the list moved (a new id, or a later end);
    ``version`` is the list's version after it (0 when Redis was not asked)."""

    jti: str
    until_ms: int
    new: bool
    expired: bool
    version: int
    changed: bool = False


@dataclass(frozen=True, slots=True)
class LoggedRevocation:
    """One entry of the region's revocation log: ``jti`` refused until ``until_ms``, learnt from
    ``origin`` (this region when an admin revoked it here)."""

    position: str  # the log entry's id, "<version>-0"
    jti: str
    until_ms: int
    origin: str


class RevocationList(PolledList):
    """Revoked token ids of one region; ``async with`` (or ``start()``/``aclose()``) runs the poll."""

    what = "token deny list"

    def __init__(self, redis: aioredis.Redis, *, key_base: str, region: str,
                 poll_interval_ms: int = DEFAULT_REVOCATION_POLL_INTERVAL_MS) -> None:
        super().__init__(redis, region=region, key_log=f"{key_base}:revoked:log", poll_interval_ms=poll_interval_ms)
        self.key = f"{key_base}:revoked"
        self.key_version = f"{key_base}:revoked:version"
        self.peers: tuple[str, ...] = ()  # the regions a revocation here reaches (set by the federation)
        self.loads = 0
        self._revoked: dict[str, int] = {}  # jti -> until (ms)
        self._subjects: dict[str, int] = {}  # subject digest -> the latest cut-off (s), from the "s-" entries
        self._version: str | None = None
        self._made = 0  # revocations through this list, so a read that raced one does not undo it
        self._revoke = redis.register_script(REVOKE)
        self.generation = 0  # moves whenever the ids held change (stable_until)
        self._stable = (-1, 0)  # (generation, until ms) that stable_until computed last

    @classmethod
    def of(cls, store: RegionStore, *, poll_interval_ms: int) -> RevocationList:
        """The list of ``store``'s region, on the store's connections."""
        return cls(store.redis, key_base=store.key_base, region=store.region, poll_interval_ms=poll_interval_ms)

    def __len__(self) -> int:
        return len(self._revoked)

    def revoked(self, jti: str, *, at_ms: int | None = None) -> bool:
        """Whether the token ``jti`` is on the list (and its entry has not ended)."""
        until = self._revoked.get(jti)
        return until is not None and until > (now_ms() if at_ms is None else at_ms)

    def refuses(self, claims: TokenClaims) -> bool:
        """Whether a token with ``claims`` is revoked: by its id, by the id of the caller's token
        it was forwarded for (``fwd.jti``, federation.forward), or with every token of its subject."""
        return self.refuses_token(jti=claims.jti, forwarded_jti=claims.fwd.jti if claims.fwd is not None else None,
                                  role=claims.role, sub=claims.sub, iat=claims.iat)

    def stable_until(self, at_ms: int) -> tuple[int, int]:
        """``(generation, until_ms)``: :meth:`refuses_token` answers as at ``at_ms`` for every token
        while :attr:`generation` stays and before ``until_ms`` (the next entry to end). What a
        session checks once for its agents instead of once per renewal (``node.http.sessions``)."""
        generation, until = self._stable
        if generation != self.generation or until <= at_ms:
            until = min((end for end in self._revoked.values() if end > at_ms), default=MAX_TOKEN_EXPIRY_S * 1000)
            self._stable = generation, until = self.generation, until
        return generation, until

    def refuses_token(self, *, jti: str | None, forwarded_jti: str | None, role: TokenRole, sub: str,
                      iat: int) -> bool:
        """:meth:`refuses` of a token's claims kept as plain fields (a session's members)."""
        if jti is not None and self.revoked(jti):
            return True
        if forwarded_jti is not None and self.revoked(forwarded_jti):
            return True
        if not self._subjects:  # the common case: no subject revoked, no digest computed
            return False
        cut_off = self._subjects.get(_subject_digest(role, sub))
        return cut_off is not None and iat <= cut_off

    async def revoke_subject(self, role: TokenRole, subject: str, *, issued_until_s: int) -> Revocation:
        """Refuse every token of ``subject`` (as ``role``) issued at or before ``issued_until_s``,
        in this region and, through the federation, its peers; raises :class:`StoreUnavailable`."""
        return await self.apply(subject_entry(role, subject, issued_until_s=issued_until_s),
                                until_ms=MAX_TOKEN_EXPIRY_S * 1000, origin=self.region)

    async def revoke(self, jti: str, *, expires_at_s: int) -> Revocation:
        """Put ``jti`` on the region's list until ``expires_at_s`` (the token's ``exp``), as this
        region's own revocation (the federation sends it to the peers).

        Raises:
            StoreUnavailable: Redis cannot be reached (nothing was revoked).
            ValueError: ``expires_at_s`` is past :data:`MAX_TOKEN_EXPIRY_S`.
        """
        if expires_at_s > MAX_TOKEN_EXPIRY_S:
            raise ValueError(f"exp must be at most {MAX_TOKEN_EXPIRY_S} (seconds since the epoch)")
        return await self.apply(jti, until_ms=expires_at_s * 1000, origin=self.region)

    async def apply(self, jti: str, *, until_ms: int, origin: str) -> Revocation:
        """Put ``jti`` on the list until ``until_ms``, learnt from region ``origin`` (a peer's
        revocation arriving over the federation); raises :class:`StoreUnavailable`."""
        now = now_ms()
        if until_ms <= now:
            return Revocation(jti=jti, until_ms=until_ms, new=False, expired=True, version=0)
        if self._revoked.get(jti, 0) >= until_ms and origin != self.region:
            # Known until as late: a peer's repeat (its relay announces its whole list on every
            # start) costs no round trip.
            return Revocation(jti=jti, until_ms=until_ms, new=False, expired=False, version=0)
        async with RedisErrors(self.region):
            added, version, changed = await self._revoke(
                keys=[self.key, self.key_version, self.key_log],
                args=[jti, until_ms, now, origin, DEFAULT_LOG_MAXLEN])
        self._made += 1
        self._revoked[jti] = max(until_ms, self._revoked.get(jti, 0))
        self._subjects = _cut_offs(self._revoked)
        self.generation += 1
        if changed:
            self._changed.set()
        return Revocation(jti=jti, until_ms=until_ms, new=bool(added), expired=False, version=int(version),
                          changed=bool(changed))

    async def read_log(self, *, after: str, count: int = 1_000) -> list[LoggedRevocation]:
        """Log entries after the entry ``after``, oldest first; raises :class:`StoreUnavailable`.
        An entry whose fields do not parse is skipped (nothing else writes the log)."""
        async with RedisErrors(self.region):
            entries = await self.redis.xrange(self.key_log, min=f"({after}", count=count)
        logged = []
        for position, fields in entries:
            try:
                logged.append(LoggedRevocation(position=str(position), jti=str(fields["jti"]),
                                               until_ms=int(fields["until"]), origin=str(fields["origin"])))
            except (KeyError, ValueError):
                log.warning("region %s: revocation log entry %s does not parse; skipped", self.region, position)
        return logged

    async def entries(self) -> dict[str, int]:
        """Every id on the list now, with its end (ms), read from Redis; raises :class:`StoreUnavailable`."""
        async with RedisErrors(self.region):
            found = await self.redis.zrangebyscore(self.key, f"({now_ms()}", "+inf", withscores=True)
        return {str(jti): int(until) for jti, until in found}

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
        self._subjects = _cut_offs(self._revoked)
        self.generation += 1
        if self.loads and version != self._version:
            self._changed.set()
        self._version = version
        self.loads += 1


def _cut_offs(revoked: dict[str, int]) -> dict[str, int]:
    """Subject digest -> the latest cut-off (s) of the subject entries among ``revoked``'s ids."""
    cut_offs: dict[str, int] = {}
    for jti in revoked:
        found = _SUBJECT_ENTRY.match(jti) if jti.startswith("s-") else None
        if found is not None:
            digest, cut_off = found.group(1), int(found.group(2))
            cut_offs[digest] = max(cut_off, cut_offs.get(digest, 0))
    return cut_offs
