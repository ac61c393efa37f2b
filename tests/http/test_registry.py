"""Register / heartbeat / deregister / leases / watch against a real node on real Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from node.core.models import ChangeKind, DeleteReason, TokenRole
from node.store.region import now_ms

from ..helpers import RunningNode, Watcher, registration, wait_for


async def test_register_resolve_heartbeat_deregister_round_trip(node: RunningNode) -> None:
    first = await node.register(registration("lang.translate.a1", lease_ttl_ms=5_000))
    assert first["region"] == node.node.region
    assert first["heartbeat_interval_ms"] == 5_000 // 3

    status, ticket = await node.resolve(capability="translate.text")
    assert status == 200, ticket
    assert ticket["target"]["agent_id"] == "lang.translate.a1"
    assert ticket["target"]["endpoint"] == "http://127.0.0.1:9"
    assert ticket["match"]["kind"] == "exact" and ticket["locality"] == "local"

    status, beat = await node.call("PUT", "/v1/agents/lang.translate.a1/heartbeat", json={})
    assert status == 200 and beat["changed"] is False
    assert beat["lease_expires_at_ms"] >= first["lease_expires_at_ms"]

    status, beat = await node.call("PUT", "/v1/agents/lang.translate.a1/heartbeat",
                                   json={"status": "degraded", "load": {"inflight": 3, "queued": 1, "rps": 2.5}})
    assert status == 200 and beat["changed"] is True and beat["version"] > first["version"]
    status, record = await node.call("GET", "/v1/agents/lang.translate.a1")
    assert record["status"] == "degraded" and record["load"]["inflight"] == 3

    again = await node.register(registration("lang.translate.a1", lease_ttl_ms=5_000))
    assert again["version"] > beat["version"]

    status, gone = await node.call("DELETE", "/v1/agents/lang.translate.a1")
    assert status == 200 and gone["deregistered"] is True
    status, body = await node.resolve(capability="translate.text")
    assert status == 404 and body["error"] == "no_agent_available"
    status, body = await node.call("PUT", "/v1/agents/lang.translate.a1/heartbeat", json={})
    assert status == 404 and body["error"] == "unknown_agent"


async def test_heartbeat_after_expiry_is_unknown_agent(node_factory) -> None:
    # A sweep interval far beyond the lease: the lease has passed but nobody removed the record.
    node = await node_factory(sweep_interval_ms=600_000)
    await node.register(registration("lang.translate.short", lease_ttl_ms=1_000))
    status, _ = await node.resolve(capability="translate.text")
    assert status == 200
    await wait_for(lambda: node.node.store.expired_ids(now_ms=now_ms(), limit=5), message="lease to pass")
    status, body = await node.call("PUT", "/v1/agents/lang.translate.short/heartbeat", json={})
    assert status == 404 and body["error"] == "unknown_agent", body


async def test_unrenewed_lease_disappears_with_tombstone_on_stream_and_watch(node: RunningNode) -> None:
    events: list[str] = []

    async def watch() -> None:
        async with node.session.get("/v1/watch", headers=node.headers()) as response:
            assert response.status == 200
            async for line in response.content:
                events.append(line.decode())

    watcher = asyncio.create_task(watch())
    await wait_for(lambda: any("event: hello" in e for e in events), message="watch hello")
    registered = await node.register(registration("lang.translate.lapse", lease_ttl_ms=1_000))
    version = registered["version"]

    started = asyncio.get_running_loop().time()
    await wait_for(lambda: _resolve_status(node), timeout_s=5, message="agent to disappear from resolve")
    elapsed_ms = (asyncio.get_running_loop().time() - started) * 1000
    print(f"lease 1000 ms, sweep/lease-sync 100 ms: gone from resolve after {elapsed_ms:.0f} ms")
    # lease_ttl (1 s) + sweep/lease-sync interval (0.1 s) + slack for a loaded 2-core machine
    assert 1_000 <= elapsed_ms + 50 and elapsed_ms < 1_000 + 100 + 1_000, elapsed_ms

    async def tombstones() -> list:
        changes = await node.node.store.read_changes(after_version=version)
        return [c for c in changes if c.kind is ChangeKind.DELETE and c.agent_id == "lang.translate.lapse"]

    # Routing drops the agent lazily at lease end; the leader's next sweep writes the tombstone.
    found = await wait_for(tombstones, timeout_s=5, message="tombstone on the change stream")
    assert found[0].reason is DeleteReason.EXPIRED
    await wait_for(lambda: any('"reason":"expired"' in e for e in events), message="tombstone on /v1/watch")
    watcher.cancel()


async def _resolve_status(node: RunningNode) -> bool:
    status, _ = await node.resolve(capability="translate.text")
    return status == 404


async def test_watch_replays_since_a_version(node: RunningNode) -> None:
    first = await node.register(registration("lang.translate.w1"))
    await node.register(registration("lang.translate.w2"))
    lines: list[str] = []
    async with node.session.get(f"/v1/watch?since={first['version']}", headers=node.headers()) as response:
        async def read() -> None:
            async for line in response.content:
                lines.append(line.decode())
        reader = asyncio.create_task(read())
        await wait_for(lambda: any("lang.translate.w2" in line for line in lines), message="replayed change")
        reader.cancel()
    assert not any('"agent_id":"lang.translate.w1"' in line and "upsert" in line for line in lines)


async def test_a_watch_replay_is_read_a_page_at_a_time_in_order(node: RunningNode,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The whole replay (up to 10,000 events, one of them possibly a 250 KB record) was read into
    # memory before the first was sent; now a page at a time (here 3), none read twice or skipped.
    import node.http.watch_stream as watch_stream

    monkeypatch.setattr(watch_stream, "WATCH_REPLAY_PAGE", 3)
    store = node.node.store
    asked: list[int] = []
    read_changes = store.read_changes

    async def counted(**kwargs: Any) -> Any:
        asked.append(kwargs["count"])
        return await read_changes(**kwargs)

    monkeypatch.setattr(store, "read_changes", counted)
    versions = [(await node.register(registration(f"lang.translate.p{n}")))["version"] for n in range(8)]
    async with Watcher(node.session, "/v1/watch?since=0", node.token("app.watch.one", TokenRole.CALLER)) as watcher:
        await wait_for(lambda: len(watcher.changes()) >= 8, message="the replay")
        await node.register(registration("lang.translate.live"))
        await wait_for(lambda: len(watcher.changes()) == 9, message="a live change after the replay")
    assert [int(event["id"]) for event in watcher.events if event["event"] == "change"][:8] == versions
    assert asked and max(asked) <= 3 and len(asked) >= 3, asked


async def test_two_nodes_on_one_redis_share_records_and_one_sweeps(node_factory) -> None:
    a = await node_factory()
    b = await node_factory()
    await a.register(registration("lang.translate.shared", lease_ttl_ms=1_000))
    ticket = await wait_for(lambda: _ticket(b, "translate.text"), message="B to see A's registration")
    assert ticket["target"]["agent_id"] == "lang.translate.shared"

    await wait_for(lambda: a.node.leadership.is_leader or b.node.leadership.is_leader, message="a leader")
    assert a.node.leadership.is_leader != b.node.leadership.is_leader
    # Let the lease lapse: exactly the leader expires it.
    await wait_for(lambda: _resolve_status(b), timeout_s=5, message="expiry seen by B")
    await wait_for(lambda: a.node.sweeper.stats.expired + b.node.sweeper.stats.expired, timeout_s=5,
                   message="the sweep")
    leader, follower = (a, b) if a.node.leadership.is_leader else (b, a)
    assert leader.node.sweeper.stats.expired == 1
    assert follower.node.sweeper.stats.sweeps == 0 and follower.node.sweeper.stats.expired == 0

    # The follower takes over when the leader goes away.
    await leader.aclose()
    await wait_for(lambda: follower.node.leadership.is_leader, timeout_s=5, message="failover of the duties")


async def _ticket(node: RunningNode, capability: str) -> dict | None:
    status, body = await node.resolve(capability=capability)
    return body if status == 200 else None


async def test_mass_expiry_is_held_back(node_factory) -> None:
    node = await node_factory(protect_min_agents=4, max_expire_fraction=0.5, protection_max_hold_ms=600_000)
    for i in range(4):
        await node.register(registration(f"lang.translate.m{i}", lease_ttl_ms=1_000))
    await wait_for(lambda: node.node.sweeper.stats.held_back > 0, timeout_s=5, message="hold-back")
    assert await node.node.store.count() == 4
    status, text = await node.call("GET", "/metrics")
    assert "agent_reach_sweeper_held_back" in text


async def test_readiness_probe_flips_routing_with_hysteresis(node: RunningNode) -> None:
    from ..helpers import AgentServer

    agent = await AgentServer("probed").start()
    try:
        probe = {"url": f"{agent.url}/readyz", "interval_ms": 100, "timeout_ms": 500,
                 "failure_threshold": 3, "success_threshold": 3}
        await node.register(registration("ocr.receipt.p1", capability="ocr.receipt", endpoint=agent.url,
                                         readiness_probe=probe))
        # Alive is not ready: not routable until the first probe succeeds.
        await wait_for(lambda: _ticket(node, "ocr.receipt"), message="ready after first probe")

        agent.ready = False
        before = agent.probes["readyz"]
        await wait_for(lambda: _resolve_status_cap(node, "ocr.receipt"), message="removal after failures")
        assert agent.probes["readyz"] - before >= 3  # not before failure_threshold failures
        status, record = await node.call("GET", "/v1/agents/ocr.receipt.p1")
        assert record["ready"] is False and "503" in record["probe_error"]

        agent.ready = True
        before = agent.probes["readyz"]
        await wait_for(lambda: _ticket(node, "ocr.receipt"), message="return after successes")
        assert agent.probes["readyz"] - before >= 3  # not before success_threshold successes
    finally:
        await agent.aclose()


async def test_liveness_probe_marks_agent_down(node: RunningNode) -> None:
    from ..helpers import AgentServer

    agent = await AgentServer("live").start()
    try:
        probe = {"url": f"{agent.url}/healthz", "interval_ms": 100, "failure_threshold": 2, "success_threshold": 1}
        await node.register(registration("ocr.receipt.l1", capability="ocr.receipt", endpoint=agent.url,
                                         liveness_probe=probe))
        await wait_for(lambda: _ticket(node, "ocr.receipt"), message="routable")
        await agent.aclose()  # connection refused from now on
        await wait_for(lambda: _resolve_status_cap(node, "ocr.receipt"), message="down")
        status, body = await node.resolve(capability="ocr.receipt")
        assert "not_live" in str(body["details"])
    finally:
        await agent.aclose()


async def _resolve_status_cap(node: RunningNode, capability: str) -> bool:
    status, _ = await node.resolve(capability=capability)
    return status == 404


async def test_openapi_health_and_metrics_are_public(node: RunningNode) -> None:
    async with aiohttp.ClientSession(base_url=node.url) as anonymous:
        for path in ("/healthz", "/readyz", "/v1/openapi.json", "/metrics"):
            async with anonymous.get(path) as response:
                assert response.status == 200, path
        async with anonymous.get("/v1/openapi.json") as response:
            spec = await response.json()
    assert "/v1/resolve" in spec["paths"] and "Registration" in spec["components"]["schemas"]
    assert spec["components"]["schemas"]["Registration"]["additionalProperties"] is False


async def test_federation_snapshot_serves_live_records_and_watermark(node: RunningNode) -> None:
    from node.core.models import Snapshot

    await node.register(registration("lang.translate.snap1"))
    last = await node.register(registration("lang.translate.snap2"))
    status, body = await node.call("GET", "/v1/federation/snapshot")
    assert status == 200
    snapshot = Snapshot.model_validate(body)
    assert snapshot.watermark == last["version"] and snapshot.region == node.node.region
    assert sorted(a.agent_id for a in snapshot.agents) == ["lang.translate.snap1", "lang.translate.snap2"]


async def test_openapi_lists_every_route_the_node_serves(node: RunningNode) -> None:
    from node.http.api import build_app
    from node.http.openapi import build_openapi

    spec = build_openapi(node.node.region)
    app = build_app(node.node)
    served = {(route.method.lower(), route.resource.canonical) for route in app.router.routes()
              if route.method != "HEAD"}
    documented = {(method, path) for path, operations in spec["paths"].items() for method in operations}
    assert served <= documented, sorted(served - documented)
