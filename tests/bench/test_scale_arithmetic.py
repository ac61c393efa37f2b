"""docs/SCALE.md's claims, from the arithmetic that prints its table (no server: sizes are encoded in process)."""

from __future__ import annotations

import pytest

from bench.federation_scale import Params, topology_of
from bench.scale_arithmetic import MEMORY_LIMIT_GB, Assumptions, measure_sizes, rows

pytestmark = pytest.mark.unit


def test_fifty_regions_of_a_million_agents_fit_a_node_only_with_partial_replication() -> None:
    sizes = measure_sizes()
    # the messages are what the publisher sends: a full record is most of an upsert
    assert sizes.record_json < sizes.upsert < sizes.record_json + 300
    assert sizes.beacon < 300 and sizes.delete < sizes.upsert
    found = {(row.regions, row.agents, row.mode): row for row in rows(sizes, Assumptions(), depths=(1, 0))}
    big = {mode: found[(50, 1_000_000, mode)] for mode in ("before", "after full", "after depth 1", "after depth 0")}
    limit = MEMORY_LIMIT_GB * 1e9
    assert big["after depth 0"].memory_gib * 2**30 <= limit < big["after full"].memory_gib * 2**30
    assert big["after depth 0"].records == 1_000_000
    # load stays home: what a node applies no longer grows with every peer's heartbeats
    assert big["after full"].events_per_s < big["before"].events_per_s / 100
    # the target, 3 x 10k heartbeating every 10 s: at most 5 records a second per region (no churn)
    steady = {(row.regions, row.agents, row.mode): row
              for row in rows(sizes, Assumptions(churn_per_agent_hour=0), depths=())}
    assert steady[(3, 10_000, "after full")].events_per_s / 2 <= 5 < steady[(3, 10_000, "before")].events_per_s / 2


def test_the_benchmarks_topology_is_a_valid_one_with_partial_replication() -> None:
    topology = topology_of(Params(regions=20, replicate_depth=1))
    assert [region.name for region in topology.regions][:3] == ["r01", "r02", "r03"]
    assert topology.regions[0].prefer[:2] == ["r02", "r03"] and topology.regions[19].prefer[0] == "r01"
    assert topology.federation.replicate_depth == 1
    assert topology.semantic.enabled is False
