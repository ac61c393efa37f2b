"""What :class:`node.store.RegionStore` answers with: plain values, no behaviour of their own."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.models import AgentRecord

__all__ = ["HeartbeatResult", "SnapshotData", "StoredVersions"]


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


@dataclass(slots=True)
class SnapshotData:
    version: int
    records: list[AgentRecord]


@dataclass(slots=True)
class StoredVersions:
    """The region version and, per agent, ``(version, lease expiry ms)`` consistent with it."""

    version: int
    agents: dict[str, tuple[int, int]]
