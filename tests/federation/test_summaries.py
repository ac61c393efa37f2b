"""Summaries and partial replication end to end: three regions in this process (a real Redis, the
embedded Kafka broker, real HTTP). Region a keeps full records of b (``replicate_depth = 1``) and
only summaries of c, so a's calls for c's agents are forwarded to c's node.

Acceptance: summaries arrive and drive spill (calls from a split across b and c in proportion to
their capacity, counted over a bounded number of resolves; a region whose summary says 0 healthy
gets nothing); a forwarded lookup for a summary-only region answers, and falls back cleanly —
within the deadline, naming the region — when that region is down.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from federation import Federation
from node.core.models import TokenRole
from node.http import bound_port, serve
from node.service import RegistryNode
from topology import Topology
from topology.composition import attach_discovery, attach_federation
from topology.embedded import EmbeddedKafka

from ..conftest import TEST_SECRET
from ..helpers import RunningNode, free_port, registration, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

FORWARD_TIMEOUT_MS = 500
CAPABILITY = "spill.capacity"


class Trio:
    """Three federated regions a, b, c in this process (one Redis, distinct regions)."""

    def __init__(self, redis_url: str, region: str, bootstrap_servers: str, *, discovery: bool = False,
                 replicate_depth: int = 1, redis_urls: Mapping[str, str] | None = None,
                 node: Mapping[str, Any] | None = None, federation: Mapping[str, Any] | None = None) -> None:
        """``redis_urls`` gives a region its own Redis (else ``redis_url``); ``node`` and
        ``federation`` add or replace settings."""
        self.discovery = discovery  # lexical search attached, as topology.build_node does
        self.names = a, b, c = (f"{region}-a", f"{region}-b", f"{region}-c")
        redis_urls = redis_urls or {}
        self.topology = Topology.model_validate({
            "kafka": {"bootstrap_servers": bootstrap_servers, "topic_prefix": f"test-{region}"},
            "federation": {"beacon_interval_ms": 100, "stale_after_ms": 1_500, "anti_entropy_min_interval_ms": 100,
                           "request_timeout_ms": 1_000, "summary_interval_ms": 100, "replicate_depth": replicate_depth,
                           "forward_timeout_ms": FORWARD_TIMEOUT_MS, **(federation or {})},
            "node": {"leader_ttl_ms": 600, "sweep_interval_ms": 100, "lease_sync_interval_ms": 100,
                     "semantic_enabled": False, **(node or {})},
            "regions": [{"name": name, "node_urls": [f"http://127.0.0.1:{free_port()}"],
                         "redis_url": redis_urls.get(name, redis_url), "prefer": prefer,
                         "policy": {"egress": {"allow": ["loopback"]}}}
                        for name, prefer in ((a, [b, c]), (b, [a, c]), (c, [a, b]))],
        })
        self.running: dict[str, RunningNode] = {}
        self.federations: dict[str, Federation] = {}

    async def start(self, name: str) -> RunningNode:
        node = RegistryNode(self.topology.node_config(name), secret=TEST_SECRET)
        self.federations[name] = attach_federation(node, self.topology, secret=TEST_SECRET)
        if self.discovery:
            attach_discovery(node, semantic_enabled=False)
        await node.start()
        runner = await serve(node)
        running = RunningNode(node=node, runner=runner, url=f"http://127.0.0.1:{bound_port(runner)}",
                              admin_token=node.signer.issue("admin", TokenRole.ADMIN, ttl_s=3600))
        self.running[name] = running
        return running

    async def stop(self, name: str) -> None:
        await self.running.pop(name).aclose()

    async def aclose(self) -> None:
        for name in list(self.running):
            await self.stop(name)


def agent(region: str, n: int, **extra: Any) -> dict[str, Any]:
    return registration(f"spill.{region.replace('-', '')}.a{n}", capability=CAPABILITY, lease_ttl_ms=600_000,
                        weight=100, **extra)


async def test_summaries_arrive_drive_spill_and_forwarded_lookups_fall_back(redis_url: str, region: str) -> None:
    async with EmbeddedKafka() as kafka:
        trio = Trio(redis_url, region, kafka.bootstrap_servers)
        a, b, c = trio.names
        try:
            node_a, node_b, node_c = [await trio.start(name) for name in trio.names]
            for n in range(3):
                await node_b.register(agent(b, n))
            await node_c.register(agent(c, 0))
            catalog_a = trio.federations[a].catalog
            assert catalog_a.peer(b).replicated and not catalog_a.peer(c).replicated

            # Summaries arrive: a knows b's and c's capacity for the capability from them (a summary
            # sent between b's registrations counts fewer: wait for one sent after all three).
            def summarized() -> bool:
                views = [(catalog_a.peer(peer).summary, healthy) for peer, healthy in ((b, 3), (c, 1))]
                return all(view is not None and CAPABILITY in view.capabilities
                           and view.capabilities[CAPABILITY].healthy == healthy for view, healthy in views)

            await wait_for(summarized, timeout_s=15, message="b's and c's summaries in a")
            await wait_for(lambda: len(catalog_a.peer(b).index.with_capability(CAPABILITY)) == 3, timeout_s=10,
                           message="b's records replicated to a")
            assert len(catalog_a.peer(c).index) == 0, "c is summary-only: no records in a"
            status, regions = await node_a.call("GET", "/v1/regions")
            assert status == 200
            views = {view["region"]: view for view in regions["peers"]}
            assert views[c]["replicated"] is False and views[c]["summary"]["capabilities"][CAPABILITY]["healthy"] == 1
            assert views[b]["summary"]["capabilities"][CAPABILITY]["weight"] == pytest.approx(300.0)
            status, metrics = await node_a.call("GET", "/metrics")
            assert status == 200 and f'agent_reach_federation_capabilities_age_seconds{{peer="{c}"' in metrics

            # Spill: a has no agent of its own, so b and c share its calls 3:1 by capacity.
            count = 400
            regions_hit: Counter[str] = Counter()
            latencies: dict[str, list[float]] = {b: [], c: []}
            for _ in range(count):
                started = time.perf_counter()
                status, ticket = await node_a.resolve(capability=CAPABILITY)
                elapsed = time.perf_counter() - started
                assert status == 200, ticket
                assert ticket["locality"] == "remote"
                regions_hit[ticket["target"]["region"]] += 1
                latencies[ticket["target"]["region"]].append(elapsed)
            share_b = regions_hit[b] / count
            p50 = {peer: sorted(values)[len(values) // 2] * 1000 for peer, values in latencies.items()}
            print(f"\nspill from a: b {share_b:.3f}, c {regions_hit[c] / count:.3f} (capacity 3:1); resolve p50 "
                  f"{p50[b]:.2f} ms picked from b's replica, {p50[c]:.2f} ms forwarded to c's node")
            assert abs(share_b - 0.75) < 0.05 * 0.75 + 0.05, regions_hit  # bounded count: ±5 % plus sampling
            assert set(regions_hit) == {b, c}

            # A forwarded lookup of c's agent answers (a holds no record of it) ...
            c_agent = agent(c, 0)["agent_id"]
            status, record = await node_a.call("GET", f"/v1/agents/{c_agent}")
            assert status == 200 and record["region"] == c, record

            # ... and c's summary saying 0 healthy leaves c out of the spill.
            status, _ = await node_c.call("PUT", f"/v1/agents/{c_agent}/heartbeat", json={"status": "draining"})
            assert status == 200

            def c_has_nobody_healthy() -> bool:
                summary = catalog_a.peer(c).summary
                held = summary.capabilities.get(CAPABILITY) if summary is not None else None
                return held is not None and held.total == 1 and held.healthy == 0

            await wait_for(c_has_nobody_healthy, timeout_s=10, message="c's summary says nobody healthy")
            for _ in range(100):
                status, ticket = await node_a.resolve(capability=CAPABILITY)
                assert status == 200 and ticket["target"]["region"] == b

            # c down: the lookup answers 404 naming c within the deadline, never a hang.
            await node_c.register(agent(c, 1))
            await wait_for(lambda: catalog_a.peer(c).summary is not None
                           and catalog_a.peer(c).summary.serving_weight(CAPABILITY) > 0, timeout_s=10,
                           message="c serves again")
            await trio.stop(c)
            started = time.perf_counter()
            status, answer = await node_a.call("GET", f"/v1/agents/{agent(c, 1)['agent_id']}")
            elapsed = time.perf_counter() - started
            assert status == 404 and c in answer["message"] and answer["details"]["unanswered"] == [c], answer
            assert elapsed < FORWARD_TIMEOUT_MS / 1000 + 1.0
            # A resolve whose draw lands on c (its summary still fresh) falls back to b.
            for _ in range(40):
                status, ticket = await node_a.resolve(capability=CAPABILITY)
                assert status == 200 and ticket["target"]["region"] == b, ticket
            print(f"lookup with c down: 404 in {elapsed * 1000:.0f} ms")
        finally:
            await trio.aclose()
