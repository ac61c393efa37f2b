"""Region summaries and routing by them, without servers: the builder, the parts of a big region's
summary and their assembly, the message contract, and the router's spill across peer regions in
proportion to their summaries (seeded RNG, counted over a bounded number of decisions)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import pytest

from federation import FederationConfig, FederationMessage, SummaryBuilder, summary_parts
from federation.summary import SummaryReader, _Assembly
from node.core.models import CapabilitySummary, Load, RegionSummary, RouteRequest, Status, SummaryView
from node.routing.spill import ForwardTo
from node.view import AgentIndex

from ..helpers import ADMIN, CAPABILITY, LEASE_MS, START_MS, Peer, index_of, make_router, record

pytestmark = pytest.mark.unit


def view(region: str, *capabilities: CapabilitySummary, at_ms: int = START_MS, watermark: int = 10**9) -> SummaryView:
    return SummaryView.of([RegionSummary(region=region, watermark=watermark, sent_at_ms=at_ms, generation=at_ms,
                                         capabilities=list(capabilities))])


def offered(healthy: int, weight: float, *, load: int = 0, capacity: int | None = None,
            versions: dict[str, int] | None = None, name: str = CAPABILITY) -> CapabilitySummary:
    return CapabilitySummary(name=name, total=healthy, healthy=healthy, weight=weight, load=load,
                             capacity=capacity if capacity is not None else 10 * healthy,
                             versions=versions if versions is not None else {"1": healthy})


def regions_picked(router: Any, count: int, **request: Any) -> Counter[str]:
    """Regions drawn over ``count`` decisions; a summary-only region's draw counts by its name."""
    parsed = RouteRequest(**request)
    counted: Counter[str] = Counter()
    for _ in range(count):
        try:
            counted[str(router.decide_exact(parsed, ADMIN).target.target["region"])] += 1
        except ForwardTo as forward:
            counted[forward.region] += 1
    return counted


# -- the builder -----------------------------------------------------------------------------

def test_builder_counts_healthy_weight_load_and_versions_and_recomputes_only_what_changed() -> None:
    index = AgentIndex("home")
    index.put(record("lang.translate.a1", weight=100, max_concurrency=4, load=Load(inflight=2, queued=1)))
    index.put(record("lang.translate.a2", weight=50, status=Status.DEGRADED, version="2"))
    index.put(record("lang.translate.a3", ready=False))
    index.put(record("lang.translate.a4", lease_expires_at_ms=START_MS - 1))  # passed, not swept yet
    index.put(record("lang.other.b1", capability="other.cap"))
    builder = SummaryBuilder()
    summaries = {s.name: s for s in builder.build(index, lease_horizon_ms=START_MS)}
    translate = summaries[CAPABILITY]
    assert (translate.total, translate.healthy) == (4, 2)
    assert translate.weight == pytest.approx(100 + 50 * 0.5)
    assert (translate.load, translate.capacity) == (3, 4 + 10)
    assert translate.versions == {"1": 1, "2": 1}
    assert builder.recomputed == 2

    builder.build(index, lease_horizon_ms=START_MS)
    assert builder.recomputed == 0, "nothing changed: nothing recomputed"
    index.put(record("lang.other.b2", capability="other.cap"))
    again = {s.name: s for s in builder.build(index, lease_horizon_ms=START_MS)}
    assert builder.recomputed == 1 and again["other.cap"].healthy == 2
    # A healthy agent's lease passing changes the figures without any change to the index.
    later = {s.name: s for s in builder.build(index, lease_horizon_ms=START_MS + LEASE_MS)}
    assert later[CAPABILITY].healthy == 0 and later[CAPABILITY].serving_weight() == 0.0


def test_builder_cost_at_ten_thousand_agents_in_a_hundred_capabilities() -> None:
    index = AgentIndex("home")
    for n in range(10_000):
        index.put(record(f"lang.translate.a{n}", capability=f"cap.n{n % 100}", weight=1 + n % 7,
                         load=Load(inflight=n % 5)))
    builder = SummaryBuilder()
    started = time.perf_counter()
    capabilities = builder.build(index, lease_horizon_ms=START_MS)
    full_ms = (time.perf_counter() - started) * 1000
    for n in range(100):  # one load change in each capability
        index.put(record(f"lang.translate.a{n}", capability=f"cap.n{n % 100}", load=Load(inflight=9)))
    started = time.perf_counter()
    builder.build(index, lease_horizon_ms=START_MS)
    changed_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    builder.build(index, lease_horizon_ms=START_MS)
    idle_ms = (time.perf_counter() - started) * 1000
    parts = summary_parts("home", capabilities, watermark=1, agents=10_000, generation=1, sent_at_ms=1)
    size = sum(len(FederationMessage.of_summary(part).encode()) for part in parts)
    print(f"\nsummary of 10,000 agents / 100 capabilities: all recomputed {full_ms:.1f} ms, every capability "
          f"changed {changed_ms:.1f} ms, none changed {idle_ms:.2f} ms; {len(parts)} part(s), {size} bytes")
    assert len(capabilities) == 100 and sum(c.total for c in capabilities) == 10_000


# -- parts, assembly and the message ---------------------------------------------------------

def test_a_big_summary_travels_in_parts_and_applies_only_when_complete() -> None:
    capabilities = [offered(3, 3.0, name=f"cap.number{n}") for n in range(500)]
    parts = summary_parts("far", capabilities, watermark=9, agents=1_500, generation=7, sent_at_ms=5,
                          max_part_bytes=8_000)
    assert len(parts) > 3 and {part.parts for part in parts} == {len(parts)}
    encoded = [FederationMessage.of_summary(part).encode() for part in parts]
    assert max(len(value) for value in encoded) < 12_000
    decoded = [FederationMessage.decode(value) for value in encoded]
    assert decoded[0].key() == b"far/0" and dict(decoded[0].headers())["content-type"].startswith(
        b"application/vnd.agent-reach.summary+json")
    assembly = _Assembly()
    # An older generation's part, then the new generation out of order: applied once, complete.
    stale_part = summary_parts("far", capabilities[:1], watermark=8, agents=1, generation=6, sent_at_ms=4)[0]
    assert assembly.add(stale_part.model_copy(update={"parts": 2})) is None
    results = [assembly.add(message.summary) for message in reversed(decoded)]  # type: ignore[arg-type]
    assert all(result is None for result in results[:-1])
    complete = results[-1]
    assert complete is not None and complete.generation == 7 and len(complete.capabilities) == 500
    assert assembly.pending == {}, "older incomplete generations are dropped"
    with pytest.raises(ValueError):
        SummaryView.of(parts[:-1])


def test_the_reader_applies_a_peer_summary_and_quarantines_what_does_not_parse() -> None:
    from federation.replica import PeerCatalog
    from federation.replica_store import ReplicaStore

    config = FederationConfig(region="home", peers=[{"region": "far", "node_urls": ["http://127.0.0.1:1"]}],
                              bootstrap_servers="127.0.0.1:1")

    class _NoRedis:
        def register_script(self, script: str) -> None:
            return None

    catalog = PeerCatalog(ReplicaStore(_NoRedis(), region="home", key_prefix="ar", feed_maxlen=100),  # type: ignore[arg-type]
                          peers=["far"], stale_after_ms=60_000)
    reader = SummaryReader(config, catalog=catalog)
    message = FederationMessage.of_summary(summary_parts("far", [offered(2, 2.0)], watermark=3, agents=2,
                                                         generation=1, sent_at_ms=1)[0])
    assert reader.apply("far", message.encode(), where="t@0")
    assert catalog.peer("far").summary is not None
    assert catalog.peer("far").summary.serving_weight(CAPABILITY) == pytest.approx(2.0)  # type: ignore[union-attr]
    assert not reader.apply("far", b'{"schema_version": 2, "summary": {"region": "far"}}', where="t@1")
    assert reader.stats.invalid == 1 and len(catalog.store.quarantine) == 1
    assert not reader.apply("far", None, where="t@2")
    asyncio.run(reader.aclose())  # never started: closing is a no-op


# -- routing by summaries --------------------------------------------------------------------

@pytest.mark.parametrize("seed", [1, 2, 3])
def test_spill_splits_across_two_remote_regions_in_proportion_to_their_summaries(seed: int) -> None:
    # Nothing local: everything spills. east is replicated (its records are drawn), west is
    # summary-only (its node would pick); their summaries say 3:1 once utilisation is counted.
    east = Peer("east", index_of("east", *(record(f"lang.translate.e{n}", region="east") for n in range(4))),
                summary=view("east", offered(4, 400.0, load=20, capacity=40)))  # 400 / 1.5
    west = Peer("west", AgentIndex("west"), replicated=False,
                summary=view("west", offered(1, 100.0, load=0, capacity=10)))  # 100 / 1
    router, _, _ = make_router(peers=(east, west), rng=random.Random(seed))
    count = 4_000
    picked = regions_picked(router, count, capability=CAPABILITY)
    expected_east = (400 / 1.5) / (400 / 1.5 + 100)
    print(f"\nseed {seed}: east {picked['east'] / count:.3f} (expected {expected_east:.3f}), "
          f"west {picked['west'] / count:.3f}")
    assert abs(picked["east"] / count - expected_east) < 0.05 * expected_east
    assert abs(picked["west"] / count - (1 - expected_east)) < 0.05 * (1 - expected_east)


def test_a_region_whose_summary_says_nobody_healthy_gets_nothing() -> None:
    east = Peer("east", index_of("east", record("lang.translate.e1", region="east")),
                summary=view("east", offered(0, 0.0)))
    west = Peer("west", index_of("west", record("lang.translate.w1", region="west")),
                summary=view("west", offered(1, 100.0)))
    south = Peer("south", AgentIndex("south"), replicated=False, summary=view("south", offered(0, 0.0)))
    router, _, _ = make_router(peers=(east, west, south))
    assert set(regions_picked(router, 500, capability=CAPABILITY)) == {"west"}


def test_versions_and_local_first_still_hold_with_summaries() -> None:
    east = Peer("east", AgentIndex("east"), replicated=False,
                summary=view("east", offered(2, 200.0, versions={"1": 2})))
    west = Peer("west", AgentIndex("west"), replicated=False,
                summary=view("west", offered(2, 200.0, versions={"2.1": 2})))
    router, _, _ = make_router(record("lang.translate.h1", ready=False), peers=(east, west))
    assert set(regions_picked(router, 300, capability=CAPABILITY, version=">=2")) == {"west"}
    # A fully healthy local level carries all the traffic; scope=local never leaves the region.
    router, _, _ = make_router(record("lang.translate.h1"), peers=(east, west))
    assert set(regions_picked(router, 300, capability=CAPABILITY)) == {"home"}
    router, _, _ = make_router(peers=(east, west))
    with pytest.raises(Exception) as raised:
        router.decide_exact(RouteRequest(capability=CAPABILITY, scope="local"), ADMIN)
    assert not isinstance(raised.value, ForwardTo)
    # The caller's preferred region comes first even when it is summary-only.
    router, _, _ = make_router(record("lang.translate.h1"), peers=(east, west))
    assert set(regions_picked(router, 200, capability=CAPABILITY, preferred_region="east")) == {"east"}


def test_a_remote_record_is_weighed_without_its_stale_load() -> None:
    busy = record("lang.translate.e1", region="east", weight=100, load=Load(inflight=90), max_concurrency=10)
    idle = record("lang.translate.e2", region="east", weight=100)
    router, _, _ = make_router(peers=(Peer("east", index_of("east", busy, idle)),))
    picked = Counter(router.decide_exact(RouteRequest(capability=CAPABILITY), ADMIN).target.agent_id
                     for _ in range(2_000))
    assert abs(picked["lang.translate.e1"] / 2_000 - 0.5) < 0.05, picked
