"""Federation acceptance: three regions as separate node processes, a real Redis per region and
the real (embedded) Kafka broker, all started by ``topology.launcher.LocalCluster``.

Every test uses its own capability names and agent ids, so they share one cluster; they poll
with deadlines and print what they measured.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer

from topology import Topology
from topology.launcher import LocalCluster

from ..helpers import registration, topic_messages, wait_for

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(180)]

SECRET = b"federation-test-secret-0123456789"
BEACON_INTERVAL_MS = 200
STALE_AFTER_MS = 1_500
LONG_LEASE_MS = 600_000
_ids = itertools.count()


def cluster_topology() -> Topology:
    """ra prefers rc over rb, so a stale rc visibly loses to a fresh but farther rb."""
    node_url = "http://127.0.0.1:1"  # ports are replaced by free ones (any_port)
    return Topology.model_validate({
        "name": "federation-test",
        "federation": {"beacon_interval_ms": BEACON_INTERVAL_MS, "stale_after_ms": STALE_AFTER_MS,
                       "anti_entropy_min_interval_ms": 200},
        # Semantic search stays lexical here (no model load per node); tests/semantic/test_discovery.py covers it.
        "node": {"sweep_interval_ms": 200, "leader_ttl_ms": 1_000, "lease_sync_interval_ms": 200,
                 "semantic_enabled": False, "egress": {"allow": ["loopback"]}},
        "regions": [
            {"name": "ra", "node_urls": [node_url + "01"], "prefer": ["rc", "rb"]},
            {"name": "rb", "node_urls": [node_url + "02"], "prefer": ["ra", "rc"]},
            {"name": "rc", "node_urls": [node_url + "03"], "prefer": ["ra", "rb"]},
        ],
    })


class Cluster:
    """The running cluster plus an HTTP client with an admin token."""

    def __init__(self, local: LocalCluster, session: aiohttp.ClientSession) -> None:
        self.local = local
        self.session = session
        self.headers = {"Authorization": f"Bearer {local.admin_token()}"}
        self.regions = [region.name for region in local.resolved.regions]

    async def call(self, region: str, method: str, path: str, json: Any = None) -> tuple[int, Any]:
        async with self.session.request(method, self.local.url(region) + path, json=json,
                                        headers=self.headers) as response:
            return response.status, await response.json(content_type=None)

    async def register(self, region: str, body: dict[str, Any]) -> dict[str, Any]:
        status, reply = await self.call(region, "POST", "/v1/agents", body)
        assert status in (200, 201), reply
        return reply

    async def deregister(self, region: str, agent_id: str) -> None:
        status, reply = await self.call(region, "DELETE", f"/v1/agents/{agent_id}")
        assert status == 200, reply

    async def resolve(self, region: str, **request: Any) -> tuple[int, Any]:
        return await self.call(region, "POST", "/v1/resolve", request)

    async def agent(self, region: str, agent_id: str) -> dict[str, Any] | None:
        status, reply = await self.call(region, "GET", f"/v1/agents/{agent_id}")
        return reply if status == 200 else None

    async def status(self, region: str) -> dict[str, Any]:
        status, reply = await self.call(region, "GET", "/v1/federation/status")
        assert status == 200, reply
        return reply

    async def peer_view(self, region: str, peer: str) -> dict[str, Any]:
        status, reply = await self.call(region, "GET", "/v1/regions")
        assert status == 200, reply
        return next(view for view in reply["peers"] if view["region"] == peer)

    async def remote_versions(self, region: str, peer: str) -> dict[str, int]:
        status, reply = await self.call(region, "GET", "/v1/agents?scope=global")
        assert status == 200, reply
        return {agent["agent_id"]: agent["version"] for agent in reply["agents"] if agent["region"] == peer}

    async def converged(self) -> bool:
        """Every region's replica of every peer has the peer's own live count and digest."""
        statuses = {region: await self.status(region) for region in self.regions}
        for status in statuses.values():
            for view in status["peers"]:
                home = statuses[view["region"]]
                if view["digest"] != home["digest"] or view["agents"] != home["live_count"]:
                    return False
        return True

    async def wait_visible(self, region: str, agent_id: str, *, timeout_s: float = 5.0) -> float:
        """Seconds until ``agent_id`` is visible in ``region`` (polled every 2 ms)."""
        started = time.perf_counter()
        await wait_for(lambda: self.agent(region, agent_id), timeout_s=timeout_s, interval_s=0.002,
                       message=f"{agent_id} visible in {region}")
        return time.perf_counter() - started

    async def wait_gone(self, region: str, agent_id: str, *, timeout_s: float = 5.0) -> float:
        started = time.perf_counter()

        async def gone() -> bool:
            return await self.agent(region, agent_id) is None

        await wait_for(gone, timeout_s=timeout_s, interval_s=0.002, message=f"{agent_id} gone from {region}")
        return time.perf_counter() - started


def agent_id(tag: str) -> str:
    return f"fed.{tag}.a{next(_ids)}"


def long_lived(agent: str, capability: str, **extra: Any) -> dict[str, Any]:
    return registration(agent, capability=capability, lease_ttl_ms=LONG_LEASE_MS, **extra)


def milliseconds(values: list[float]) -> str:
    ordered = sorted(v * 1000 for v in values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"n={len(ordered)} p50={statistics.median(ordered):.1f} ms p99={p99:.1f} ms max={ordered[-1]:.1f} ms"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[Cluster]:
    started = time.perf_counter()
    # AGENT_REACH_TEST_LOG_DIR=DIR keeps the node logs (INFO) for a look after the run.
    log_dir = os.environ.get("AGENT_REACH_TEST_LOG_DIR")
    async with LocalCluster(cluster_topology(), secret=SECRET, any_port=True,
                            log_level="INFO" if log_dir else "WARNING",
                            run_dir=Path(log_dir) if log_dir else None) as local:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            running = Cluster(local, session)

            async def all_fresh() -> bool:
                for region in running.regions:
                    status, reply = await running.call(region, "GET", "/v1/regions")
                    if status != 200 or any(view["stale"] for view in reply["peers"]):
                        return False
                return True

            await wait_for(all_fresh, timeout_s=20, message="every peer fresh in every region")
            print(f"\ncluster of {len(running.regions)} node processes up in {time.perf_counter() - started:.1f} s")
            yield running


async def test_register_in_one_region_is_resolvable_in_the_others_and_removal_follows(cluster: Cluster) -> None:
    capability = "fed.translate"
    latencies: list[float] = []
    agents = []
    for _ in range(20):
        agent = agent_id("prop")
        agents.append(agent)
        sent = time.perf_counter()
        await cluster.register("ra", long_lived(agent, capability))
        await asyncio.gather(cluster.wait_visible("rb", agent), cluster.wait_visible("rc", agent))
        latencies.append(time.perf_counter() - sent)
    print(f"\nregister in ra -> visible in rb and rc: {milliseconds(latencies)}")

    for region in ("rb", "rc"):
        status, ticket = await cluster.resolve(region, capability=capability)
        assert status == 200, ticket
        assert ticket["locality"] == "remote"
        assert ticket["target"]["region"] == "ra"
        assert ticket["target"]["stale"] is False
        record = await cluster.agent(region, agents[0])
        assert record is not None and record["region"] == "ra"
    status, body = await cluster.resolve("rb", capability=capability, scope="local")
    assert status == 404 and body["error"] == "no_agent_available"
    status, body = await cluster.resolve("rb", capability=capability, scope="global")
    assert status == 200 and body["target"]["region"] == "ra"
    status, local_list = await cluster.call("rb", "GET", f"/v1/agents?capability={capability}&scope=local")
    assert status == 200 and local_list["count"] == 0
    status, global_list = await cluster.call("rb", "GET", f"/v1/agents?capability={capability}&scope=global")
    assert status == 200 and {a["agent_id"] for a in global_list["agents"]} >= set(agents)
    view = await cluster.peer_view("rb", "ra")
    assert view["agents"] >= len(agents) and view["stale"] is False
    assert view["beacon_age_ms"] is not None and view["events_behind"] is not None

    removal: list[float] = []
    for agent in agents[:10]:
        sent = time.perf_counter()
        await cluster.deregister("ra", agent)
        await asyncio.gather(cluster.wait_gone("rb", agent), cluster.wait_gone("rc", agent))
        removal.append(time.perf_counter() - sent)
    print(f"deregister in ra -> gone from rb and rc: {milliseconds(removal)}")


async def test_lease_expiry_in_one_region_removes_the_agent_elsewhere(cluster: Cluster) -> None:
    agent = agent_id("lease")
    await cluster.register("ra", registration(agent, capability="fed.expiring", lease_ttl_ms=1_000))
    await asyncio.gather(cluster.wait_visible("rb", agent), cluster.wait_visible("rc", agent))
    started = time.perf_counter()
    await asyncio.gather(cluster.wait_gone("rb", agent, timeout_s=10), cluster.wait_gone("rc", agent, timeout_s=10))
    print(f"\nlease of 1 s not renewed -> gone from rb and rc {time.perf_counter() - started:.2f} s after it was seen")
    await cluster.wait_gone("ra", agent)


async def test_local_first_and_spill_to_the_nearest_region_below_the_overprovisioned_share(cluster: Cluster) -> None:
    capability = "fed.spill"
    in_a = [agent_id("spill") for _ in range(2)]
    in_b = agent_id("spill")
    for agent in in_a:
        await cluster.register("ra", long_lived(agent, capability))
    await cluster.register("rb", long_lived(in_b, capability))
    await asyncio.gather(*(cluster.wait_visible("rb", agent) for agent in in_a), cluster.wait_visible("ra", in_b))

    async def regions_chosen(region: str, count: int) -> list[str]:
        chosen = []
        for _ in range(count):
            status, ticket = await cluster.resolve(region, capability=capability)
            assert status == 200, ticket
            chosen.append(ticket["target"]["region"])
        return chosen

    assert set(await regions_chosen("ra", 100)) == {"ra"}
    assert set(await regions_chosen("rb", 100)) == {"rb"}

    # Half of ra's weight drains: healthy share 0.5 x 1.4 = 0.7 stays local, 0.3 spills to rb.
    status, reply = await cluster.call("ra", "PUT", f"/v1/agents/{in_a[0]}/heartbeat", {"status": "draining"})
    assert status == 200, reply
    chosen = await regions_chosen("ra", 400)
    spilled = chosen.count("rb") / len(chosen)
    print(f"\nra at half its healthy weight: {spilled:.1%} of 400 resolves spilled to rb (expected 30%)")
    assert 0.2 <= spilled <= 0.4
    assert set(chosen) == {"ra", "rb"}  # the spill goes to ra's nearest peer that has the capability


async def test_replayed_duplicated_and_reordered_events_leave_replicas_unchanged(cluster: Cluster) -> None:
    capability = "fed.replay"
    kept = [agent_id("replay") for _ in range(5)]
    removed = agent_id("replay")
    for agent in [*kept, removed]:
        await cluster.register("ra", long_lived(agent, capability))
    await cluster.call("ra", "PUT", f"/v1/agents/{kept[0]}/heartbeat", {"status": "degraded"})
    await cluster.deregister("ra", removed)
    await wait_for(cluster.converged, timeout_s=10, message="replicas converged before the replay")
    before = {region: await cluster.remote_versions(region, "ra") for region in ("rb", "rc")}
    stats_before = {region: (await cluster.status(region))["consumer"] for region in ("rb", "rc")}
    ae_before = {region: (await cluster.peer_view(region, "ra"))["anti_entropy_runs"] for region in ("rb", "rc")}

    bootstrap = cluster.local.resolved.kafka.bootstrap_servers
    topic = "agent-reach.changes.ra"
    history = [m for m in await topic_messages(bootstrap, topic) if m.change is not None]
    ours = [m for m in history if m.change is not None and m.change.agent_id in {*kept, removed}]
    assert len(ours) >= 8  # 6 upserts, a status change, a delete
    batch = list(reversed(ours)) + ours + random.Random(7).sample(history, k=min(len(history), 40))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for message in batch:
            await producer.send(topic, message.encode(), key=message.key(), partition=0)
        await producer.flush()
    finally:
        await producer.stop()

    # One partition, in order: once a change made after the batch is visible, the batch was applied.
    sentinel = agent_id("replay")
    await cluster.register("ra", long_lived(sentinel, capability))
    await asyncio.gather(cluster.wait_visible("rb", sentinel), cluster.wait_visible("rc", sentinel))
    for region in ("rb", "rc"):
        after = await cluster.remote_versions(region, "ra")
        after.pop(sentinel)
        assert after == before[region], f"{region}'s replica of ra changed after the replay"
        assert await cluster.agent(region, removed) is None, "a replayed upsert resurrected a deleted agent"
        record = await cluster.agent(region, kept[0])
        assert record is not None and record["status"] == "degraded", "a replayed upsert moved a record backwards"
        consumer = (await cluster.status(region))["consumer"]
        assert consumer["records"] >= stats_before[region]["records"] + len(batch)
        assert consumer["gaps"] == stats_before[region]["gaps"]
        assert (await cluster.peer_view(region, "ra"))["anti_entropy_runs"] == ae_before[region], \
            "the replay needed anti-entropy: application was not idempotent"
    print(f"\nreplayed {len(batch)} old, duplicated and reversed events of ra: replicas unchanged")


async def test_stopped_peer_turns_stale_is_used_only_as_last_resort_and_recovers(cluster: Cluster) -> None:
    capability = "fed.stale"
    in_b = agent_id("stale")
    in_c = agent_id("stale")
    await cluster.register("rb", long_lived(in_b, capability))
    await cluster.register("rc", long_lived(in_c, capability))
    await asyncio.gather(cluster.wait_visible("ra", in_b), cluster.wait_visible("ra", in_c))
    fresh = set()
    for _ in range(60):  # nothing in ra: the spill is split across the fresh peers by their capacity (1:1)
        status, ticket = await cluster.resolve("ra", capability=capability)
        assert status == 200, ticket
        fresh.add(ticket["target"]["region"])
    assert fresh == {"rb", "rc"}

    stopped = time.perf_counter()
    await cluster.local.stop_node("rc")

    async def stale_everywhere() -> bool:
        views = [await cluster.peer_view(region, "rc") for region in ("ra", "rb")]
        return all(view["stale"] for view in views)

    await wait_for(stale_everywhere, timeout_s=10, interval_s=0.02, message="rc stale in ra and rb")
    became_stale = time.perf_counter() - stopped
    print(f"\nrc stopped -> stale in ra and rb after {became_stale:.2f} s (stale_after {STALE_AFTER_MS} ms)")
    assert became_stale <= (STALE_AFTER_MS + 2 * BEACON_INTERVAL_MS) / 1000 + 1.0

    chosen = set()
    for _ in range(50):
        status, ticket = await cluster.resolve("ra", capability=capability)
        assert status == 200, ticket
        chosen.add((ticket["target"]["region"], ticket["target"]["stale"]))
    assert chosen == {("rb", False)}, "a stale peer was used while a fresh one could serve"

    await cluster.deregister("rb", in_b)
    await cluster.wait_gone("ra", in_b)
    status, ticket = await cluster.resolve("ra", capability=capability)
    assert status == 200, ticket
    assert ticket["target"]["region"] == "rc" and ticket["target"]["stale"] is True
    assert ticket["locality"] == "remote"

    restarted = time.perf_counter()
    await cluster.local.start_node("rc")

    async def fresh_everywhere() -> bool:
        views = [await cluster.peer_view(region, "rc") for region in ("ra", "rb")]
        return not any(view["stale"] for view in views)

    await wait_for(fresh_everywhere, timeout_s=15, message="rc fresh again in ra and rb")
    print(f"rc restarted -> fresh again after {time.perf_counter() - restarted:.2f} s (including process start)")
    status, ticket = await cluster.resolve("ra", capability=capability)
    assert ticket["target"]["region"] == "rc" and ticket["target"]["stale"] is False


async def test_broker_restart_loses_nothing_and_replicas_reconverge(cluster: Cluster) -> None:
    kafka = cluster.local.kafka
    assert kafka is not None
    # Put the consumers' offsets on ra's topic well beyond what the restarted broker's log will
    # reach soon, so only the data-loss check (not a gap or a beacon) can bring them back.
    filler = [agent_id("filler") for _ in range(60)]
    for agent in filler:
        await cluster.register("ra", long_lived(agent, "fed.filler"))
    for agent in filler:
        await cluster.deregister("ra", agent)
    await wait_for(cluster.converged, timeout_s=10, message="converged before the broker restart")
    published_before = (await cluster.status("ra"))["publisher"]["position"]
    losses_before = {region: (await cluster.status(region))["consumer"]["broker_data_losses"]
                     for region in ("rb", "rc")}

    await kafka.stop()
    down_at = time.perf_counter()
    during = [agent_id("broker") for _ in range(10)]
    for agent in during:
        await cluster.register("ra", long_lived(agent, "fed.broker"))
    await cluster.register("rb", long_lived(agent_id("broker"), "fed.broker"))
    # Local routing never waits on Kafka.
    status, ticket = await cluster.resolve("ra", capability="fed.broker")
    assert status == 200 and ticket["locality"] == "local"
    ra_version = (await cluster.status("ra"))["watermark"]
    assert (await cluster.status("ra"))["publisher"]["position"] == published_before  # nothing acked while down

    await kafka.start()
    back_at = time.perf_counter()
    await wait_for(cluster.converged, timeout_s=20, interval_s=0.02, message="replicas reconverged after the restart")
    reconverged = time.perf_counter() - back_at
    print(f"\nbroker down {back_at - down_at:.2f} s, all its data gone; replicas equal (digests) "
          f"{reconverged:.2f} s after it returned")
    for agent in during:
        assert await cluster.agent("rc", agent) is not None

    # The backlog went out through Kafka itself: every change ra made while the broker was down
    # is on the new (empty-started) topic — none was lost.
    async def backlog_on_topic() -> bool:
        versions = {m.change.version for m in await topic_messages(kafka.bootstrap_servers, "agent-reach.changes.ra")
                    if m.change is not None}
        return set(range(published_before + 1, ra_version + 1)) <= versions

    await wait_for(backlog_on_topic, timeout_s=10, message="changes made while the broker was down on the topic")
    for region in ("rb", "rc"):
        losses = (await cluster.status(region))["consumer"]["broker_data_losses"]
        assert losses > losses_before[region], f"{region}'s consumer did not notice the broker lost its data"


async def test_churn_of_a_thousand_changes_converges_within_five_seconds(cluster: Cluster) -> None:
    operations: list[tuple[str, str, str]] = []
    for region in cluster.regions:
        agents = [agent_id(f"churn{region}") for _ in range(200)]
        operations += [("register", region, agent) for agent in agents]
        operations += [("deregister", region, agent) for agent in agents[:133]]
    assert len(operations) >= 999
    registered: dict[str, asyncio.Event] = {}
    limit = asyncio.Semaphore(24)

    async def run(kind: str, region: str, agent: str) -> None:
        async with limit:
            if kind == "register":
                await cluster.register(region, long_lived(agent, "fed.churn"))
                registered.setdefault(agent, asyncio.Event()).set()
            else:
                await registered.setdefault(agent, asyncio.Event()).wait()
                await cluster.deregister(region, agent)

    started = time.perf_counter()
    await asyncio.gather(*(run(*operation) for operation in operations))
    last_change = time.perf_counter()
    await wait_for(cluster.converged, timeout_s=5, interval_s=0.02, message="digests equal within 5 s")
    converged = time.perf_counter() - last_change
    print(f"\n{len(operations)} registrations/deregistrations over 3 regions in {last_change - started:.2f} s; "
          f"every replica equal (digest) {converged * 1000:.0f} ms after the last change")

    async def beacons_agree() -> bool:
        """Each peer's latest beacon (its own tracked digest) matches the replica at that version."""
        for region in cluster.regions:
            if not all(view["in_sync"] for view in (await cluster.status(region))["peers"]):
                return False
        return True

    await wait_for(beacons_agree, timeout_s=5, message="every beacon's digest equal to the replica's")
