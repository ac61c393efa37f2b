"""Who may see and call which agent: ``allowed_callers`` (per agent and per capability) and the
region's ACL rules, which an admin changes at runtime, in the region's Redis.

The rules (:class:`node.core.models.AclRule`) are kept in one hash, each entry an
:class:`~node.core.models.AclEntry` (a deleted rule keeps its entry, ``rule`` null, so a set made
earlier elsewhere loses to it)::

    {prefix}:{region}:acl          HASH    rule id -> AclEntry JSON
    {prefix}:{region}:acl:version  STRING  bumped by every change
    {prefix}:{region}:acl:log      STREAM  one entry per change, id "<version>-0": entry (AclEntry JSON)

A change is one script (:data:`SET_RULE`): the later entry wins (``at_ms``, then the JSON), so a
set and a delete crossing between regions end the same everywhere. Each node holds the rules in
memory, compiled (the check on every route is a loop over them, no round trip) and reads the
version every ``poll_interval_ms``, the whole hash only when it moved: a rule set through one node
holds on every node of the region within about one interval (250 ms by default; the node that set
it at once), with no agent registering again. While Redis cannot be reached the last rules read
stay in force. The log is what the federation's relay (``federation.acl``) sends to the peers, the
entries of this region's own origin only, and what a peer's rule is applied through
(:meth:`RegionAcl.apply`), so a rule set in one region holds in every region.

:func:`admits` is the one check every route uses (``RegistryNode.visible``, the router's
candidates, the watch, traces, decisions, cards): the record's ``allowed_callers``, the
capability's (when routing by one), then the rules. Admins, peers and the agent itself always pass.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass

import redis.asyncio as aioredis
from pydantic import ValidationError

from ..core import now_ms
from ..core.models import (
    AclEffect,
    AclEntry,
    AclRule,
    AgentRecord,
    TokenClaims,
    TokenRole,
    caller_matches,
    caller_may_call,
    compile_pattern,
)
from ..store import RedisErrors, RegionStore
from .polled import PolledList

__all__ = ["DEFAULT_ACL_POLL_INTERVAL_MS", "MAX_ACL_ENTRIES", "AclFull", "RegionAcl", "admits"]

log = logging.getLogger(__name__)

DEFAULT_ACL_POLL_INTERVAL_MS = 250
MAX_ACL_ENTRIES = 1_024  # rules and the deleted ones' entries
_LOG_MAXLEN = 10_000

# KEYS: the rules hash, its version, its log. ARGV: rule id, entry JSON, at (ms), max entries, log
# maxlen. Answers {1, version} when the entry was written; {0, version} when the hash holds a later
# one (or this one); {-1, version} when the hash is full.
SET_RULE = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
local at = tonumber(ARGV[3])
local version = tonumber(redis.call('GET', KEYS[2]) or '0')
if current then
  local held = tonumber(cjson.decode(current)['at_ms'])
  if held > at or (held == at and current >= ARGV[2]) then return {0, version} end
elseif redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then
  return {-1, version}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
version = redis.call('INCR', KEYS[2])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], version .. '-0', 'entry', ARGV[2])
return {1, version}
"""


class AclFull(ValueError):
    """The region holds :data:`MAX_ACL_ENTRIES` rules (deleted ones included) already."""


@dataclass(frozen=True, slots=True)
class _Compiled:
    agents: re.Pattern[str]
    capability: str | None
    callers: list[str]
    deny: bool


def _compiled(rule: AclRule) -> _Compiled:
    return _Compiled(agents=compile_pattern(rule.agents), capability=rule.capability, callers=list(rule.callers),
                     deny=rule.effect is AclEffect.DENY)


def _permits(rules: tuple[_Compiled, ...], caller: TokenClaims, agent_id: str, capability: str | None) -> bool:
    """Whether the rules let ``caller`` reach ``agent_id`` (by ``capability``, when routing by one)."""
    restricted = allowed = False
    for rule in rules:
        if (rule.capability is not None and rule.capability != capability) or not rule.agents.match(agent_id):
            continue
        named = caller_matches(caller.sub, caller.role, rule.callers)
        if rule.deny:
            if named:
                return False
        else:
            restricted, allowed = True, allowed or named
    return allowed or not restricted


def admits(caller: TokenClaims, record: AgentRecord, *, capability: str | None = None,
           acl: RegionAcl | None = None) -> bool:
    """Whether ``caller`` may see ``record`` (and be routed to its ``capability``, when given):
    its ``allowed_callers``, the capability's, and the region's rules (``acl``)."""
    if not caller_may_call(caller.sub, caller.role, record.agent_id, record.allowed_callers):
        return False
    if capability is not None:
        for offered in record.capabilities:
            if offered.name == capability and offered.allowed_callers and not caller_may_call(
                    caller.sub, caller.role, record.agent_id, offered.allowed_callers):
                return False
    return acl is None or acl.permits(caller, record.agent_id, capability)


class RegionAcl(PolledList):
    """The region's ACL rules; ``async with`` (or ``start()``/``aclose()``) runs the poll."""

    what = "ACL rules"

    def __init__(self, redis: aioredis.Redis, *, key_base: str, region: str,
                 poll_interval_ms: int = DEFAULT_ACL_POLL_INTERVAL_MS) -> None:
        super().__init__(redis, region=region, key_log=f"{key_base}:acl:log", poll_interval_ms=poll_interval_ms)
        self.key = f"{key_base}:acl"
        self.key_version = f"{key_base}:acl:version"
        self.version = -1  # none read yet
        self._entries: dict[str, AclEntry] = {}
        self._rules: tuple[_Compiled, ...] = ()
        self._made = 0
        self._set = redis.register_script(SET_RULE)

    @classmethod
    def of(cls, store: RegionStore, *, poll_interval_ms: int) -> RegionAcl:
        return cls(store.redis, key_base=store.key_base, region=store.region, poll_interval_ms=poll_interval_ms)

    # -- the check ---------------------------------------------------------------------------

    def permits(self, caller: TokenClaims, agent_id: str, capability: str | None = None) -> bool:
        """Whether the rules let ``caller`` reach ``agent_id`` (a rule naming a capability counts only
        when routing by it); admins, peers and the agent itself always."""
        if not self._rules or caller.role in (TokenRole.ADMIN, TokenRole.PEER) or caller.sub == agent_id:
            return True
        return _permits(self._rules, caller, agent_id, capability)

    def restricts(self, agent_id: str) -> bool:
        """Whether a rule is about ``agent_id`` as a whole (its card is then never public)."""
        return any(rule.capability is None and rule.agents.match(agent_id) for rule in self._rules)

    @property
    def active(self) -> bool:
        """Whether any rule is in force (the router's fast path checks nobody otherwise)."""
        return bool(self._rules)

    def entries(self) -> list[AclEntry]:
        """The rules in force, by id (deleted ones left out)."""
        return sorted((entry for entry in self._entries.values() if entry.rule is not None), key=lambda e: e.id)

    def every_entry(self) -> list[AclEntry]:
        """Every entry, deleted rules included: what the relay announces to the peers."""
        return list(self._entries.values())

    # -- changes -----------------------------------------------------------------------------

    async def set(self, rule_id: str, rule: AclRule | None) -> AclEntry:
        """Set (``rule``) or delete (None) the rule ``rule_id`` as this region's own change; raises
        :class:`StoreUnavailable` or :class:`AclFull`."""
        at = max(now_ms(), self._entries[rule_id].at_ms + 1 if rule_id in self._entries else 0)
        entry = AclEntry(id=rule_id, rule=rule, origin=self.region, at_ms=at)
        await self.apply(entry)
        return entry

    async def apply(self, entry: AclEntry) -> bool:
        """Write ``entry`` unless the region holds a later one (a peer's rule arriving over the
        federation keeps its origin); True when it was written. Raises :class:`StoreUnavailable`
        or :class:`AclFull`."""
        held = self._entries.get(entry.id)
        if held is not None and held.origin != self.region and held == entry:
            return False  # a peer's repeat (its relay announces every rule when it starts)
        async with RedisErrors(self.region):
            written, version = await self._set(keys=[self.key, self.key_version, self.key_log],
                                               args=[entry.id, entry.model_dump_json(), entry.at_ms,
                                                     MAX_ACL_ENTRIES, _LOG_MAXLEN])
        if written == -1:
            raise AclFull(f"region {self.region} holds {MAX_ACL_ENTRIES} ACL rules already; delete some first")
        self._made += 1
        if written == 1:
            self._entries[entry.id] = entry
            self._compile()
            self._changed.set()
        return written == 1

    async def read_log(self, *, after: str, count: int = 1_000) -> tuple[str, list[AclEntry]]:
        """The position of the last entry read and the log's entries after ``after``, oldest first;
        raises :class:`StoreUnavailable`. An entry that does not parse is skipped."""
        async with RedisErrors(self.region):
            found = await self.redis.xrange(self.key_log, min=f"({after}", count=count)
        return (str(found[-1][0]) if found else after), list(self._parsed(
            (str(position), fields.get("entry", "")) for position, fields in found))

    async def refresh(self, *, force: bool = False) -> None:
        """Read the rules again if their version moved (``force``: in any case); raises
        :class:`StoreUnavailable`."""
        made = self._made
        async with RedisErrors(self.region):
            version = int(await self.redis.get(self.key_version) or 0)
            if version == self.version and not force:
                return
            raw = await self.redis.hgetall(self.key)
        if made != self._made:
            return  # a change through this node raced the read: read again at the next poll
        self._entries = {entry.id: entry for entry in self._parsed(raw.items())}
        self._compile()
        if version != self.version and self.version >= 0:
            self._changed.set()
        self.version = version

    def _parsed(self, items: Iterable[tuple[str, str]]) -> Iterable[AclEntry]:
        for where, raw in items:
            try:
                yield AclEntry.model_validate_json(raw)
            except ValidationError:
                log.warning("region %s: ACL entry %s does not parse; skipped", self.region, where)

    def _compile(self) -> None:
        self._rules = tuple(_compiled(entry.rule) for entry in self._entries.values() if entry.rule is not None)
