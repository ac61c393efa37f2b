"""The digest of a region: what a beacon states and what a replica must match.

The digest is the XOR of a 64-bit hash of every ``(agent_id, version)`` the region holds:
independent of order and updated one record at a time, so both sides keep it incrementally —
the replica as it applies changes, the publisher as it sends them (:class:`DigestTracker`).
Reading a whole region to compute it (``RegionSnapshots.snapshot_versions``) is for start-up and a
periodic check only: the store reads the versions off the stored JSON instead of validating
every record (``snapshot()`` costs about 40 ms per thousand agents; this about a third of
that, and the tracker nothing).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from node.core.models import AgentRecord, ChangeEvent, ChangeKind
from node.store import RegionSnapshots, RegionStore

DIGEST_HEX_CHARS = 16


def entry_hash(agent_id: str, version: int) -> int:
    """The 64-bit hash one ``(agent_id, version)`` contributes to a digest."""
    return int.from_bytes(hashlib.blake2b(f"{agent_id}\x00{version}".encode(), digest_size=8).digest(), "big")


def digest_hex(value: int) -> str:
    return f"{value:0{DIGEST_HEX_CHARS}x}"


def region_digest(records: Iterable[AgentRecord]) -> tuple[str, int]:
    """Digest (hex) and count of a set of records."""
    value = 0
    count = 0
    for record in records:
        value ^= entry_hash(record.agent_id, record.version)
        count += 1
    return digest_hex(value), count


@dataclass(slots=True)
class RegionState:
    """A region's version and, per agent, ``(version, lease expiry ms)``."""

    version: int
    agents: dict[str, tuple[int, int]] = field(default_factory=dict)

    def live_digest(self, *, at_ms: int) -> tuple[str, int]:
        """Digest and count of the agents whose lease has not passed (what a snapshot serves)."""
        value = 0
        live = 0
        for agent_id, (version, lease_expires_at_ms) in self.agents.items():
            if lease_expires_at_ms > at_ms:
                value ^= entry_hash(agent_id, version)
                live += 1
        return digest_hex(value), live


async def read_region_state(store: RegionStore) -> RegionState:
    """Version, agent versions and leases of the region, read consistently
    (``RegionSnapshots.snapshot_versions``: quarantined records are in no digest, as no peer is
    served them).

    Raises :class:`~node.core.errors.StoreUnavailable` when Redis cannot be reached.
    """
    stored = await RegionSnapshots(store).snapshot_versions()
    return RegionState(version=stored.version, agents=stored.agents)


class DigestTracker:
    """``(agent_id -> version)`` of a region at ``version``, advanced by its consecutive changes.

    ``version`` is -1 until :meth:`reset` and again after a change that does not follow on
    (the change stream was trimmed, Redis went back): the caller then reads the region again.
    """

    __slots__ = ("version", "versions", "_value")

    def __init__(self) -> None:
        self.version = -1
        self.versions: dict[str, int] = {}
        self._value = 0

    @property
    def digest(self) -> str:
        return digest_hex(self._value)

    def reset(self, state: RegionState) -> None:
        self.version = state.version
        self.versions = {agent_id: version for agent_id, (version, _) in state.agents.items()}
        self._value = 0
        for agent_id, version in self.versions.items():
            self._value ^= entry_hash(agent_id, version)

    def advance(self, event: ChangeEvent) -> None:
        """Apply the next change (ones at or below ``version`` are already counted)."""
        if self.version < 0 or event.version <= self.version:
            return
        if event.version != self.version + 1:
            self.version = -1
            return
        previous = self.versions.pop(event.agent_id, None)
        if previous is not None:
            self._value ^= entry_hash(event.agent_id, previous)
        if event.kind is not ChangeKind.DELETE:
            self.versions[event.agent_id] = event.version
            self._value ^= entry_hash(event.agent_id, event.version)
        self.version = event.version
