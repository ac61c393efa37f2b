"""Load stays home (``node.store.loads``): a new load is soft state of the region, never a change event.

A heartbeat that changes only load (or only the lease) bumps no version and appends nothing to the
change stream, so the federation publisher sends peers nothing for it; a status change still
travels. Every replica of the region sees a reported load over the load channel — and after a
lost connection, by reading the loads again — and a node starting later reads it with the records.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from federation.events import FederationMessage
from node.client import ReachClient
from node.core.models import TokenRole
from topology import EmbeddedKafka

from ..conftest import TEST_SECRET, NodeFactory
from ..helpers import Pair, RunningNode, registration, topic_messages, wait_for

LOADS = 40  # load-only heartbeats (and as many load reports) per test


def _load(n: int) -> dict[str, Any]:
    return {"inflight": n % 7, "queued": n % 3, "rps": float(n)}


async def _beat(node: RunningNode, agent_id: str, body: dict[str, Any]) -> dict[str, Any]:
    status, reply = await node.call("PUT", f"/v1/agents/{agent_id}/heartbeat", token=node.token(agent_id), json=body)
    assert status == 200, reply
    return reply


async def _report(node: RunningNode, agent_id: str, load: dict[str, Any], token: str | None = None
                  ) -> tuple[int, dict[str, Any]]:
    return await node.call("PUT", f"/v1/agents/{agent_id}/load", token=token or node.token(agent_id), json=load)


async def _load_of(node: RunningNode, agent_id: str) -> dict[str, Any] | None:
    status, record = await node.call("GET", f"/v1/agents/{agent_id}")
    return record["load"] if status == 200 else None


def _changes_of(messages: list[FederationMessage], agent_id: str) -> list[tuple[str, int]]:
    return [(m.change.kind.value, m.change.version) for m in messages
            if m.change is not None and m.change.agent_id == agent_id]


async def test_a_load_only_heartbeat_produces_no_peer_event_and_a_status_change_does(redis_url: str,
                                                                                     region: str) -> None:
    async with EmbeddedKafka() as kafka:
        pair = Pair(redis_url, region, kafka.bootstrap_servers, secret=TEST_SECRET)
        x, y = pair.names
        try:
            node_x, _ = await pair.start(x)
            node_y, _ = await pair.start(y)
            agent = "home.load.a1"
            registered = await node_x.register(registration(agent, capability="home.load", lease_ttl_ms=60_000))
            await wait_for(lambda: node_y.node.find(agent), timeout_s=20, message=f"{agent} replicated to {y}")
            region_version = await node_x.node.store.version()

            for n in range(LOADS):
                beat = await _beat(node_x, agent, {"load": _load(n + 1)})
                assert beat["changed"] is False and beat["version"] == registered["version"]
                status, reply = await _report(node_x, agent, _load(n + 100))
                assert status == 200 and reply["agent_id"] == agent, reply
            assert await node_x.node.store.version() == region_version  # no version, no stream entry
            assert await _load_of(node_x, agent) == _load(LOADS - 1 + 100)

            changed = await _beat(node_x, agent, {"status": "degraded", "load": _load(7)})
            assert changed["changed"] is True and changed["version"] == region_version + 1

            def status_arrived() -> bool:
                record = node_y.node.find(agent)
                return record is not None and record.status.value == "degraded"

            await wait_for(status_arrived, timeout_s=20, message=f"the status change reaching {y}")
            messages = await topic_messages(kafka.bootstrap_servers, f"test-{region}.changes.{x}")
            # The registration and the status change crossed; none of the 80 load changes did.
            assert _changes_of(messages, agent) == [("upsert", registered["version"]), ("status", changed["version"])]
            replica = node_y.node.find(agent)
            assert replica is not None and replica.version == changed["version"]
            print(f"\n{2 * LOADS} load changes in {x}: {len(_changes_of(messages, agent)) - 2} peer events; "
                  f"region version moved by {changed['version'] - region_version} (the status change)")
        finally:
            await pair.aclose()


async def test_every_replica_of_the_region_sees_a_reported_load_also_after_a_lost_connection(
        node_factory: NodeFactory, redis_url: str) -> None:
    a = await node_factory()
    b = await node_factory()
    agent = "home.replica.a1"
    registered = await a.register(registration(agent, capability="home.replica", lease_ttl_ms=60_000))
    await wait_for(lambda: b.node.find(agent), message=f"{agent} on the second replica")

    status, _ = await _report(b, agent, _load(5))
    assert status == 200
    await wait_for(lambda: a.node.find(agent).load.rps == 5.0, message="the load report reaching replica a")
    await _beat(b, agent, {"load": _load(6)})
    await wait_for(lambda: a.node.find(agent).load.rps == 6.0, message="the heartbeat's load reaching replica a")
    assert a.node.find(agent).version == registered["version"]

    # A subscriber that loses its connection misses what is published meanwhile: it reads the
    # loads again when it is back (redis-py re-subscribes by itself).
    resyncs = a.node.cache.loads.resyncs
    client = aioredis.Redis.from_url(redis_url)
    try:
        killed = await client.client_kill_filter(_type="pubsub")
    finally:
        await client.aclose()
    assert killed >= 1
    await node_factory()  # one more replica, started while a reconnects, reads the loads with the records
    status, _ = await _report(b, agent, _load(8))
    assert status == 200
    await wait_for(lambda: a.node.cache.loads.resyncs > resyncs, message="replica a reading the loads again")
    await wait_for(lambda: a.node.find(agent).load.rps == 8.0, message="the load reported while a reconnected")

    late = await node_factory()
    assert late.node.find(agent) is not None and late.node.find(agent).load.rps == 8.0
    stored = await a.node.store.get(agent)
    assert stored is not None and stored.load.rps == 8.0 and stored.version == registered["version"]


async def test_a_load_report_is_refused_clearly(node: RunningNode) -> None:
    agent = "home.report.a1"
    await node.register(registration(agent, capability="home.report", lease_ttl_ms=60_000))
    status, body = await _report(node, agent, _load(1), token=node.token("home.report.other"))
    assert status == 403 and body["field"] == "agent_id", body
    status, body = await _report(node, agent, {"inflight": -1})
    assert status == 422 and body["field"] == "inflight", body
    status, body = await _report(node, agent, {"inflight": 1, "cpu": 3})
    assert status == 422 and body["field"] == "cpu", body
    status, body = await _report(node, "home.report.none", _load(1), token=node.token("home.report.none"))
    assert status == 404 and body["error"] == "unknown_agent", body
    status, body = await _report(node, agent, _load(1), token=node.token("app.caller", TokenRole.CALLER))
    assert status == 403, body
    status, body = await node.call("PUT", f"/v1/agents/{agent}/load", json=_load(1),
                                   headers={"Authorization": "Bearer not-a-token"})
    assert status == 401, body
    # a re-registration's own load replaces what was reported before it
    assert (await _report(node, agent, _load(3)))[0] == 200
    await node.register(registration(agent, capability="home.report", lease_ttl_ms=60_000))
    assert await _load_of(node, agent) == {"inflight": 0, "queued": 0, "rps": 0.0}
    stored = await node.node.store.get(agent)
    assert stored is not None and stored.load.rps == 0.0


async def test_the_sdk_reports_load_between_heartbeats_only_when_it_changed(node: RunningNode) -> None:
    agent = "home.sdk.a1"
    current = {"inflight": 1, "queued": 0}
    client = ReachClient(node.url, token=node.token(agent), load=lambda: current, load_report_interval_ms=100,
                         registration=registration(agent, capability="home.sdk", lease_ttl_ms=30_000))
    async with client:
        await wait_for(lambda: client.heartbeat_stats.sent == 1, message="the first heartbeat")
        for inflight in (2, 3, 4):
            current = {"inflight": inflight, "queued": 0}
            await wait_for(lambda: node.node.find(agent).load.inflight == inflight, timeout_s=5,
                           message=f"load {inflight} reported")
        stats = client.heartbeat_stats
        # the SDK counts a report when its answer is back, which may be just after the node applied it
        await wait_for(lambda: stats.load_reports == 3, timeout_s=5, message="the third load report counted")
        # the lease (30 s: a heartbeat every 10 s) was renewed once; the three new loads were reports
        assert stats.sent == 1 and stats.load_reports == 3, stats
        registered = node.node.find(agent)
        assert registered is not None and registered.version == client.registered.version
