"""Stored bytes that do not parse: skipped, counted, logged once, listed for the operator.

Every reader of stored data — the cache's snapshot and change-stream tail, the snapshot served
to peers, the federation consumer, replica and anti-entropy, start-up — parses one record or
event at a time. One that does not parse (written by a foreign writer, an older or newer
schema, a corrupted value) must not halt the reader, block a restart or stop federation: it
is put here instead, and the reader goes on as if the record were absent. An operator finds
the list on ``GET /v1/admin/quarantine`` and the count on ``/metrics``; a key is logged once,
not on every pass over it. When the same key later parses (the agent registered again), its
entry is resolved and leaves the list.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass

log = logging.getLogger(__name__)

DEFAULT_MAX_ENTRIES = 1_000
_MAX_ERROR_CHARS = 300
# The source of a region's current stored record: the only kind that makes its agent "bad" (a
# change entry is history; the agent may have registered again since).
RECORD = "record"


@dataclass(slots=True)
class QuarantinedItem:
    """One stored value that did not parse."""

    source: str        # where it was read: "record", "change", "snapshot", "kafka", "replica" …
    key: str           # where it lives, e.g. "ar:{eu}:agents/pay.risk.a" or "agent-reach.changes.eu@17"
    error: str         # the first validation problem
    agent_id: str | None
    first_seen_ms: int
    last_seen_ms: int
    seen: int = 1

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class Quarantine:
    """The quarantined values of one node (bounded: the oldest entries are dropped first)."""

    def __init__(self, *, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self.total = 0            # values quarantined since start (every sighting of a new key)
        self._items: OrderedDict[str, QuarantinedItem] = OrderedDict()
        self._bad_agents: dict[str, int] = {}  # agent_id -> number of open entries naming it

    def __len__(self) -> int:
        return len(self._items)

    def add(self, source: str, key: str, error: object, *, agent_id: str | None = None) -> None:
        """Record that the value at ``key`` does not parse; logs the first sighting only."""
        now = time.time_ns() // 1_000_000
        item = self._items.get(key)
        if item is not None:
            item.seen += 1
            item.last_seen_ms = now
            return
        text = str(error).replace("\n", " ")[:_MAX_ERROR_CHARS]
        self._items[key] = QuarantinedItem(source, key, text, agent_id, now, now)
        self.total += 1
        if source == RECORD and agent_id is not None:
            self._bad_agents[agent_id] = self._bad_agents.get(agent_id, 0) + 1
        log.warning("quarantined %s %s: it does not parse (%s); skipped, listed on /v1/admin/quarantine",
                    source, key, text)
        while len(self._items) > self.max_entries:
            _, dropped = self._items.popitem(last=False)
            if dropped.source == RECORD:
                self._forget_agent(dropped.agent_id)

    def resolve(self, key: str) -> None:
        """The value at ``key`` parses now (it was overwritten): drop its entry."""
        item = self._items.pop(key, None)
        if item is not None:
            if item.source == RECORD:
                self._forget_agent(item.agent_id)
            log.info("quarantine: %s parses again", key)

    def holds_agent(self, agent_id: str) -> bool:
        """Whether ``agent_id``'s current stored record is quarantined (not to be served)."""
        return agent_id in self._bad_agents

    def items(self) -> list[QuarantinedItem]:
        return list(self._items.values())

    def _forget_agent(self, agent_id: str | None) -> None:
        if agent_id is None:
            return
        left = self._bad_agents.get(agent_id, 0) - 1
        if left > 0:
            self._bad_agents[agent_id] = left
        else:
            self._bad_agents.pop(agent_id, None)


__all__ = ["DEFAULT_MAX_ENTRIES", "RECORD", "QuarantinedItem", "Quarantine"]
