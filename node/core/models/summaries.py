"""A region's per-capability summary: what peers route by instead of every agent's load.

The leader of a region sends one every ``summary_interval_ms`` (``federation.summary``); peers
keep the latest per region and spill traffic across regions by it (``node.routing.spill``). A summary
counts what the home region would route to now — its records carry live load, which peers'
replicas do not — so a peer weighs a region by its summary, never by the stale load of the
replicated records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import Field

from .fields import CAPABILITY_NAME_PATTERN, Count, Region, Strict
from .versions import VersionConstraint, parse_version

__all__ = ["CapabilitySummary", "RegionSummary", "SummaryView"]


class CapabilitySummary(Strict):
    """One capability of a region: how many agents offer it, how many are routable, and how loaded.

    ``weight`` is the summed registered weight × status factor of the healthy agents; ``load``
    their summed inflight + queued requests and ``capacity`` their summed ``max_concurrency``
    (10 for an agent without one), so ``load / capacity`` is the capability's utilisation there.
    """

    name: str = Field(pattern=CAPABILITY_NAME_PATTERN)
    total: Count
    healthy: Count
    weight: float = Field(ge=0.0, le=1e15)
    load: Count = 0
    capacity: Count = 0
    versions: dict[str, Count] = Field(default_factory=dict, description="Version offered -> healthy agents.")

    @property
    def utilisation(self) -> float:
        return self.load / self.capacity if self.capacity else 0.0

    def serving_weight(self, constraint: VersionConstraint | None = None) -> float:
        """The share of traffic this region can take for the capability: healthy weight (only the
        versions ``constraint`` accepts, pro rata by agents) discounted by utilisation as one
        agent's weight is by its load (÷ (1 + utilisation)). 0 when nobody healthy can serve."""
        if self.healthy == 0 or self.weight <= 0:
            return 0.0
        weight = self.weight
        if constraint is not None:
            accepted = sum(count for version, count in self.versions.items() if _accepts(constraint, version))
            weight *= accepted / self.healthy
        return weight / (1.0 + self.utilisation)


class RegionSummary(Strict):
    """One region's capabilities at ``watermark``; a big region's is split into ``parts`` messages
    of the same ``generation`` (a reader applies a generation once all of its parts arrived)."""

    region: Region
    watermark: Count = Field(description="The region's version when the summary was computed.")
    sent_at_ms: Count
    generation: Count = Field(description="Grows with every summary the region sends.")
    part: Count = 0
    parts: int = Field(default=1, ge=1, le=10_000)
    agents: Count = Field(default=0, description="Agents of the region (every part says the same).")
    capabilities: list[CapabilitySummary] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SummaryView:
    """A complete generation of a region's summary, its capabilities by name (what routing reads)."""

    region: str
    watermark: int
    sent_at_ms: int
    generation: int
    agents: int
    capabilities: Mapping[str, CapabilitySummary]

    @classmethod
    def of(cls, parts: Sequence[RegionSummary]) -> SummaryView:
        """The view of one generation's parts (every part of it, in any order); raises ValueError
        when they are not exactly one generation's parts."""
        if not parts:
            raise ValueError("a summary has at least one part")
        first = parts[0]
        numbers = sorted(part.part for part in parts)
        if numbers != list(range(first.parts)) or any(
                (part.region, part.generation, part.parts) != (first.region, first.generation, first.parts)
                for part in parts):
            raise ValueError(f"parts {numbers} are not the {first.parts} parts of one generation")
        return cls(region=first.region, watermark=first.watermark, sent_at_ms=first.sent_at_ms,
                   generation=first.generation, agents=first.agents,
                   capabilities={c.name: c for part in parts for c in part.capabilities})

    def serving_weight(self, capability: str, constraint: VersionConstraint | None = None) -> float:
        """What the region can take of ``capability`` (0 when it does not offer it or nobody healthy does)."""
        found = self.capabilities.get(capability)
        return found.serving_weight(constraint) if found is not None else 0.0


def _accepts(constraint: VersionConstraint, version: str) -> bool:
    try:
        return constraint.accepts(parse_version(version))
    except ValueError:
        return False

