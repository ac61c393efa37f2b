"""Rate budgets: token buckets per tenant, one budget per region, kept in the region's Redis.

A tenant is a token's role *and* subject (:func:`tenant_of`): a caller token named
``pay.core.prod`` or ``admin`` has a budget of its own, never that agent's or the admin's. Each
request spends one token of its tenant's bucket; a resolve or a send spends one more of the
tenant's bucket for the capability it routes by (``per (caller, capability)``). The budgets per
role are :class:`RateSettings`; a role whose rate is 0 is not limited (admins and peer nodes by
default).

**One budget per region.** Every node process (``--workers``) and replica of a region spends the
same buckets, in Redis::

    {prefix}:{region}:rate:{role}:{subject}              HASH  t: tokens (may be negative), at: ms
    {prefix}:{region}:rate:{role}:{subject}/{capability} HASH  the same, per capability

(subject and capability percent-encoded). The request path never waits for Redis: each process
decides from a bucket of its own, in memory, and every ``rate_limit_sync_interval_ms`` sends what
it spent per bucket in one script (:data:`SPEND`), which refills the region's bucket, takes the
spending off — it may go below zero: the debt is paid back before anyone is admitted again — and
answers the region's level, which the process's bucket then takes when it is lower. Over any
stretch of time a tenant gets its rate, whatever process its requests reach; within one sync
interval each further process may admit up to its own bucket's level before it learns what the
others spent (at most ``burst`` per process, once). While Redis cannot be reached, each process
goes on with its own buckets alone: a tenant then gets up to its budget per process.

A refusal is :class:`~node.core.RateLimited` (429) with ``details.retry_after_ms`` (the HTTP
face sends it as ``Retry-After``); the refusals are counted by role and kind (``caller``,
``capability``) in ``agent_reach_rate_limited_total``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import redis.asyncio as aioredis
from pydantic import Field

from ..core import RateLimited, Settings, StoreUnavailable, cancel_and_wait, now_ms
from ..core.models import TokenClaims, TokenRole
from ..store import RedisErrors, RegionStore

__all__ = ["SPEND", "Budget", "BudgetKind", "RateBudgets", "RateSettings", "tenant_of"]

log = logging.getLogger(__name__)

DEFAULT_CALLER_RPS = 200.0
DEFAULT_CALLER_BURST = 400
DEFAULT_AGENT_RPS = 100.0
DEFAULT_AGENT_BURST = 200
DEFAULT_ADMIN_RPS = 0.0  # admins and peer nodes: operators and the federation are not limited
DEFAULT_ADMIN_BURST = 1_000
DEFAULT_CAPABILITY_RPS = 100.0
DEFAULT_CAPABILITY_BURST = 200
DEFAULT_SYNC_INTERVAL_MS = 100
MAX_TRACKED_BUCKETS = 100_000

# KEYS: one bucket per key. ARGV: now (ms), then per key its rate (tokens/s), burst and the tokens
# spent since the last sync. Refills each bucket to now (at most burst), takes the spending off
# (below zero: a debt), stores it for as long as a refill to full takes, and answers each level.
SPEND = """
local now = tonumber(ARGV[1])
local levels = {}
for i = 1, #KEYS do
  local rate, burst, spent = tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  local held = redis.call('HMGET', KEYS[i], 't', 'at')
  local tokens, at = tonumber(held[1]) or burst, tonumber(held[2]) or now
  if now > at then tokens = math.min(burst, tokens + (now - at) * rate / 1000) else now = at end
  tokens = tokens - spent
  redis.call('HSET', KEYS[i], 't', tostring(tokens), 'at', now)
  redis.call('PEXPIRE', KEYS[i], math.ceil((burst - tokens) * 1000 / rate) + 1000)
  levels[i] = tostring(tokens)
end
return levels
"""


class RateSettings(Settings):
    """The rate budgets per role, per tenant and per (tenant, capability), region-wide."""

    rate_limit_rps: float = Field(default=DEFAULT_CALLER_RPS, ge=0,
                                  description="Requests per second one caller token (role caller: its role and "
                                              "subject) may send, over every node process and replica of the "
                                              "region; 0 = unlimited.")
    rate_limit_burst: int = Field(default=DEFAULT_CALLER_BURST, ge=1,
                                  description="Requests a caller token may send at once above rate_limit_rps.")
    rate_limit_agent_rps: float = Field(default=DEFAULT_AGENT_RPS, ge=0,
                                        description="Requests per second one agent token may send (heartbeats, "
                                                    "its own calls …), region-wide; 0 = unlimited.")
    rate_limit_agent_burst: int = Field(default=DEFAULT_AGENT_BURST, ge=1,
                                        description="Requests an agent token may send at once above "
                                                    "rate_limit_agent_rps.")
    rate_limit_admin_rps: float = Field(default=DEFAULT_ADMIN_RPS, ge=0,
                                        description="Requests per second one admin or peer-node token may send, "
                                                    "region-wide; 0 (the default) = unlimited.")
    rate_limit_admin_burst: int = Field(default=DEFAULT_ADMIN_BURST, ge=1,
                                        description="Requests an admin or peer token may send at once above "
                                                    "rate_limit_admin_rps.")
    rate_limit_capability_rps: float = Field(
        default=DEFAULT_CAPABILITY_RPS, ge=0,
        description="Resolves and sends per second one agent or caller token (an admin one too when "
                    "rate_limit_admin_rps is set) may route by one capability, on top of its own budget, "
                    "region-wide; 0 = unlimited.")
    rate_limit_capability_burst: int = Field(default=DEFAULT_CAPABILITY_BURST, ge=1,
                                             description="Resolves and sends by one capability a token may send "
                                                         "at once above rate_limit_capability_rps.")
    rate_limit_sync_interval_ms: int = Field(
        default=DEFAULT_SYNC_INTERVAL_MS, ge=10, le=10_000,
        description="How often each node process adds what its tenants spent to the region's budgets in Redis "
                    "and learns what the others spent.")


class BudgetKind(enum.Enum):
    """What a bucket limits: a tenant's requests, or its routes by one capability."""

    CALLER = "caller"
    CAPABILITY = "capability"


@dataclass(frozen=True, slots=True)
class Budget:
    """``rate_per_s`` sustained, ``burst`` at once; a rate of 0 is no limit."""

    rate_per_s: float
    burst: int

    @property
    def unlimited(self) -> bool:
        return self.rate_per_s == 0


def tenant_of(claims: TokenClaims) -> str:
    """Whose share a token spends: its role and subject (``caller:admin`` is not the admin)."""
    return f"{claims.role.value}:{claims.sub}"


_Key = tuple[TokenRole, str, "str | None"]  # role, subject, capability (None: the tenant's own budget)


class _Bucket:
    __slots__ = ("budget", "kind", "role", "tokens", "at", "spent")

    def __init__(self, budget: Budget, kind: BudgetKind, role: TokenRole, now: float) -> None:
        self.budget = budget
        self.kind = kind
        self.role = role
        self.tokens = float(budget.burst)
        self.at = now
        self.spent = 0  # admitted since the last sync

    def refilled(self, now: float) -> float:
        self.tokens = min(float(self.budget.burst), self.tokens + (now - self.at) * self.budget.rate_per_s)
        self.at = now
        return self.tokens


class RateBudgets:
    """The region's rate budgets as this process spends them; start it to share them through Redis.

    :meth:`spend` is synchronous and O(1). ``clock`` is monotonic seconds.
    """

    def __init__(self, redis: aioredis.Redis | None, *, key_base: str, region: str, settings: RateSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.redis = redis
        self.prefix = f"{key_base}:rate:"
        self.region = region
        self.sync_interval_s = settings.rate_limit_sync_interval_ms / 1000
        self.clock = clock
        caller = Budget(settings.rate_limit_rps, settings.rate_limit_burst)
        admin = Budget(settings.rate_limit_admin_rps, settings.rate_limit_admin_burst)
        self.budgets = {TokenRole.CALLER: caller, TokenRole.AGENT: Budget(settings.rate_limit_agent_rps,
                                                                          settings.rate_limit_agent_burst),
                        TokenRole.ADMIN: admin, TokenRole.PEER: admin}
        self.capability = Budget(settings.rate_limit_capability_rps, settings.rate_limit_capability_burst)
        self.refused: dict[tuple[str, str], int] = {}  # (role, kind) -> requests refused
        self.syncs = 0
        self.admitted = 0  # requests admitted from limited buckets here
        self.shared = 0  # of those, the ones the region's buckets have counted (a sync completed)
        self._buckets: dict[_Key, _Bucket] = {}
        self._spent: dict[_Key, _Bucket] = {}  # buckets spent from since the last sync
        self._script = redis.register_script(SPEND) if redis is not None else None
        self._task: asyncio.Task[None] | None = None
        self._redis_down = False

    @classmethod
    def of(cls, store: RegionStore, settings: RateSettings) -> RateBudgets:
        return cls(store.redis, key_base=store.key_base, region=store.region, settings=settings)

    def spend(self, claims: TokenClaims, capability: str | None = None) -> None:
        """Spend one request of ``claims``' tenant — of its budget for ``capability`` when given.

        Raises :class:`RateLimited` (429, ``details.retry_after_ms``) when the bucket is empty.
        """
        role = claims.role
        if capability is None:
            budget, kind = self.budgets[role], BudgetKind.CALLER
            if budget.unlimited:
                return
        else:
            budget, kind = self.capability, BudgetKind.CAPABILITY
            if budget.unlimited or (role in (TokenRole.ADMIN, TokenRole.PEER) and self.budgets[role].unlimited):
                return
        key = (role, claims.sub, capability)
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_TRACKED_BUCKETS:
                self._forget_idle(now)
            bucket = self._buckets[key] = _Bucket(budget, kind, role, now)
        tokens = bucket.refilled(now)
        if tokens < 1.0:
            self.refused[(role.value, kind.value)] = self.refused.get((role.value, kind.value), 0) + 1
            retry_after_ms = math.ceil((1.0 - tokens) * 1000 / budget.rate_per_s)
            what = f"by capability {capability!r} " if capability is not None else ""
            raise RateLimited(
                f"{role.value} {claims.sub!r} sent more than {budget.rate_per_s:g} requests/s {what}(burst "
                f"{budget.burst}) in region {self.region}; retry after {retry_after_ms} ms",
                details={"retry_after_ms": retry_after_ms, "budget": kind.value})
        bucket.tokens = tokens - 1.0
        bucket.spent += 1
        self.admitted += 1
        self._spent[key] = bucket

    # -- sharing through Redis ---------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None and self._script is not None:
            self._task = asyncio.create_task(self._run(), name=f"rate-budgets-{self.region}")

    async def aclose(self) -> None:
        """Stop sharing (what was spent since the last sync stays this process's). Idempotent."""
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval_s)
            try:
                await self.sync()
            except StoreUnavailable as exc:
                if not self._redis_down:
                    log.warning("rate budgets are this process's alone until Redis answers again: %s", exc.message)
                self._redis_down = True
            except Exception:  # a bug: the buckets here go on alone, and the next sync tries again
                log.exception("could not share the rate budgets of region %s", self.region)

    async def sync(self) -> None:
        """Add what was spent here to the region's buckets and take their levels when lower.
        Raises :class:`StoreUnavailable` (what was spent is then forgotten: the buckets here keep it)."""
        if not self._spent or self._script is None:
            return
        spent, self._spent = self._spent, {}
        keys = [self._redis_key(key) for key in spent]
        args: list[object] = [now_ms()]
        counts = []
        for bucket in spent.values():
            counts.append(bucket.spent)
            args += [bucket.budget.rate_per_s, bucket.budget.burst, bucket.spent]
            bucket.spent = 0
        sent_at = self.clock()
        async with RedisErrors(self.region):
            levels = await self._script(keys=keys, args=args)
        self.syncs += 1
        self.shared += sum(counts)
        if self._redis_down:
            log.info("rate budgets are shared through Redis again")
            self._redis_down = False
        now = self.clock()
        for bucket, level in zip(spent.values(), levels):
            # The region's level at the sync, refilled since, less what was admitted here meanwhile.
            region = float(level) + (now - sent_at) * bucket.budget.rate_per_s - bucket.spent
            if region < bucket.refilled(now):
                bucket.tokens = region

    def _redis_key(self, key: _Key) -> str:
        role, subject, capability = key
        tail = f"/{quote(capability, safe='.-_@')}" if capability is not None else ""
        return f"{self.prefix}{role.value}:{quote(subject, safe='.-_@')}{tail}"

    def _forget_idle(self, now: float) -> None:
        """Drop buckets that are full again and owe Redis nothing; if none is, the oldest."""
        idle = [key for key, bucket in self._buckets.items()
                if key not in self._spent and bucket.refilled(now) >= bucket.budget.burst]
        for key in idle or list(self._buckets)[: len(self._buckets) // 10 + 1]:
            self._buckets.pop(key, None)
