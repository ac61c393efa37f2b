"""Which records a listing selects: ``GET /v1/agents``'s capability, id pattern, labels and tags.

The same selectors the router matches candidates by (a capability's tags as
:func:`~node.routing.candidates.tagged` reads them). Which indexes are read, whether a record is
routable and whether the caller may see it are the node's to decide (``RegistryNode.list_agents``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from ..core.models import AgentRecord, Scope
from ..view import AgentIndex
from .candidates import capability_of, tagged

__all__ = ["AgentQuery", "reachable_transports"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentQuery:
    """A listing's selectors; every one given must hold (none given: every record)."""

    scope: Scope = Scope.LOCAL_FIRST  # LOCAL: this region's records only; otherwise the peers' replicas too
    capability: str | None = None  # offers this capability
    agent_id: re.Pattern[str] | None = None  # the agent id matches (a compiled glob such as lang.*.*)
    labels: Mapping[str, str] = field(default_factory=dict)  # carries each label with this value
    tags: Sequence[str] = ()  # the capability (or, without one, any capability) carries every tag
    routable_only: bool = False  # only records the router would consider (checked by the node)

    def select(self, index: AgentIndex) -> Iterator[AgentRecord]:
        """The records of ``index`` the selectors match, in the index's order."""
        records = index.with_capability(self.capability).values() if self.capability else index
        for record in records:
            if self.agent_id is not None and not self.agent_id.match(record.agent_id):
                continue
            if self.labels and any(record.labels.get(key) != value for key, value in self.labels.items()):
                continue
            if self.tags and tagged(record, capability_of(record, self.capability) if self.capability else None,
                                    self.tags) is None:
                continue
            yield record


def reachable_transports(index: AgentIndex, *, agent_id: str | None, capability: str | None) -> list[str]:
    """The transports of the records in ``index`` a request by ``agent_id`` (else ``capability``)
    could be routed to: what proxy mode knows of its targets before routing."""
    found = [index.get(agent_id)] if agent_id else list(index.with_capability(capability or "").values())
    return [record.transport for record in found if record is not None]
