"""Attacks on a live node (round 21): each test is one that worked on main before its fix.

Real HTTP against a real node on the test redis-server; the attacker holds a valid caller or
agent token (or none) and nothing else.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiokafka import AIOKafkaProducer

from federation import AntiEntropy, FederationConfig, PeerCatalog, PeerConfig, ReplicaStore
from federation.antientropy import SNAPSHOT_PATH
from federation.errors import SnapshotUnavailable
from node.core.models import TokenRole
from topology import EmbeddedKafka

from ..conftest import TEST_SECRET
from ..helpers import Pair, RunningNode, Watcher, registration, topic_messages, wait_for
from ..helpers import serve_routes as _serve


async def _stages(node: RunningNode, token: str, **request: Any) -> dict[str, str]:
    status, body = await node.resolve(token, **request)
    assert status == 404 and body["error"] == "no_agent_available", body
    return body["details"]["stages"]


async def test_a_refused_resolve_does_not_count_agents_the_caller_may_not_see(node: RunningNode) -> None:
    # A restricted agent that is not routable (draining, wrong labels, no such tag) was counted
    # in the refusal's reasons: "1 matched, none routable (1 draining)" told a caller outside its
    # allowed_callers that the agent exists, and its state; an unknown id says "no agent …".
    await node.register(registration("vault.keys.hidden", capability="vault.open", status="draining",
                                     labels={"tier": "gold"}, allowed_callers=["finance.*.*"]))
    await node.register(registration("vault.keys.public", capability="vault.list"))
    eve = node.token("eve.outside.caller", TokenRole.CALLER)
    insider = node.token("finance.books.caller", TokenRole.CALLER)

    assert await _stages(node, eve, agent_id="vault.keys.hidden") == {"local": "no agent vault.keys.hidden"}
    assert await _stages(node, eve, agent_id="vault.keys.nobody") == {"local": "no agent vault.keys.nobody"}
    assert await _stages(node, eve, capability="vault.open") == {"local": "no agent has capability 'vault.open'"}
    assert await _stages(node, eve, pattern="vault.keys.*", labels={"tier": "gold"}) == {
        "local": "1 matched, none routable (1 labels)"}  # the public one: the hidden one is not counted
    assert await _stages(node, eve, pattern="vault.*.*", tags=["nothing"]) == {
        "local": "no agent offers a capability tagged nothing (1 without the tags)"}
    # Whoever may see it is still told why it is not routable.
    assert await _stages(node, insider, agent_id="vault.keys.hidden") == {
        "local": "1 matched, none routable (1 draining)"}
    assert await _stages(node, insider, capability="vault.open") == {"local": "1 matched, none routable (1 draining)"}


async def test_a_refusal_does_not_tell_that_a_hidden_agent_s_breaker_is_open(node: RunningNode) -> None:
    await node.register(registration("vault.keys.broken", capability="vault.break", allowed_callers=["finance.*.*"]))
    eve = node.token("eve.outside.caller", TokenRole.CALLER)
    insider = node.token("finance.books.caller", TokenRole.CALLER)
    status, ticket = await node.resolve(insider, agent_id="vault.keys.broken")
    assert status == 200, ticket
    report = {"signature": ticket["signature"], "agent_id": "vault.keys.broken", "outcome": "failure"}
    status, _ = await node.call("POST", "/v1/reports", json={"reports": [report] * 10}, token=insider)
    assert status == 200
    assert await _stages(node, insider, agent_id="vault.keys.broken") == {
        "local": "1 matched, none routable (1 circuit_open)"}
    assert await _stages(node, eve, agent_id="vault.keys.broken") == {"local": "no agent vault.keys.broken"}


async def test_a_watch_ends_when_its_token_expires(node: RunningNode) -> None:
    # A token is refused once expired, but a /v1/watch stream opened before went on for ever
    # (keep-alives every 15 s, every change after): a short-lived token bought a lifelong feed.
    token = node.token("short.lived.watcher", TokenRole.CALLER, ttl_s=2)
    expires_at_s = node.node.signer.verify(token).exp
    async with Watcher(node.session, "/v1/watch", token) as watcher:
        assert watcher.kinds() == ["hello"]
        await wait_for(lambda: watcher.ended, timeout_s=5, message="the stream ending with its token")
        ended_at_s = time.time()
        await node.register(registration("lang.translate.late"))
    assert watcher.kinds() == ["hello", "expired"]
    assert expires_at_s <= ended_at_s < expires_at_s + 1.5
    status, body = await node.call("GET", "/v1/agents", token=token)
    assert (status, body["error"]) == (401, "token_expired")


async def test_refusals_for_made_up_agent_ids_take_no_room_in_the_decision_memory(node: RunningNode) -> None:
    # Each refused resolve was kept under its request's agent_id, which the caller makes up: at
    # most 10,000 ids x 50 entries of caller-written text (~1-2 KB each, ~1 GB) with no rate
    # limit by default, and the first-seen eviction pushed real agents' decisions out.
    await node.register(registration("vault.keys.kept", capability="vault.kept", status="draining"))
    eve = node.token("eve.outside.caller", TokenRole.CALLER)
    made_up = [f"junk{i}.made.up" for i in range(20)]
    for agent_id in [*made_up, "vault.keys.kept"]:
        status, _ = await node.resolve(eve, agent_id=agent_id, capability="x" * 500)
        assert status == 404
    status, body = await node.call("GET", f"/v1/agents/{made_up[0]}/decisions")  # admin
    assert (status, body["error"]) == (404, "unknown_agent"), body
    assert len(node.node.decisions._recent) == 1  # noqa: SLF001 - what the memory holds is the point
    status, body = await node.call("GET", "/v1/agents/vault.keys.kept/decisions")
    assert status == 200 and [entry["result"] for entry in body["decisions"]] == ["no_agent_available"], body


async def test_a_peer_s_summary_names_no_capability_to_a_caller(redis_url: str, region: str) -> None:
    # GET /v1/regions showed every caller each peer's summary with its capabilities by name and
    # count, those only restricted agents offer too: a list of what is hidden, with its size.
    async with EmbeddedKafka() as kafka:
        pair = Pair(redis_url, region, kafka.bootstrap_servers, secret=TEST_SECRET)
        x, y = pair.names
        try:
            node_x, _ = await pair.start(x)
            node_y, federation_y = await pair.start(y)
            await node_x.register(registration("payroll.run.hidden", capability="payroll.run",
                                               allowed_callers=["finance.*.*"], lease_ttl_ms=600_000))

            def summarized() -> bool:
                summary = federation_y.catalog.peer(x).summary
                return summary is not None and "payroll.run" in summary.capabilities

            await wait_for(summarized, timeout_s=15, message="x's summary in y")
            eve = node_y.token("eve.outside.caller", TokenRole.CALLER)
            status, seen = await node_y.call("GET", "/v1/regions", token=eve)
            assert status == 200
            (peer,) = seen["peers"]
            assert peer["summary"] is not None and "capabilities" not in peer["summary"], peer["summary"]
            assert "payroll" not in str(seen)
            status, seen = await node_y.call("GET", "/v1/federation/status", token=eve)  # the same view
            assert status == 200 and seen["peers"][0]["summary"] is not None and "payroll" not in str(seen)
            for path in ("/v1/regions", "/v1/federation/status"):  # admin: the whole summary
                status, seen = await node_y.call("GET", path)
                assert status == 200 and "payroll.run" in seen["peers"][0]["summary"]["capabilities"], path
        finally:
            await pair.aclose()


async def test_a_caller_cannot_wipe_another_s_trace_nor_show_an_agent_its_events(node: RunningNode) -> None:
    # POST /v1/traces took any trace_id as long as the events named the sender as caller, and a
    # trace kept only its newest 1,000 events: 1,000 junk events erased someone else's trace, and
    # an event naming an agent was shown to that agent, which had taken no part in it.
    await node.register(registration("ledger.post.victim", capability="ledger.post"))
    alice = node.token("app.alice.caller", TokenRole.CALLER)
    mallory = node.token("app.mallory.caller", TokenRole.CALLER)
    witness = node.token("ledger.post.victim")  # the agent the junk names
    status, ticket = await node.resolve(alice, capability="ledger.post", trace_id="trace-alice")
    assert status == 200, ticket
    junk = [{"event": "delivery", "at_ms": 1_000 + index, "trace_id": "trace-alice", "caller": "app.mallory.caller",
             "agent_id": "ledger.post.victim", "attempt": index % 1_000, "result": "success"} for index in range(1_200)]
    for start in range(0, len(junk), 400):
        status, body = await node.call("POST", "/v1/traces", json={"events": junk[start:start + 400]}, token=mallory)
        assert status == 200 and body["accepted"] == 400, body

    status, trace = await node.call("GET", "/v1/traces/trace-alice", token=alice)
    assert status == 200, trace
    assert [(e["event"], e["caller"], e["agent_id"]) for e in trace["events"]] == [
        ("decision", "app.alice.caller", "ledger.post.victim")]
    # the agent sees the node's decision that routed to it (who asked withheld), not what mallory says about it
    status, trace = await node.call("GET", "/v1/traces/trace-alice", token=witness)
    assert status == 200 and [(e["event"], e["caller"]) for e in trace["events"]] == [("decision", "(withheld)")], trace
    # mallory flooded only her own share: her newest 1,000 events
    status, trace = await node.call("GET", "/v1/traces/trace-alice", token=mallory)
    assert status == 200 and trace["count"] == 1_000 and trace["events"][0]["at_ms"] == 1_200, trace["count"]
    status, trace = await node.call("GET", "/v1/traces/trace-alice")  # admin: all of it, by time
    assert status == 200 and trace["count"] == 1_001 and trace["events"][0]["caller"] == "app.mallory.caller"
    assert trace["events"][-1]["event"] == "decision"

async def test_one_caller_holds_at_most_its_share_of_watch_streams(node_factory) -> None:
    """Every change is offered to every watcher: streams are capped per caller (429 too_many_watches),
    the cap is the caller's alone, and a stream that ends gives its place back."""
    node = await node_factory(watch_streams_per_caller=2)
    greedy, other = node.token("greedy.one.c", TokenRole.CALLER), node.token("other.one.c", TokenRole.CALLER)
    async with Watcher(node.session, "/v1/watch", greedy), Watcher(node.session, "/v1/watch", greedy):
        status, body = await node.call("GET", "/v1/watch", token=greedy)
        assert status == 429 and body["error"] == "too_many_watches", body
        assert "greedy.one.c" in body["message"]
        async with Watcher(node.session, "/v1/watch", other) as theirs:
            assert theirs.kinds() == ["hello"] and not theirs.ended
    await wait_for(lambda: not node.node.watch.subscribers, timeout_s=10, message="the streams ended on the node")
    async with Watcher(node.session, "/v1/watch", greedy) as again:
        assert again.kinds() == ["hello"]


async def test_one_ticket_holder_cannot_open_an_agent_s_breaker_for_everyone(node: RunningNode) -> None:
    """A ticket may be reported on many times: one caller's made-up failures eject the agent from
    that caller's own routing, not from anyone else's (node.outcomes)."""
    await node.register(registration("victim.grp.a1", capability="victim.work"))
    await node.register(registration("victim.grp.a2", capability="victim.work"))
    liar, honest = node.token("liar.one.c", TokenRole.CALLER), node.token("honest.one.c", TokenRole.CALLER)
    status, ticket = await node.resolve(token=liar, capability="victim.work")
    assert status == 200
    failure = {"signature": ticket["signature"], "agent_id": "victim.grp.a1", "outcome": "failure"}
    status, body = await node.call("POST", "/v1/reports", json={"reports": [failure] * 50}, token=liar)
    assert status == 200 and body["accepted"] == 50
    status, body = await node.call("GET", "/v1/breakers", token=node.admin_token)
    assert status == 200 and all(b["state"] == "closed" for b in body["breakers"]), body
    status, ticket = await node.resolve(token=honest, agent_id="victim.grp.a1")
    assert status == 200, ticket


async def test_a_peer_s_change_cannot_name_another_agent_region_or_version(redis_url: str, region: str) -> None:
    # A change on x's topic was applied with whatever record it carried: the record of x's
    # mule.grp.a1 renamed to this region's pay.core.prod, region y, an address of the writer's
    # choosing, sat in y's replica of x beside the real one. y listed it as a y agent and routed
    # to it with a route credential for pay.core.prod (its aud), good at the real agent.
    async with EmbeddedKafka() as kafka:
        pair = Pair(redis_url, region, kafka.bootstrap_servers, secret=TEST_SECRET)
        x, y = pair.names
        try:
            node_x, federation_x = await pair.start(x)
            node_y, federation_y = await pair.start(y)
            await node_y.register(registration("pay.core.prod", capability="pay.charge", lease_ttl_ms=600_000))
            await node_x.register(registration("mule.grp.a1", capability="mule.work", lease_ttl_ms=600_000))
            replica = federation_y.catalog.peer(x)
            await wait_for(lambda: replica.index.get("mule.grp.a1"), timeout_s=15, message="x's agent in y")
            topic = federation_x.config.topic(x)
            (sent,) = [m for m in await topic_messages(kafka.bootstrap_servers, topic)
                       if m.change is not None and m.change.agent_id == "mule.grp.a1"]
            change, real = sent.change, sent.change.record
            next_version = change.version + 1
            forged = [  # each a change of x's agent whose record is not that agent's at that version
                real.model_copy(update={"agent_id": "pay.core.prod", "region": y, "version": next_version,
                                        "endpoints": {"primary": "http://127.0.0.1:9/steal"}}),
                real.model_copy(update={"region": y, "version": next_version}),
                real.model_copy(update={"version": next_version + 50}),
            ]
            invalid_before = federation_y.consumer.stats.invalid
            producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
            await producer.start()
            try:
                for record in forged:
                    message = sent.model_copy(update={"change": change.model_copy(
                        update={"version": next_version, "record": record})})
                    await producer.send_and_wait(topic, message.encode(), key=b"mule.grp.a1", partition=0)
            finally:
                await producer.stop()
            await wait_for(lambda: federation_y.consumer.stats.invalid >= invalid_before + 3, timeout_s=15,
                           message="the forged changes refused and counted")
            await node_x.register(registration("mule.grp.a2", capability="mule.work", lease_ttl_ms=600_000))
            await wait_for(lambda: replica.index.get("mule.grp.a2"), timeout_s=15, message="the consumer goes on")

            assert replica.index.get("pay.core.prod") is None
            held = replica.index.get("mule.grp.a1")
            assert held is not None and (held.region, held.version) == (x, change.version)
            status, listed = await node_y.call("GET", "/v1/agents?pattern=pay.*.*")
            assert status == 200 and [(a["agent_id"], a["region"]) for a in listed["agents"]] == [
                ("pay.core.prod", y)], listed
            status, body = await node_y.call("GET", "/v1/admin/quarantine")
            assert status == 200 and sum(item["source"] == "kafka" for item in body["items"]) == 3, body
            assert "change.record.agent_id" in str(body["items"])
            eve = node_y.token("eve.outside.caller", TokenRole.CALLER)
            for _ in range(10):
                status, ticket = await node_y.resolve(eve, capability="mule.work")
                assert status == 200 and ticket["target"]["region"] == x, ticket
                assert ticket["target"]["endpoint"] == "http://127.0.0.1:9", ticket
        finally:
            await pair.aclose()


async def test_a_peer_s_snapshot_cannot_list_another_region_s_agents(redis_url: str, region: str) -> None:
    # Anti-entropy wrote every record of a peer's snapshot into the replica, whatever region the
    # record named: a snapshot of p could slip in an agent "of" this region, routed as such.
    peer, here = f"{region}-p", f"{region}-h"

    def record(agent_id: str, home: str) -> dict[str, Any]:
        return {**registration(agent_id), "region": home, "version": 1, "lease_expires_at_ms": 2**40}

    document = {"region": peer, "watermark": 1, "taken_at_ms": 1,
                "agents": [record("own.grp.a1", peer), record("pay.core.prod", here)]}

    async def serve_snapshot(request: web.Request) -> web.Response:
        return web.json_response(document)

    runner, url = await _serve(web.get(SNAPSHOT_PATH, serve_snapshot))
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        config = FederationConfig(region=here, bootstrap_servers="127.0.0.1:1", peers=[
            PeerConfig(region=peer, node_urls=[url])])
        store = ReplicaStore(client, region=here, key_prefix="ar", feed_maxlen=1_000)
        catalog = PeerCatalog(store, peers=[peer], stale_after_ms=60_000, feed_block_ms=50)
        async with AntiEntropy(config, catalog=catalog, replica_store=store, token=lambda: "unused") as anti_entropy:
            snapshot = await anti_entropy.fetch_snapshot(peer)
        assert [agent.agent_id for agent in snapshot.agents] == ["own.grp.a1"]
        (item,) = store.quarantine.items()
        assert item.agent_id == "pay.core.prod" and here in item.error, item
    finally:
        await client.aclose()
        await runner.cleanup()


async def test_a_peer_s_snapshot_is_held_to_a_size_and_a_silence_not_to_one_whole_deadline(
        redis_url: str, region: str) -> None:
    # The whole fetch had one 5 s deadline: a large region's snapshot (100,000 agents take ~5 s to read
    # here) could never be read, while a peer sending without end was read until then, into memory.
    peer, here = f"{region}-p", f"{region}-h"
    line = orjson.dumps({**registration("own.grp.a1"), "region": peer, "version": 1, "lease_expires_at_ms": 2**40})

    async def steady(request: web.Request) -> web.StreamResponse:  # 0.6 s in all, a chunk every 0.1 s
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(orjson.dumps({"region": peer, "watermark": 1, "taken_at_ms": 1})[:-1] + b',"agents":[\n')
        for _ in range(5):
            await asyncio.sleep(0.1)
            await response.write(b"\n")
        await response.write(line + b"\n]}\n")
        return response

    async def endless(request: web.Request) -> web.StreamResponse:  # bounded here: 64 KiB past the cap
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(orjson.dumps({"region": peer, "watermark": 1, "taken_at_ms": 1})[:-1] + b',"agents":[\n')
        for _ in range(16):
            await response.write((line + b",\n") * 16)
        return response

    runner, url = await _serve(web.get(SNAPSHOT_PATH, steady), web.get("/endless" + SNAPSHOT_PATH, endless))
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        for base, cap in ((url, 1_000_000), (url + "/endless", 32_768)):
            config = FederationConfig(region=here, bootstrap_servers="127.0.0.1:1", snapshot_timeout_ms=300,
                                      snapshot_deadline_ms=10_000, snapshot_max_bytes=cap,
                                      peers=[PeerConfig(region=peer, node_urls=[base])])
            store = ReplicaStore(client, region=here, key_prefix="ar", feed_maxlen=1_000)
            catalog = PeerCatalog(store, peers=[peer], stale_after_ms=60_000, feed_block_ms=50)
            async with AntiEntropy(config, catalog=catalog, replica_store=store, token=lambda: "unused") as anti:
                if base == url:  # longer than the silence allowed, never silent that long
                    snapshot = await anti.fetch_snapshot(peer)
                    assert [agent.agent_id for agent in snapshot.agents] == ["own.grp.a1"]
                else:
                    with pytest.raises(SnapshotUnavailable, match="larger than 32,768 bytes"):
                        await anti.fetch_snapshot(peer)
    finally:
        await client.aclose()
        await runner.cleanup()


async def test_an_agent_s_odd_json_answer_still_reaches_the_caller_s_callback(node: RunningNode) -> None:
    # A callback wrapped the agent's decoded JSON answer as the result envelope's payload; an answer
    # that is JSON but no envelope payload (nested deeper than 32 levels, 1e300) failed that
    # validation outside any handler: the background delivery died with a traceback in the log and
    # the caller never got its result, nor a reach.delivery_failed.
    answers = [b"[" * 40 + b"]" * 40, b'{"big": 1e300}',
               b'{"id": "m-1", "type": "response", "trace_id": "t-1", "payload": 1e300}']
    callbacks: list[dict[str, Any]] = []

    async def invoke(request: web.Request) -> web.Response:
        return web.Response(body=answers[int(request.query["n"])], content_type="application/json")

    async def callback(request: web.Request) -> web.Response:
        callbacks.append(await request.json())
        return web.json_response({"ok": True})

    runner, base = await _serve(web.post("/invoke", invoke), web.post("/callback", callback))
    try:
        await node.register(registration("app.waiting.caller", capability="app.wait", endpoint=base + "/unused",
                                         callback_endpoint=base + "/callback"))
        token = node.token("app.waiting.caller")
        sent = []
        for n in range(len(answers)):
            await node.register(registration(f"odd.json.a{n}", capability=f"odd.json{n}",
                                             endpoint=f"{base}/invoke?n={n}"))
            envelope = {"id": f"odd-{n}", "operation": f"odd.json{n}", "payload": {"n": n}, "trace_id": f"odd-{n}"}
            status, body = await node.call("POST", "/v1/send?delivery=callback", json=envelope, token=token)
            assert status == 202, body
            sent.append(envelope["id"])
        await wait_for(lambda: len(callbacks) == len(answers), timeout_s=10, message="every callback")
        by_request = {result["reply_to_id"]: result for result in callbacks}
        assert sorted(by_request) == sent
        for n, envelope_id in enumerate(sent):
            result = by_request[envelope_id]
            assert result["operation"] == f"odd.json{n}" and result["source_agent"] == f"odd.json.a{n}", result
            assert result["payload"] == answers[n].decode(), result  # the answer as it came, as text
    finally:
        await runner.cleanup()
