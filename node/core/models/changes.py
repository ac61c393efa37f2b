"""One change of a region — an upsert, a status change or a deletion — as its change stream,
the watch feed and federation carry it. This module does no I/O.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field

from .fields import AgentId, Count, Millis, Region, Strict
from .records import AgentRecord


class ChangeKind(str, enum.Enum):
    UPSERT = "upsert"
    STATUS = "status"
    DELETE = "delete"


class DeleteReason(str, enum.Enum):
    DEREGISTERED = "deregistered"
    EXPIRED = "expired"
    EVICTED = "evicted"
    QUARANTINED = "quarantined"   # its stored record does not parse (see node.store.quarantine)


class ChangeEvent(Strict):
    """One entry of a region's change stream (and, later, of its Kafka topic).

    A delete carries no record, but keeps the ``allowed_callers`` of the record it removed, so
    a watcher who may not see the agent does not see its tombstone either.
    """

    kind: ChangeKind
    region: Region
    version: Count
    agent_id: AgentId
    at_ms: Millis
    record: AgentRecord | None = None
    reason: DeleteReason | None = None
    allowed_callers: list[Annotated[str, Field(max_length=200)]] | None = Field(
        default=None, max_length=64, description="Deletes only: who could see the removed record.")

    @property
    def audience(self) -> list[str]:
        """``allowed_callers`` of the record this change is about (empty = anyone)."""
        if self.record is not None:
            return self.record.allowed_callers
        return self.allowed_callers or []
