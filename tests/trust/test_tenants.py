"""Trust: what one agent or caller sends cannot poison a region or see another tenant's agents.

Each test is an attack that worked on the landed main, tried again over real HTTP against a
real node on a real redis-server (and, for federation, the real embedded Kafka broker).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.config import NodeConfig
from node.core import Unauthorized
from node.core.models import AgentRecord, TokenRole
from node.store import RegionSnapshots, RegionStore
from node.store.region import now_ms
from node.trust import Signer
from topology import EmbeddedKafka, build_node

from ..conftest import TEST_SECRET
from ..helpers import Pair, RunningNode, Watcher, registration, start_node, wait_for

JSON = {"Content-Type": "application/json"}


# -- poisoned records -----------------------------------------------------------------------

POISONED_HEARTBEATS = [
    (b'{"load": {"rps": Infinity}}', "load.rps"),
    (b'{"load": {"rps": -Infinity}}', "load.rps"),
    (b'{"load": {"rps": NaN}}', "load.rps"),
    (b'{"load": {"rps": 1e400}}', "load.rps"),
    (b'{"load": {"inflight": %d}}' % 2**70, "load.inflight"),
    (b'{"load": {"inflight": 1' + b"0" * 400 + b"}}", "load.inflight"),
    (b'{"load": {"queued": 9223372036854775808}}', "load.queued"),
]


@pytest.mark.parametrize("body,field", POISONED_HEARTBEATS)
async def test_poisoned_heartbeats_are_refused_and_nothing_stops(node: RunningNode, body: bytes, field: str) -> None:
    agent = "poison.load.target"
    await node.register(registration(agent, capability="poison.cap"))
    await node.register(registration("poison.load.peer", capability="poison.cap"))
    token = node.token(agent)
    before = await node.node.store.get(agent)
    async with Watcher(node.session, "/v1/watch", node.admin_token) as watcher:
        status, reply = await node.call("PUT", f"/v1/agents/{agent}/heartbeat", data=body, token=token, headers=JSON)
        assert status == 422, reply
        assert reply["error"] == "validation_failed" and reply["field"] == field, reply
        after = await node.node.store.get(agent)
        assert after is not None and before is not None
        assert after.version == before.version and after.load == before.load  # nothing was written

        # Watchers, the cache and routing go on: a later change arrives, resolves answer.
        await node.register(registration("poison.load.later", capability="poison.cap"))
        await wait_for(lambda: "poison.load.later" in watcher.agent_ids(), message="a later change on the watch")
        assert not watcher.ended
    for _ in range(20):
        status, ticket = await node.resolve(capability="poison.cap")
        assert status == 200, ticket
    assert len(node.node.store.quarantine) == 0


STRICT_REGISTRATIONS = [
    ({"lease_ttl_ms": "5000"}, "lease_ttl_ms"),
    ({"weight": True}, "weight"),
    ({"weight": 100.0}, "weight"),
    ({"max_concurrency": "10"}, "max_concurrency"),
    ({"display_name": "evil\r\nX-Injected: 1"}, "display_name"),
    ({"display_name": "nul\x00byte"}, "display_name"),
    ({"description": "a\x00b"}, "description"),
    ({"labels": {"env": "prod\r\n"}}, "labels.env"),
    ({"endpoints": {"primary": "http://127.0.0.1:9/\r\nHost: evil"}}, "endpoints"),
    ({"endpoints": {"primary": "http://127.0.0.1:9/a b"}}, "endpoints"),
    ({"endpoints": {"primary": "http://127.0.0.1:99999/"}}, "endpoints"),
    ({"callback_endpoint": "http://127.0.0.1:9/\x00"}, "callback_endpoint"),
    ({"capabilities": [{"name": "strict.cap", "tags": ["a\nb"]}]}, "capabilities.0.tags.0"),
    ({"capabilities": [{"name": "strict.cap", "version": 2}]}, "capabilities.0.version"),
    ({"allowed_callers": ["fin.*.*\n"]}, "allowed_callers.0"),
]


@pytest.mark.parametrize("change,field", STRICT_REGISTRATIONS)
async def test_registrations_are_parsed_strictly(node: RunningNode, change: dict[str, Any], field: str) -> None:
    body = {**registration("strict.reg.one"), **change}
    status, reply = await node.call("POST", "/v1/agents", data=json.dumps(body).encode(), headers=JSON)
    assert status == 422, reply
    assert reply["field"] is not None and reply["field"].startswith(field), reply
    status, _ = await node.call("GET", "/v1/agents/strict.reg.one")
    assert status == 404


async def test_free_form_json_and_route_fields_are_bounded(node: RunningNode) -> None:
    await node.register(registration("bound.send.target", capability="bound.cap"))
    envelope = b'{"operation": "bound.cap", "payload": {"n": %d}}' % 2**70
    status, reply = await node.call("POST", "/v1/send", data=envelope, headers=JSON)
    assert status == 422 and reply["field"].startswith("payload"), reply
    status, reply = await node.call("POST", "/v1/send", data=b'{"operation": "bound.cap", "payload": NaN}',
                                    headers=JSON)
    assert status == 422, reply
    status, reply = await node.resolve(capability="bound.cap", labels={"zone": "eu\x00"})
    assert status == 422 and reply["field"] == "labels.zone", reply
    status, reply = await node.call("POST", "/v1/reports", data=b'{"signature": "x", "agent_id": "a.b.c", '
                                    b'"outcome": "failure", "latency_ms": 1e400}', headers=JSON)
    assert status == 422 and reply["field"] == "latency_ms", reply
    status, reply = await node.call("GET", f"/v1/watch?since={2**70}")
    assert status == 422 and reply["field"] == "since", reply


async def test_concurrent_first_registrations_get_exactly_one_201(node: RunningNode) -> None:
    body = registration("race.first.one")
    results = await asyncio.gather(*(node.call("POST", "/v1/agents", json=body) for _ in range(20)))
    statuses = sorted(status for status, _ in results)
    assert statuses.count(201) == 1 and statuses.count(200) == 19, statuses


def _respellings(part: str) -> list[str]:
    """Other strings that a lenient base64 decoder reads as the same bytes as ``part``."""
    decoded = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    same_bytes = [part[:-1] + c for c in alphabet if c != part[-1]
                  and base64.urlsafe_b64decode(part[:-1] + c + "=" * (-len(part) % 4)) == decoded]
    return same_bytes + [part + "==", part[:4] + "!" + part[4:], part[:4] + "\n" + part[4:], " " + part]


async def test_token_signatures_have_exactly_one_spelling(node: RunningNode) -> None:
    signer = Signer(TEST_SECRET)
    token = signer.issue("ops.caller.x", TokenRole.CALLER)
    prefix, payload, mac = token.split(".")
    variants = [f"{prefix}.{payload}.{m}" for m in _respellings(mac)]
    variants += [f"{prefix}.{p}.{mac}" for p in _respellings(payload)]
    assert any(len(v) == len(token) for v in variants)  # same-length respellings exist: the real attack
    for variant in variants:
        with pytest.raises(Unauthorized):
            signer.verify(variant)
    for variant in variants:
        if "\n" in variant:
            continue  # not a valid header value at all
        status, reply = await node.call("GET", "/v1/agents", token=variant)
        assert status == 401, (variant, reply)


# -- visibility -------------------------------------------------------------------------------

VIP = "fin.ledger.vip"
OPEN = "pub.ledger.open"
LEDGER_TEXT = "settles ledger payments between banks"


def _restricted(**extra: Any) -> dict[str, Any]:
    return registration(VIP, capability="ledger.settle", description=LEDGER_TEXT, allowed_callers=["fin.*.*"],
                        callback_endpoint="http://127.0.0.1:9/callback", labels={"tier": "gold"}, **extra)


def _open() -> dict[str, Any]:
    return registration(OPEN, capability="ledger.settle", description=LEDGER_TEXT)


async def _listed(node: RunningNode, token: str, scope: str) -> set[str]:
    status, body = await node.call("GET", f"/v1/agents?scope={scope}", token=token)
    assert status == 200, body
    return {agent["agent_id"] for agent in body["agents"]}


async def _searched(node: RunningNode, token: str) -> set[str]:
    status, body = await node.call("GET", "/v1/search?q=settles+ledger+payments&scope=global", token=token)
    assert status == 200, body
    return {hit["agent_id"] for hit in body["hits"]}


async def _assert_hidden_from_outsider(node: RunningNode, outsider: str, insider: str) -> None:
    for scope in ("local", "global"):
        listed = await _listed(node, outsider, scope)
        assert VIP not in listed
    assert VIP in await _listed(node, insider, "global")
    assert VIP in await _listed(node, node.admin_token, "global")
    for path in (f"/v1/agents/{VIP}", f"/v1/agents/{VIP}/agent-card.json"):
        status, reply = await node.call("GET", path, token=outsider)
        assert status == 404 and reply["error"] == "unknown_agent", reply
        assert "127.0.0.1:9" not in json.dumps(reply)
        status, reply = await node.call("GET", path, token=insider)
        assert status == 200, reply
    async def indexed() -> bool:
        return {VIP, OPEN} <= await _searched(node, insider)

    await wait_for(indexed, message="the index holds both ledger agents")
    assert OPEN in await _searched(node, outsider)
    assert VIP not in await _searched(node, outsider)
    status, reply = await node.resolve(token=outsider, agent_id=VIP)
    assert status == 404 and VIP not in json.dumps(reply.get("details", {})).replace(f"no agent {VIP}", ""), reply


async def test_allowed_callers_hide_an_agent_on_every_route(redis_url: str, region: str) -> None:
    config = NodeConfig(region=region, redis_url=redis_url, port=0, semantic_enabled=False, sweep_interval_ms=100,
                        lease_sync_interval_ms=100, leader_ttl_ms=1_000, egress={"allow": ["loopback"]})
    node = await start_node(build_node(config, secret=TEST_SECRET))
    outsider = node.token("ops.caller.x", TokenRole.CALLER)
    insider = node.token("fin.books.y", TokenRole.CALLER)
    try:
        async with (Watcher(node.session, "/v1/watch", outsider) as outside,
                    Watcher(node.session, "/v1/watch", insider) as inside):
            await node.register(_restricted())
            await node.register(_open())
            await wait_for(lambda: {VIP, OPEN} <= inside.agent_ids() and OPEN in outside.agent_ids(),
                           message="live changes reach the watchers")
            await _assert_hidden_from_outsider(node, outsider, insider)

            status, _ = await node.call("DELETE", f"/v1/agents/{VIP}")
            assert status == 200
            await wait_for(lambda: any(c["agent_id"] == VIP and c["kind"] == "delete" for c in inside.changes()),
                           message="the insider sees the tombstone")
            await node.register(registration("pub.ledger.after", capability="ledger.settle"))
            await wait_for(lambda: "pub.ledger.after" in outside.agent_ids(), message="a later change reaches outside")
            assert VIP not in outside.agent_ids()  # neither the record nor its tombstone
        async with Watcher(node.session, "/v1/watch?since=0", outsider) as replay:
            await wait_for(lambda: "pub.ledger.after" in replay.agent_ids(), message="the replay")
            assert VIP not in replay.agent_ids()
        async with Watcher(node.session, "/v1/watch?since=0", insider) as replay:
            await wait_for(lambda: "pub.ledger.after" in replay.agent_ids(), message="the replay")
            assert VIP in replay.agent_ids()

        # The snapshot and the vectors show every record: for peer regions and admins only.
        for path, method, body in (("/v1/federation/snapshot", "GET", None),
                                   ("/v1/semantic/vectors", "POST", {"keys": []})):
            status, reply = await node.call(method, path, token=outsider, json=body)
            assert status == 403 and reply["error"] == "peers_only", reply
            for token in (node.token(f"federation:{region}", TokenRole.PEER), node.admin_token):
                status, reply = await node.call(method, path, token=token, json=body)
                assert status == 200, reply
    finally:
        await node.aclose()


async def test_a_trace_hides_events_of_an_agent_the_caller_may_no_longer_see(node: RunningNode) -> None:
    await node.register(registration(VIP, capability="ledger.trace"))
    outsider = node.token("ops.caller.x", TokenRole.CALLER)
    status, ticket = await node.resolve(token=outsider, capability="ledger.trace", trace_id="trace-vis-1")
    assert status == 200, ticket
    status, trace = await node.call("GET", "/v1/traces/trace-vis-1", token=outsider)
    assert status == 200 and trace["events"][0]["agent_id"] == VIP, trace
    await node.register(registration(VIP, capability="ledger.trace", allowed_callers=["fin.*.*"]))
    status, trace = await node.call("GET", "/v1/traces/trace-vis-1", token=outsider)
    assert status == 404, trace
    status, trace = await node.call("GET", "/v1/traces/trace-vis-1")
    assert status == 200 and trace["count"] == 1  # the admin still sees it


async def test_remote_records_follow_allowed_callers_too(redis_url: str, region: str) -> None:
    async with EmbeddedKafka() as kafka:
        pair = Pair(redis_url, region, kafka.bootstrap_servers, secret=TEST_SECRET, discovery=True)
        x, y = pair.names
        try:
            node_x, _ = await pair.start(x)
            node_y, _ = await pair.start(y)
            outsider = node_y.token("ops.caller.x", TokenRole.CALLER)
            insider = node_y.token("fin.books.y", TokenRole.CALLER)
            async with Watcher(node_y.session, "/v1/watch", outsider) as outside:
                await node_x.register(_restricted(lease_ttl_ms=600_000))
                await node_x.register({**_open(), "lease_ttl_ms": 600_000})
                await wait_for(lambda: _remote(node_y, insider), timeout_s=15, message="both agents reach y")
                await wait_for(lambda: OPEN in outside.agent_ids(), message="the open agent on y's watch")
                await _assert_hidden_from_outsider(node_y, outsider, insider)
                assert VIP not in outside.agent_ids()
        finally:
            await pair.aclose()


async def _remote(node: RunningNode, insider: str) -> bool:
    return {VIP, OPEN} <= await _listed(node, insider, "global")


# -- quarantine -------------------------------------------------------------------------------

def _stored_json(agent_id: str, region: str, version: int, **changes: Any) -> str:
    """A record as the landed main stored a heartbeat of ``rps: Infinity``: the float as null."""
    now = now_ms()
    record = AgentRecord.model_validate({**registration(agent_id, capability="quar.cap"), "region": region,
                                         "version": version, "registered_at_ms": now, "updated_at_ms": now,
                                         "lease_expires_at_ms": now + 600_000, **changes})
    return record.model_dump_json().replace('"rps":0.0', '"rps":null')


async def _poison(store: RegionStore, agent_id: str) -> int:
    """Write a record that does not parse, with its change entry, as a foreign writer would."""
    version = int(await store.redis.incr(store.key_version))
    raw = _stored_json(agent_id, store.region, version)
    async with store.redis.pipeline(transaction=True) as pipe:
        pipe.hset(store.key_agents, agent_id, raw)
        pipe.zadd(store.key_leases, {agent_id: now_ms() + 600_000})
        pipe.xadd(store.key_changes, {"kind": "upsert", "agent_id": agent_id, "at": str(now_ms()), "record": raw},
                  id=f"{version}-0")
        await pipe.execute()
    return version


async def test_a_record_that_does_not_parse_is_quarantined_and_the_region_goes_on(redis_url: str,
                                                                                 region: str) -> None:
    async with EmbeddedKafka() as kafka:
        pair = Pair(redis_url, region, kafka.bootstrap_servers, secret=TEST_SECRET)
        x, y = pair.names
        store = RegionStore.from_url(redis_url, region=x)
        try:
            # Before x starts: two good agents and one record that does not parse.
            for name in ("quar.grp.good1", "quar.grp.good2"):
                now = now_ms()
                good = AgentRecord.model_validate({**registration(name, capability="quar.cap"), "region": x,
                                                   "registered_at_ms": now, "updated_at_ms": now,
                                                   "lease_expires_at_ms": now + 600_000})
                await store.register(good, at_ms=now)
            await _poison(store, "quar.grp.bad1")

            node_x, federation_x = await pair.start(x)  # the landed main refused to start here
            node_y, federation_y = await pair.start(y)
            status, ready = await node_x.call("GET", "/readyz")
            assert status == 200, ready
            for _ in range(10):
                status, ticket = await node_x.resolve(capability="quar.cap")
                assert status == 200 and ticket["target"]["agent_id"] != "quar.grp.bad1", ticket

            status, listed = await node_x.call("GET", "/v1/admin/quarantine")
            assert status == 200, listed
            keys = {item["key"] for item in listed["items"]}
            assert f"{store.key_agents}/quar.grp.bad1" in keys
            status, reply = await node_x.call("GET", "/v1/admin/quarantine",
                                              token=node_x.token("ops.caller.x", TokenRole.CALLER))
            assert status == 403
            metrics = await node_x.session.get("/metrics")
            assert "agent_reach_quarantined{" in await metrics.text()

            # It federates: y receives the good agents (the publisher read past the bad entry).
            peer = federation_y.catalog.peer(x)
            await wait_for(lambda: {"quar.grp.good1", "quar.grp.good2"} <= {r.agent_id for r in peer.index},
                           timeout_s=15, message="y holds x's good agents")
            assert peer.index.get("quar.grp.bad1") is None

            # A bad change while running: the cache, the publisher and the watchers go on.
            async with Watcher(node_x.session, "/v1/watch", node_x.admin_token) as watcher:
                await _poison(store, "quar.grp.bad2")
                await node_x.register(registration("quar.grp.good3", capability="quar.cap", lease_ttl_ms=600_000))
                await wait_for(lambda: "quar.grp.good3" in watcher.agent_ids(), message="later change watched")
                assert not watcher.ended
            await wait_for(lambda: peer.index.get("quar.grp.good3"), timeout_s=15, message="y gets a later agent")
            assert peer.index.get("quar.grp.bad2") is None
            await wait_for(lambda: peer.in_sync, timeout_s=15, message="y's replica of x matches x's beacon")

            status, listed = await node_x.call("GET", "/v1/admin/quarantine")
            assert any(item["agent_id"] == "quar.grp.bad2" for item in listed["items"]), listed

            # The agent registers again: its record parses and leaves the quarantine.
            await node_x.register(registration("quar.grp.bad1", capability="quar.cap", lease_ttl_ms=600_000))
            status, listed = await node_x.call("GET", "/v1/admin/quarantine")
            assert f"{store.key_agents}/quar.grp.bad1" not in {item["key"] for item in listed["items"]}

            # A restart over the same Redis starts again and serves what parses.
            pair.running.remove(node_x)
            await node_x.aclose()
            await _poison(store, "quar.grp.bad3")
            node_x, _ = await pair.start(x)
            status, body = await node_x.call("GET", "/v1/agents")
            assert status == 200
            assert {"quar.grp.good1", "quar.grp.good2", "quar.grp.good3", "quar.grp.bad1"} <= {
                agent["agent_id"] for agent in body["agents"]}
            del federation_x
        finally:
            await pair.aclose()
            await store.aclose()


async def test_a_change_entry_that_is_not_utf8_is_quarantined_and_the_tail_goes_on(node: RunningNode,
                                                                                    redis_url: str) -> None:
    # Decoding the change stream's reply whole raised UnicodeDecodeError on one such byte: the
    # cache's tail died (the node stopped seeing every later change), and so did a watch replay.
    store = node.node.store
    await node.register(registration("utf.grp.before", capability="utf.cap"))
    version = int(await store.redis.incr(store.key_version))
    await store.redis.execute_command("XADD", store.key_changes, f"{version}-0", "kind", "upsert", "agent_id",
                                      "utf.grp.broken", "at", str(now_ms()), "record", b'{"agent_id":"\xff"}')
    other = RegionStore.from_url(redis_url, region=store.region)  # another replica's write: seen by the tail only
    try:
        now = now_ms()
        await other.register(AgentRecord.model_validate({**registration("utf.grp.after", capability="utf.cap"),
                                                         "region": store.region, "registered_at_ms": now,
                                                         "updated_at_ms": now, "lease_expires_at_ms": now + 600_000}),
                             at_ms=now)
    finally:
        await other.aclose()
    await wait_for(lambda: node.node.cache.index.get("utf.grp.after"), message="the tail to read on past the entry")
    status, listed = await node.call("GET", "/v1/admin/quarantine")
    assert status == 200 and any(item["key"] == f"{store.key_changes}@{version}" and "utf-8" in item["error"]
                                 for item in listed["items"]), listed
    assert [change.agent_id for change in await store.read_changes(after_version=0)] == [
        "utf.grp.before", "utf.grp.broken", "utf.grp.after"]  # the broken one read as its quarantined delete


async def test_a_stored_record_that_is_not_utf8_leaves_the_snapshot_and_the_digest_to_the_others(
        node: RunningNode) -> None:
    # Decoding a whole HSCAN/HGETALL reply raised on one such value: the snapshot served to peers
    # and every digest of the region failed until someone deleted it by hand.
    store = node.node.store
    await node.register(registration("utf.grp.kept", capability="utf.cap"))
    await store.redis.hset(store.key_agents, "utf.grp.garbled", b'{"version":9,"agent_id":"\xff"}')
    await store.redis.zadd(store.key_leases, {"utf.grp.garbled": now_ms() + 600_000})
    versions = await RegionSnapshots(store).snapshot_versions()
    assert set(versions.agents) == {"utf.grp.kept"}
    async with node.session.get("/v1/federation/snapshot", headers=node.headers()) as response:
        assert response.status == 200
        snapshot = json.loads(await response.read())
    assert [agent["agent_id"] for agent in snapshot["agents"]] == ["utf.grp.kept"]
    status, listed = await node.call("GET", "/v1/admin/quarantine")
    assert status == 200 and any(item["key"] == f"{store.key_agents}/utf.grp.garbled" for item in listed["items"])


async def test_the_policy_route_tells_agents_which_addresses_they_may_register(node: RunningNode) -> None:
    status, policy = await node.call("GET", "/v1/policy", token=node.token("ops.caller.x", TokenRole.CALLER))
    assert status == 200 and policy["egress_allow"] == ["loopback"] and policy["egress_deny"] == [], policy
    status, reply = await node.call("POST", "/v1/agents", json=registration(
        "meta.data.grab", endpoint="http://169.254.169.254/latest/meta-data/"))
    assert status == 422 and reply["error"] == "egress_denied" and reply["field"] == "endpoints.primary", reply


async def test_agent_reach_node_starts_over_a_redis_holding_a_record_that_does_not_parse(redis_url: str,
                                                                                        region: str) -> None:
    store = RegionStore.from_url(redis_url, region=region)
    try:
        await _poison(store, "quar.cli.bad")
    finally:
        await store.aclose()
    env = {**os.environ, "AGENT_REACH_SECRET": TEST_SECRET.decode()}
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("agent-reach")), "node", "--region", region, "--redis", redis_url,
        "--port", "0", "--no-semantic", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
    assert process.stdout is not None
    output = []
    try:
        async with asyncio.timeout(30):
            while not (match := re.search(r"url=(http://127\.0\.0\.1:\d+)", output[-1] if output else "")):
                line = (await process.stdout.readline()).decode()
                assert line, "the node exited:\n" + "".join(output)  # the landed main exited here
                output.append(line)
        url = match.group(1)
        admin = Signer(TEST_SECRET).issue("admin", TokenRole.ADMIN, ttl_s=600)
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {admin}"}) as session:
            async with session.get(f"{url}/readyz") as response:
                assert response.status == 200
            async with session.get(f"{url}/v1/admin/quarantine") as response:
                listed = await response.json()
            assert [item["agent_id"] for item in listed["items"]] == ["quar.cli.bad"], listed
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await process.wait()
    assert process.returncode == 0
