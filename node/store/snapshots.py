"""Reading a whole region at once: the cache's load, the snapshot served to peers, the digest.

:class:`RegionSnapshots` reads the records, leases and loads :class:`~node.store.RegionStore`
writes (its client, its keys, its quarantine), never one record at a time: in HSCAN chunks,
parsed (the cache's load) or raw (the snapshot served to peers, spliced as stored), or every
agent's version at one instant (a digest). Each chunk is read as bytes: a value that is not UTF-8
is one record that does not parse, quarantined and left out, never a failed read
(``node.store.stored_bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redis.client import NEVER_DECODE

from ..core.models import AgentRecord, Load
from .connect import RedisErrors
from .loads import parse_load
from .read_ahead import read_ahead
from .stored_bytes import parse_record, read_region, text_of
from .stored_records import stored_version

if TYPE_CHECKING:
    from .region import RegionStore

__all__ = ["DEFAULT_SNAPSHOT_CHUNK", "RecordChunk", "RegionSnapshots", "SnapshotData", "StoredVersions"]

DEFAULT_SNAPSHOT_CHUNK = 2_000  # the HSCAN count hint: records per chunk
_PARSE_SLICE = 100  # records parsed between two turns of the event loop in a load

RecordChunk = tuple[list[str], list[str], list["float | None"]]  # agent ids, raw records, lease expiries


@dataclass(slots=True)
class SnapshotData:
    """Every parsed record of the region and the version V the change stream continues from."""

    version: int
    records: list[AgentRecord]


@dataclass(slots=True)
class StoredVersions:
    """The region version and, per agent, ``(version, lease expiry ms)`` consistent with it."""

    version: int
    agents: dict[str, tuple[int, int]]


class RegionSnapshots:
    """Whole-region reads of one region's records; ``RegionSnapshots(store)`` reads what ``store`` writes.

    Every read raises :class:`StoreUnavailable` when Redis cannot be reached. Consistency: read
    :meth:`version` before the first chunk (see :meth:`snapshot`).
    """

    def __init__(self, store: RegionStore) -> None:
        self.redis = store.redis
        self.region = store.region
        self.quarantine = store.quarantine
        self.key_agents = store.key_agents
        self.key_leases = store.key_leases
        self.key_version = store.key_version
        self.key_loads = store.key_loads
        self.record_key = store.record_key

    async def version(self) -> int:
        """The region version (0: nothing written yet)."""
        async with self._translate():
            return int(await self.redis.get(self.key_version) or 0)

    async def snapshot(self, *, chunk: int = DEFAULT_SNAPSHOT_CHUNK) -> SnapshotData:
        """All records, read in chunks (HSCAN, with their leases), and a version V such that
        applying the change stream after V to them gives the region exactly.

        V is read first; a record the scan returns may be newer than V (written during the
        scan), never older than its last change up to V, and a record removed during the scan
        is in the stream after V. A reader that replays the stream after V skipping entries older
        than the records it holds (``AgentIndex.apply``) is therefore exact, while only one
        chunk of raw JSON is in memory at a time (a 100,000-agent region is 70 MB of it).
        """
        version = await self.version()
        records: list[AgentRecord] = []
        async for parsed in self.parsed_chunks(chunk=chunk):
            records.extend(parsed)
        return SnapshotData(version=version, records=records)

    async def parsed_chunks(self, *, chunk: int = DEFAULT_SNAPSHOT_CHUNK) -> AsyncIterator[list[AgentRecord]]:
        """Every stored record with its lease and reported load, parsed, one HSCAN chunk at a
        time; read the version before the first (see :meth:`snapshot`). A record that does not
        parse — or is not UTF-8 — is quarantined and skipped."""
        quarantine, record_key = self.quarantine, self.record_key
        async with contextlib.aclosing(read_ahead(self._stored_chunks(chunk))) as chunks:
            async for ids, raw_records, leases, loads in chunks:
                records = []
                for at, (agent_id, raw, lease, load) in enumerate(zip(ids, raw_records, leases, loads), 1):
                    record = parse_record(agent_id, raw, lease_expires_at_ms=int(lease or 0), load=load,
                                          quarantine=quarantine, record_key=record_key)
                    if record is not None:
                        records.append(record)
                    if at % _PARSE_SLICE == 0:
                        await asyncio.sleep(0)  # the next chunk's round trips go on meanwhile
                yield records

    async def _stored_chunks(self, chunk: int) -> AsyncIterator[tuple[list[str], list[bytes], list, list[Load | None]]]:
        """The stored records as bytes in HSCAN chunks, with their leases and loads. Bytes: a
        value that is not UTF-8 fails its own parse, not the whole read (decoding the reply did)."""
        cursor = 0
        while True:
            async with self._translate():
                cursor, stored = await self.redis.execute_command("HSCAN", self.key_agents, cursor, "COUNT", chunk,
                                                                  **{NEVER_DECODE: True})
                ids = [text_of(agent_id) for agent_id in stored]
                leases: list = []
                loads: list = []
                if ids:
                    async with self.redis.pipeline(transaction=False) as pipe:  # one round trip
                        pipe.zmscore(self.key_leases, list(stored))
                        pipe.hmget(self.key_loads, ids)
                        leases, loads = await pipe.execute()
            yield ids, list(stored.values()), leases, [None if raw is None else parse_load(raw) for raw in loads]
            if cursor == 0:
                return

    async def chunks(self, *, chunk: int = DEFAULT_SNAPSHOT_CHUNK) -> AsyncIterator[RecordChunk]:
        """Every stored record in HSCAN chunks: ``(agent ids, raw records, lease expiries)`` (a
        lease None: none). Read the version before the first chunk (see :meth:`snapshot`)."""
        cursor = 0
        while True:
            async with self._translate():
                cursor, stored = await self.redis.execute_command("HSCAN", self.key_agents, cursor, "COUNT", chunk,
                                                                  **{NEVER_DECODE: True})
                raw_records = self._texts(stored)
                ids = list(raw_records)
                leases = await self.redis.zmscore(self.key_leases, ids) if ids else []
            yield ids, list(raw_records.values()), leases
            if cursor == 0:
                return

    async def snapshot_versions(self) -> StoredVersions:
        """Every agent's version and lease and the region version they are consistent with (one
        script): a digest's worth of :meth:`snapshot`.

        Versions are read off the stored JSON (``stored_version``) instead of validating every
        record, about a third of the cost. Agents the quarantine holds are left out (they are
        served to no peer); a record these scripts did not write is parsed, and quarantined and
        left out if it does not parse.
        """
        version, raw_records, lease_of = await self._read_region()
        agents: dict[str, tuple[int, int]] = {}
        for agent_id, raw in raw_records.items():
            if self.quarantine.holds_agent(agent_id):
                continue
            record_version = stored_version(raw)
            if record_version is None:
                record = self._parse_record(agent_id, raw)
                if record is None:
                    continue
                record_version = record.version
            agents[agent_id] = (record_version, lease_of.get(agent_id, 0))
        return StoredVersions(version=version, agents=agents)

    async def _read_region(self) -> tuple[int, dict[str, str], dict[str, int]]:
        """The region version, every stored record (raw) and every lease, at one instant (one script,
        ``node.store.stored_bytes.read_region``)."""
        async with self._translate():
            version, records, leases = await read_region(self.redis, (self.key_version, self.key_agents,
                                                                       self.key_leases))
        return version, self._texts(records), leases

    def _texts(self, stored: dict[bytes, bytes]) -> dict[str, str]:
        """Stored records read as bytes, as text; one that is not UTF-8 is quarantined and left out
        (decoding the whole reply raised: one such value failed every digest and snapshot)."""
        texts = {}
        for raw_id, raw in stored.items():
            agent_id = text_of(raw_id)
            try:
                texts[agent_id] = raw.decode()
            except UnicodeDecodeError:
                self._parse_record(agent_id, raw)  # quarantines it
        return texts

    def _parse_record(self, agent_id: str, raw: str | bytes) -> AgentRecord | None:
        return parse_record(agent_id, raw, lease_expires_at_ms=None, load=None, quarantine=self.quarantine,
                            record_key=self.record_key)

    def _translate(self) -> RedisErrors:
        return RedisErrors(self.region)
