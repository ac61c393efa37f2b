"""The region's truth in Redis: records, leases, the region version and the change stream.

Layout (every key carries the hash tag ``{region}``: the region is one hash slot, so each Lua
script and pipeline stays on one Redis Cluster node — ``node.store.connect`` finds which)::

    {prefix}:{region}:agents    HASH   agent_id -> record JSON (its "version" spliced in first)
    {prefix}:{region}:leases    ZSET   agent_id -> lease expiry, ms since the epoch
    {prefix}:{region}:version   STRING region version, bumped by every change
    {prefix}:{region}:changes   STREAM one entry per change, id "<version>-0", capped
    {prefix}:{region}:loads     HASH   agent_id -> the load it reported last (JSON), since its record
                                       was written; published on the channel of the same name

Other rooms keep their own keys under the same hash tag (``RegionStore.key_base``), on this store's
connections: the leader lease (``node.duties.leader``), the revoked tokens (``node.trust``) ….

Load is soft state and stays home: a report stores it and publishes it (``node.store.loads`` follows
the channel on every replica) without a version or a stream entry, so it never travels to peers.

Every mutation is ONE Lua script (``node.store.scripts``): bump the version, write the record,
move the lease and append the change entry, so a change is in Redis and in the stream or
nowhere (transactional outbox). A heartbeat that changes nothing but the lease only moves the
lease. Concurrent registrations and updates (heartbeats, probe verdicts) are coalesced into one
script call per batch (``node.store.batch``: group commit, no waiting at low load); each keeps its own
answer and its own error. Only Redis 6.2 commands.

Lease expiry in the records is not rewritten by heartbeats: the ``leases`` sorted set is the
truth, and readers merge it into the records they load.

A stored record or change entry that does not parse never stops a reader: it goes to the
store's :class:`~node.store.quarantine.Quarantine` and reads as absent (a change entry for an agent
whose record does not parse reads as that agent's deletion, reason ``quarantined``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import redis.asyncio as aioredis
from pydantic import Field
from redis.client import NEVER_DECODE

from ..core import Conflict, UnknownAgent, now_ms
from ..core.models import AgentRecord, ChangeEvent, DeleteReason, Load
from .batch import Coalescer
from .connect import DEFAULT_WAIT_TIMEOUT_MS, RedisConnectSettings, RedisErrors, redis_client
from .locate import primary_moved
from .loads import parse_load
from .quarantine import Quarantine
from .script_line import ScriptLine, Unreplicated
from .scripts import DELETE, REGISTER, RENEW, UPDATE
from .stored_bytes import parse_change, parse_record, text_of
from .stored_records import WrittenRecords, stored_version

__all__ = ["DEFAULT_CHANGE_STREAM_MAXLEN", "DEFAULT_KEY_PREFIX", "HeartbeatResult", "RedisErrors", "RegionStore",
           "StoreSettings", "now_ms", "stored_version"]

DEFAULT_KEY_PREFIX = "ar"
DEFAULT_CHANGE_STREAM_MAXLEN = 100_000
_CAS_ATTEMPTS = 8
_LEASE_BATCH = 1_000
_LOAD_SCAN_CHUNK = 2_000


class StoreSettings(RedisConnectSettings):
    """The store's layout in the region's Redis, and how it is reached (``NodeConfig`` inherits them)."""

    key_prefix: str = Field(default=DEFAULT_KEY_PREFIX,
                            description="Prefix of every Redis key (and of the federation's replica keys).")
    change_stream_maxlen: int = Field(default=DEFAULT_CHANGE_STREAM_MAXLEN, ge=100,
                                      description="Entries the region's change stream keeps (about; peers heal a "
                                                  "longer gap by anti-entropy).")


@dataclass(slots=True, frozen=True)
class HeldChange:
    """A change entry the reader already holds (see :meth:`RegionStore.read_changes`): its version only."""

    version: int


@dataclass(slots=True)
class HeartbeatResult:
    """What :meth:`RegionStore.update` stored: the version and lease, and whether the record changed.

    A lease-only heartbeat builds no record (``record`` makes one when asked): the hot path
    answers from ``version`` and ``lease_expires_at_ms``.
    """

    version: int
    lease_expires_at_ms: int
    changed: bool
    stored: AgentRecord  # the changed record as stored; unchanged: the record before this update

    @property
    def record(self) -> AgentRecord:
        if self.changed:
            return self.stored
        return self.stored.model_copy(update={"version": self.version, "lease_expires_at_ms": self.lease_expires_at_ms})


class RegionStore:
    """Async access to one region's records in Redis: its writes, and reads of a record, a lease
    or a change at a time (a whole region is read by :class:`~node.store.snapshots.RegionSnapshots`).

    Raises :class:`StoreUnavailable` when Redis cannot be reached; never leaves a half-written
    change behind (every mutation is one script).
    """

    def __init__(self, redis: aioredis.Redis, *, region: str, key_prefix: str = DEFAULT_KEY_PREFIX,
                 change_stream_maxlen: int = DEFAULT_CHANGE_STREAM_MAXLEN,
                 quarantine: Quarantine | None = None, wait_replicas: int = 0,
                 wait_timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS) -> None:
        self.redis = redis
        self.region = region
        self.quarantine = quarantine if quarantine is not None else Quarantine()  # an empty one is falsy
        base = f"{key_prefix}:{{{region}}}"
        self.key_agents = f"{base}:agents"
        self.key_leases = f"{base}:leases"
        self.key_version = f"{base}:version"
        self.key_changes = f"{base}:changes"
        self.key_loads = self.load_channel = f"{base}:loads"
        self.key_base = base
        # Session liveness (node.view.suspects): marks and holders, cleared with the record they name.
        self.key_suspects = f"{base}:suspects"
        self.key_holders = f"{base}:holders"
        self.change_stream_maxlen = change_stream_maxlen
        self._mutation_keys = [self.key_agents, self.key_leases, self.key_version, self.key_changes, self.key_loads]
        self._delete_keys = [*self._mutation_keys, self.key_suspects, self.key_holders]
        # Each coalescer's own connection, batch after batch; with wait_replicas every batch is
        # acknowledged once that many replicas hold it (WAIT), as a deletion is (_remove).
        self._wait = (wait_replicas, wait_timeout_ms)
        self._register = ScriptLine(redis, REGISTER, wait_replicas=wait_replicas, wait_timeout_ms=wait_timeout_ms)
        self._update = ScriptLine(redis, UPDATE, wait_replicas=wait_replicas, wait_timeout_ms=wait_timeout_ms)
        self._renew = ScriptLine(redis, RENEW, wait_replicas=wait_replicas, wait_timeout_ms=wait_timeout_ms)
        self._registers: Coalescer[list[object], tuple[int, bool]] = Coalescer(
            self._flush_registers, name=f"store-registers-{region}")
        self._updates: Coalescer[list[object], tuple[int, str]] = Coalescer(
            self._flush_updates, name=f"store-updates-{region}")
        self._renewals: Coalescer[tuple[str, int, int], bool] = Coalescer(
            self._flush_renewals, name=f"store-renewals-{region}")
        # What /metrics shows of them: scripts sent and writes carried, by kind (their ratio: the mean batch).
        self.write_batches: dict[str, Coalescer[list[object], object]] = {
            "register": self._registers, "update": self._updates, "renew": self._renewals}  # type: ignore[dict-item]
        self._written = WrittenRecords()  # read back from the stream without validating again
        self._delete = redis.register_script(DELETE)

    @classmethod
    def from_url(cls, url: str, *, region: str, key_prefix: str = DEFAULT_KEY_PREFIX,
                 connect: RedisConnectSettings | None = None, **options: object) -> RegionStore:
        """A store on a new connection pool (``node.store.connect``: a server, a cluster or a
        Sentinel-managed primary); ``aclose()`` closes it. Raises :class:`~node.store.connect.RedisUrlError`."""
        client = redis_client(url, key_base=f"{key_prefix}:{{{region}}}", settings=connect)
        if connect is not None:
            options.update(wait_replicas=connect.redis_wait_replicas, wait_timeout_ms=connect.redis_wait_timeout_ms)
        return cls(client, region=region, key_prefix=key_prefix, **options)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        await self._register.aclose()
        await self._update.aclose()
        await self._renew.aclose()
        await self.redis.aclose()

    async def ping(self) -> None:
        async with self._translate():
            await self.redis.ping()

    # -- mutations ---------------------------------------------------------------------------

    async def register(self, record: AgentRecord, *, at_ms: int) -> tuple[AgentRecord, bool]:
        """Upsert a record (its lease from ``record.lease_expires_at_ms``); returns it versioned,
        and whether no record of that agent was stored (decided inside the script, so of
        concurrent first registrations exactly one is new)."""
        body = record.model_dump_json(exclude={"version"})
        self._written.remember(record.agent_id, body, record)
        version, created = await self._registers.submit([record.agent_id, body, record.lease_expires_at_ms, at_ms])
        return record.model_copy(update={"version": version}), created

    async def update(self, agent_id: str, mutate: Callable[[AgentRecord], AgentRecord | None], *,
                     at_ms: int, known: AgentRecord | None = None, renew_lease: bool = False,
                     load: Load | None = None) -> HeartbeatResult:
        """Change one record with optimistic concurrency.

        ``mutate`` gets the current record and returns the changed one, or ``None`` when
        nothing but the lease changes (then no version is bumped and nothing is appended).
        ``known`` is the caller's best guess of the current record (saves a read); a
        concurrent change is detected by version and ``mutate`` is applied again to the
        fresh record. With ``renew_lease`` (a heartbeat) the lease must not have passed and
        is moved to ``at_ms + lease_ttl_ms``. A ``load`` is stored apart from the record (no
        version, no stream entry; see the module docstring). Raises :class:`UnknownAgent` when the agent is
        not stored (or its lease has passed), :class:`Conflict` after repeated races.
        """
        current = known
        load_json = "" if load is None else load.model_dump_json()
        for _ in range(_CAS_ATTEMPTS):
            if current is None:
                current = await self.get(agent_id)
                if current is None:
                    raise UnknownAgent(f"agent {agent_id} is not registered in region {self.region}: register again",
                                       field="agent_id")
            lease_expires_at_ms = at_ms + current.lease_ttl_ms if renew_lease else None
            lease = current.lease_expires_at_ms if lease_expires_at_ms is None else lease_expires_at_ms
            changed = mutate(current)
            if changed is None:
                expected, body = "", ""
            else:
                changed = changed.model_copy(update={"updated_at_ms": at_ms, "lease_expires_at_ms": lease})
                expected, body = str(current.version), changed.model_dump_json(exclude={"version"})
                self._written.remember(agent_id, body, changed)
            outcome, value = await self._updates.submit(
                [agent_id, expected, body, "" if lease_expires_at_ms is None else lease_expires_at_ms, at_ms,
                 "1" if renew_lease else "0", load_json])
            if outcome == 0:
                raise self._no_lease(agent_id)
            if outcome == 1:
                return HeartbeatResult(int(value), lease, changed=False, stored=current)
            if outcome == 2 and changed is not None:
                version = int(value)
                return HeartbeatResult(version, lease, changed=True, stored=changed.model_copy(update={"version": version}))
            current = self._parse_record(agent_id, value, lease_expires_at_ms=current.lease_expires_at_ms)
            if current is None:
                raise UnknownAgent(f"the stored record of {agent_id} in region {self.region} does not parse "
                                   "(quarantined): register again", field="agent_id")
        raise Conflict(f"agent {agent_id} kept changing under concurrent updates; retry")

    async def renew_leases(self, leases: list[tuple[str, int]], *, at_ms: int) -> list[bool | BaseException]:
        """Move each ``(agent_id, lease expiry ms)`` lease that has not passed at ``at_ms``: no read of
        the record, no version, no event (many at once: a session's frame). Per lease True, False
        when there is none to move (register again), or the batch's error (``StoreUnavailable``)."""
        return await self._renewals.submit_many([(agent_id, expiry, at_ms) for agent_id, expiry in leases])

    async def report_loads(self, loads: list[tuple[str, Load]], *, at_ms: int) -> list[bool | BaseException]:
        """:meth:`report_load` of many at once: per load True, False (no lease), or the batch's error."""
        results = await self._updates.submit_many([[agent_id, "", "", "", at_ms, "1", load.model_dump_json()]
                                                   for agent_id, load in loads])
        return [result if isinstance(result, BaseException) else result[0] != 0 for result in results]

    async def report_load(self, agent_id: str, load: Load, *, at_ms: int) -> None:
        """Store the load an agent reports (its lease must not have passed; the lease is not
        moved); raises :class:`UnknownAgent` otherwise."""
        outcome, _ = await self._updates.submit([agent_id, "", "", "", at_ms, "1", load.model_dump_json()])
        if outcome == 0:
            raise self._no_lease(agent_id)

    async def loads(self, agent_ids: list[str]) -> list[Load | None]:
        """The loads reported since their records were written, one per agent (None: none)."""
        async with self._translate():
            raws = await self.redis.hmget(self.key_loads, agent_ids) if agent_ids else []
        return [None if raw is None else parse_load(raw) for raw in raws]

    async def all_loads(self) -> dict[str, Load]:
        """Every load reported since its record was written, read in HSCAN chunks."""
        loads: dict[str, Load] = {}
        async with self._translate():
            async for agent_id, raw in self.redis.hscan_iter(self.key_loads, count=_LOAD_SCAN_CHUNK):
                load = parse_load(raw)
                if load is not None:
                    loads[agent_id] = load
        return loads

    async def _flush_registers(self, items: list[list[object]]) -> list[tuple[int, bool] | BaseException]:
        """One REGISTER call for a batch of ``[agent_id, body, lease expiry, at]``."""
        return [(int(version), bool(created)) for version, created in await self._run_batch(self._register, items)]

    async def _flush_updates(self, items: list[list[object]]) -> list[tuple[int, str] | BaseException]:
        """One UPDATE call for a batch of ``[agent_id, expected, body, lease, at, require lease, load]``."""
        return [(int(outcome), value) for outcome, value in await self._run_batch(self._update, items)]

    async def _flush_renewals(self, items: list[tuple[str, int, int]]) -> list[bool | BaseException]:
        """One RENEW call for a batch of ``(agent_id, lease expiry, at)`` (the first item's instant for all)."""
        lines = "\n".join([f"{agent_id} {lease}" for agent_id, lease, _ in items])
        async with self._translate():
            reply = await self._renew(self._mutation_keys, [self.change_stream_maxlen, self.load_channel, items[0][2],
                                                            lines])
        moved = reply.decode() if isinstance(reply, bytes) else str(reply)
        return [flag == "1" for flag in moved]

    async def _run_batch(self, script: ScriptLine, items: list[list[object]]) -> list[tuple[object, object]]:
        """Run a batch script over ``items``; its flat reply as one pair per item."""
        async with self._translate():
            reply = await script(self._mutation_keys,
                                 [self.change_stream_maxlen, self.load_channel, *(v for item in items for v in item)])
        return list(zip(reply[::2], reply[1::2]))

    async def deregister(self, agent_id: str, *, at_ms: int,
                         reason: DeleteReason = DeleteReason.DEREGISTERED) -> int | None:
        """Remove a record and append a tombstone; returns its version, or None if unknown."""
        removed = await self._remove([agent_id], at_ms=at_ms, reason=reason, only_if_expired=False)
        return removed.get(agent_id)

    async def expire(self, agent_ids: Iterable[str], *, at_ms: int) -> dict[str, int]:
        """Remove the given agents whose lease has passed at ``at_ms`` (re-checked atomically)."""
        return await self._remove(list(agent_ids), at_ms=at_ms, reason=DeleteReason.EXPIRED, only_if_expired=True)

    async def _remove(self, agent_ids: list[str], *, at_ms: int, reason: DeleteReason,
                      only_if_expired: bool) -> dict[str, int]:
        if not agent_ids:
            return {}
        args = [at_ms, self.change_stream_maxlen, reason.value, "1" if only_if_expired else "0", *agent_ids]
        replicas, timeout_ms = self._wait
        async with self._translate():
            if replicas == 0:
                reply = await self._delete(keys=self._delete_keys, args=args)
            else:  # WAIT counts what its own connection wrote: the same pipeline
                for attempt in range(2):  # again once if a replaced primary took it (node.store.locate)
                    async with self.redis.pipeline(transaction=False) as pipe:
                        await self._delete(keys=self._delete_keys, args=args, client=pipe)
                        pipe.execute_command("WAIT", replicas, timeout_ms)
                        reply, confirmed = await pipe.execute()
                    if int(confirmed) >= replicas or attempt == 1 or not await primary_moved(self.redis):
                        break
                if int(confirmed) < replicas:
                    raise Unreplicated(f"the deletion is on the primary, but WAIT confirmed it on fewer than {replicas}"
                                       f" replicas within {timeout_ms} ms (redis_wait_replicas): retry it")
        return {reply[i]: int(reply[i + 1]) for i in range(0, len(reply), 2)}

    # -- reads -------------------------------------------------------------------------------

    async def get(self, agent_id: str) -> AgentRecord | None:
        async with self._translate():
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hget(self.key_agents, agent_id)
                pipe.zscore(self.key_leases, agent_id)
                pipe.hget(self.key_loads, agent_id)
                raw, lease, raw_load = await pipe.execute()
        if raw is None:
            return None
        load = None if raw_load is None else parse_load(raw_load)
        return self._parse_record(agent_id, raw, lease_expires_at_ms=int(lease or 0), load=load)

    async def version(self) -> int:
        async with self._translate():
            return int(await self.redis.get(self.key_version) or 0)

    async def leases(self, agent_ids: list[str]) -> dict[str, int]:
        """Lease expiry (ms) of the given agents (those still stored)."""
        async with self._translate():
            found: dict[str, int] = {}
            for start in range(0, len(agent_ids), _LEASE_BATCH):
                batch = agent_ids[start:start + _LEASE_BATCH]
                scores = await self.redis.zmscore(self.key_leases, batch)
                found.update((agent_id, int(score)) for agent_id, score in zip(batch, scores) if score is not None)
            return found

    async def expired_ids(self, *, now_ms: int, limit: int) -> list[str]:
        async with self._translate():
            return await self.redis.zrangebyscore(self.key_leases, "-inf", now_ms, start=0, num=limit)

    async def passed_lease_count(self, *, now_ms: int) -> int:
        """How many stored agents' leases have passed at ``now_ms`` (expiries the sweeper has yet to write)."""
        async with self._translate():
            return int(await self.redis.zcount(self.key_leases, "-inf", now_ms))

    async def count(self) -> int:
        async with self._translate():
            return int(await self.redis.zcard(self.key_leases))

    async def read_changes(self, *, after_version: int, block_ms: int | None = None, count: int = 1_000,
                           held: Callable[[str, int], bool] | None = None) -> list[ChangeEvent | HeldChange]:
        """Change entries after ``after_version`` (blocking up to ``block_ms`` for the first).

        An entry of an agent at a version ``held(agent_id, version)`` says the reader holds already
        comes back as a :class:`HeldChange`, not parsed: the region cache reading back its own
        writes (applied ahead of the stream), which was ~10 % of a registration's CPU.
        """
        async with self._translate():
            # Bytes, as the load reads the hash: a value that is not UTF-8 fails its own entry
            # (node.store.stored_bytes), not the whole read.
            if block_ms is None:
                entries = await self.redis.execute_command("XRANGE", self.key_changes, f"({after_version}-0", "+",
                                                           "COUNT", count, **{NEVER_DECODE: True})
            else:
                reply = await self.redis.execute_command("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS",
                                                         self.key_changes, f"{after_version}-0",
                                                         **{NEVER_DECODE: True})
                entries = reply[0][1] if reply else []
        changes: list[ChangeEvent | HeldChange] = []
        for entry_id, fields in entries:
            if held is not None:
                agent_id, version = fields.get(b"agent_id"), int(text_of(entry_id).split("-", 1)[0])
                if agent_id is not None and held(text_of(agent_id), version):
                    changes.append(HeldChange(version))
                    continue
            change = self.parse_change(entry_id, fields)
            if change is not None:
                changes.append(change)
        return changes

    async def first_change_version(self) -> int | None:
        """Version of the oldest entry still in the (capped) stream."""
        async with self._translate():
            entries = await self.redis.xrange(self.key_changes, count=1)
        return int(entries[0][0].split("-", 1)[0]) if entries else None

    def parse_change(self, entry_id: str | bytes, fields: Mapping[str | bytes, str | bytes]) -> ChangeEvent | None:
        """One change-stream entry as a :class:`ChangeEvent`, or quarantined (``node.store.stored_bytes``)."""
        return parse_change(entry_id, fields, region=self.region, stream_key=self.key_changes, written=self._written,
                            quarantine=self.quarantine, record_key=self.record_key)

    def record_key(self, agent_id: str) -> str:
        """Where an agent's record lives, as the quarantine names it."""
        return f"{self.key_agents}/{agent_id}"

    # -- helpers -----------------------------------------------------------------------------

    def _parse_record(self, agent_id: str, raw: str | bytes, *, lease_expires_at_ms: int | None,
                      load: Load | None = None) -> AgentRecord | None:
        """A stored record, or None (quarantined) when it does not parse."""
        return parse_record(agent_id, raw, lease_expires_at_ms=lease_expires_at_ms, load=load,
                            quarantine=self.quarantine, record_key=self.record_key)

    def vet_record_json(self, agent_id: str, raw: str) -> bool:
        """Whether a stored record parses (quarantining it if not), for callers serving raw JSON."""
        return self._parse_record(agent_id, raw, lease_expires_at_ms=None) is not None

    def _no_lease(self, agent_id: str) -> UnknownAgent:
        return UnknownAgent(f"agent {agent_id} has no lease in region {self.region}: register again", field="agent_id")

    def _translate(self) -> RedisErrors:
        return RedisErrors(self.region)

