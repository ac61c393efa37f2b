"""Proxy mode (POST /v1/send), passthrough, callbacks and the trace query, on a real node and real agents."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from node.client import ReachClient
from node.config import NodeConfig, ProxySettings
from node.core import Envelope, EnvelopeExpired, HopLimitExceeded, epoch_ms
from node.core.models import TokenRole
from node.http import bound_port
from node.http.proxy import PROXY_KEY
from node.service import RegistryNode

from ..conftest import TEST_SECRET
from ..helpers import RunningNode, registration, start_node, wait_for

Handler = Callable[[dict[str, Any]], Awaitable[web.StreamResponse]]


class EnvelopeAgent:
    """A real envelope-speaking agent on 127.0.0.1: records what it receives, answers a reply envelope."""

    def __init__(self, name: str, handler: Handler | None = None) -> None:
        self.name = name
        self.received: list[dict[str, Any]] = []
        self.handler = handler
        self.gate: asyncio.Event | None = None
        self.runner: web.AppRunner | None = None
        self.url = ""

    @property
    def invoke_url(self) -> str:
        return self.url + "/invoke"

    async def start(self) -> EnvelopeAgent:
        app = web.Application()
        app.router.add_post("/invoke", self._invoke)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{bound_port(self.runner)}"
        return self

    async def _invoke(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        if self.gate is not None:
            await self.gate.wait()
        if self.handler is not None:
            return await self.handler(body)
        reply = Envelope.model_validate(body).reply({"handled_by": self.name, "echo": body["payload"]})
        return web.Response(body=reply.to_json(), content_type="application/json")

    async def aclose(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


async def send(node: RunningNode, envelope: dict[str, Any] | Envelope, *, token: str | None = None,
               base_url: str | None = None, **query: str) -> tuple[int, Any, dict[str, str]]:
    body = envelope.to_json() if isinstance(envelope, Envelope) else None
    url = f"{base_url or node.url}/v1/send"
    async with node.session.post(url, params=query, data=body, json=None if body else envelope,
                                 headers={**node.headers(token), "Content-Type": "application/json"}) as response:
        raw = await response.read()
        decoded: Any = raw
        if response.content_type == "application/json":
            decoded = await response.json()
        return response.status, decoded, dict(response.headers)


async def test_hop_count_source_identity_and_unknown_enum_values_pass_through(node: RunningNode) -> None:
    agent = await EnvelopeAgent("translator").start()
    try:
        await node.register(registration("lang.translate.p1", endpoint=agent.invoke_url))
        token = node.token("app.caller.one")
        envelope = {"id": "msg_hops_4", "source_agent": "forged.source.x", "type": "progress",
                    "operation": "translate.text", "hop_count": 4, "trace_id": "trace-hops",
                    "payload": {"status": "unknown_future_value", "nested": {"kind": "brand_new_enum"}},
                    "extensions": {"locale": "zh-CN"}}
        status, body, headers = await send(node, envelope, token=token)
        assert status == 200, body
        received = agent.received[0]
        assert received["hop_count"] == 5                      # incremented by the hop
        assert received["source_agent"] == "app.caller.one"     # from the token, not the body
        assert received["type"] == "progress"                   # an enum value this version does not know
        assert received["payload"] == envelope["payload"]       # never rewritten
        assert received["extensions"] == {"locale": "zh-CN"}
        assert body["type"] == "response" and body["reply_to_id"] == "msg_hops_4"
        assert headers["X-Reach-Agent"] == "lang.translate.p1" and headers["X-Reach-Attempts"] == "1"

        status, body, _ = await send(node, {**envelope, "id": "msg_hops_5", "hop_count": 5}, token=token)
        assert status == 422 and body["error"] == "hop_limit_exceeded" and body["field"] == "hop_count"
        assert len(agent.received) == 1  # refused before any delivery
    finally:
        await agent.aclose()


async def test_a_loop_between_two_agents_is_cut_at_the_hop_limit(node: RunningNode) -> None:
    """A forwards every request to B and B back to A, each through the proxy with ``child()``."""
    tokens = {"loop.ping.a": node.token("loop.ping.a"), "loop.ping.b": node.token("loop.ping.b")}
    refusals: list[dict[str, Any]] = []

    def forwarder(me: str, other: str) -> Handler:
        async def handle(body: dict[str, Any]) -> web.StreamResponse:
            incoming = Envelope.model_validate(body)
            onward = incoming.child(operation="loop.ping", target_agent=other, source_agent=me,
                                    payload={"from": me})
            status, answer, _ = await send(node, onward, token=tokens[me])
            if status != 200:
                refusals.append({"at": me, "hop_count": onward.hop_count, "status": status, "answer": answer})
            return web.json_response({"at": me, "onward_status": status})
        return handle

    a = await EnvelopeAgent("a", forwarder("loop.ping.a", "loop.ping.b")).start()
    b = await EnvelopeAgent("b", forwarder("loop.ping.b", "loop.ping.a")).start()
    try:
        await node.register(registration("loop.ping.a", capability="loop.ping", endpoint=a.invoke_url))
        await node.register(registration("loop.ping.b", capability="loop.ping", endpoint=b.invoke_url))
        start = Envelope(operation="loop.ping", target_agent="loop.ping.a", payload={}, trace_id="trace-loop")
        status, _, _ = await asyncio.wait_for(send(node, start, token=node.token("app.caller.one")), 20)
        assert status == 200
        # hops 1..5 delivered (a, b, a, b, a); the sixth forward is refused
        assert [r["hop_count"] for r in a.received] == [1, 3, 5]
        assert [r["hop_count"] for r in b.received] == [2, 4]
        assert refusals == [{"at": "loop.ping.a", "hop_count": 5, "status": 422,
                             "answer": refusals[0]["answer"]}]
        assert refusals[0]["answer"]["error"] == "hop_limit_exceeded"
    finally:
        await a.aclose()
        await b.aclose()


async def test_expired_envelopes_are_refused(node: RunningNode) -> None:
    agent = await EnvelopeAgent("translator").start()
    try:
        await node.register(registration("lang.translate.p2", endpoint=agent.invoke_url))
        ghost = Envelope(operation="translate.text", payload={"text": "hi"}, expire_at_ms=epoch_ms() - 1)
        status, body, _ = await send(node, ghost, token=node.token("app.caller.one"))
        assert status == 410 and body["error"] == "envelope_expired" and body["field"] == "expire_at_ms"
        fresh = Envelope(operation="translate.text", payload={"text": "hi"}, expire_at_ms=epoch_ms() + 60_000)
        status, _, _ = await send(node, fresh, token=node.token("app.caller.one"))
        assert status == 200
        assert [r["id"] for r in agent.received] == [fresh.id]  # the ghost never reached the agent
        status, trace = await node.call("GET", f"/v1/traces/{ghost.trace_id}")
        assert status == 200 and [(e["event"], e["result"]) for e in trace["events"]] == \
            [("refused", "envelope_expired")]
    finally:
        await agent.aclose()


async def test_concurrent_duplicates_on_two_replicas_are_delivered_exactly_once(node_factory) -> None:
    first, second = await node_factory(), await node_factory()  # two replicas of one region, one Redis
    agent = await EnvelopeAgent("charger").start()
    agent.gate = asyncio.Event()  # hold the first delivery so the duplicates arrive while it is in flight
    try:
        await first.register(registration("pay.charge.p1", capability="pay.charge", endpoint=agent.invoke_url))
        await wait_for(lambda: second.node.cache.index.get("pay.charge.p1"), message="replica to see the agent")
        token = first.token("app.caller.one")
        envelope = Envelope(operation="pay.charge", payload={"amount_cents": 1250}, trace_id="trace-dup")
        sends = [asyncio.ensure_future(send(first, envelope, token=token,
                                            base_url=(first.url, second.url)[index % 2])) for index in range(20)]
        await wait_for(lambda: len(agent.received) >= 1, message="the first delivery")
        waiting = [running.runner.app[PROXY_KEY].once for running in (first, second)]
        await wait_for(lambda: sum(once.waiting for once in waiting) == 19, message="19 duplicates waiting")
        agent.gate.set()
        answers = await asyncio.gather(*sends)
        assert len(agent.received) == 1  # delivered exactly once
        assert {a[0] for a in answers} == {200}
        assert len({str(a[1]) for a in answers}) == 1  # every duplicate got the same answer
        assert sum(1 for a in answers if a[2].get("X-Reach-Duplicate") != "true") == 1

        status, body, headers = await send(first, envelope, token=token, base_url=second.url)  # much later
        assert status == 200 and headers["X-Reach-Duplicate"] == "true" and body == answers[0][1]
        assert len(agent.received) == 1

        # the trace says what happened: one decision, one delivery, one outcome, 20 duplicates
        status, trace = await first.call("GET", "/v1/traces/trace-dup", token=token)
        assert status == 200, trace
        kinds = [event["event"] for event in trace["events"]]
        assert kinds.count("decision") == 1 and kinds.count("delivery") == 1 and kinds.count("outcome") == 1
        assert kinds.count("duplicate") == 20
        delivery = next(e for e in trace["events"] if e["event"] == "delivery")
        assert delivery["agent_id"] == "pay.charge.p1" and delivery["result"] == "success"
        key = f"ar:{{{first.node.region}}}:trace:trace-dup/node"  # the node's own records
        ttl_ms = await first.node.store.redis.pttl(key)
        assert 0 < ttl_ms <= ProxySettings().trace_ttl_ms
        # someone who took no part in the collaboration sees nothing of it
        status, body = await first.call("GET", "/v1/traces/trace-dup", token=first.token("app.other.two"))
        assert status == 404 and body["error"] == "unknown_trace"
    finally:
        agent.gate.set()
        await agent.aclose()


async def test_a_failed_delivery_is_released_and_explained_by_the_trace(node: RunningNode) -> None:
    dead = await EnvelopeAgent("dead").start()
    dead_url = dead.invoke_url
    await dead.aclose()  # registered, but nothing listens any more
    alive = await EnvelopeAgent("alive").start()
    try:
        await node.register(registration("lang.translate.dead", endpoint=dead_url, weight=10_000))
        token = node.token("app.caller.one")
        once = Envelope(operation="translate.text", payload={"text": "hi"}, trace_id="trace-lost")
        status, body, _ = await send(node, once, token=token)
        assert status == 502 and body["error"] == "delivery_failed"
        assert [a["agent_id"] for a in body["details"]["attempts"]] == ["lang.translate.dead"]  # not idempotent

        # now a healthy agent exists; the same id may be sent again (the failed send released it)
        await node.register(registration("lang.translate.alive", endpoint=alive.invoke_url, weight=1))
        retry = once.model_copy(update={"idempotent": True})
        status, body, headers = await send(node, retry, token=token)
        assert status == 200 and headers["X-Reach-Agent"] == "lang.translate.alive", (status, body, headers)
        status, trace = await node.call("GET", "/v1/traces/trace-lost", token=token)
        outcomes = [(e["event"], e.get("agent_id"), e.get("result")) for e in trace["events"]
                    if e["event"] in ("delivery", "outcome")]
        assert outcomes[0] == ("delivery", "lang.translate.dead", "failure")
        assert outcomes[1] == ("outcome", None, "failed")
        assert outcomes[-1] == ("outcome", "lang.translate.alive", "delivered")
    finally:
        await alive.aclose()


async def test_passthrough_forwards_the_raw_payload_and_returns_the_answer_as_is(node: RunningNode) -> None:
    seen: list[tuple[str, bytes]] = []

    async def legacy(request: web.Request) -> web.Response:
        raw = await request.read()
        seen.append((request.content_type, raw))
        return web.Response(status=201, body=b"LEGACY:" + raw.upper(), content_type="text/x-legacy")

    app = web.Application()
    app.router.add_post("/old/api", legacy)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{bound_port(runner)}/old/api"
    try:
        await node.register(registration("legacy.ocr.v0", capability="ocr.image", endpoint=url,
                                         transport="passthrough"))
        envelope = Envelope(operation="ocr.image", payload="scan page 7")
        status, body, headers = await send(node, envelope, token=node.token("app.caller.one"))
        assert seen == [("text/plain", b"scan page 7")]  # the raw payload, no envelope around it
        assert status == 201 and body == b"LEGACY:SCAN PAGE 7"
        assert headers["Content-Type"] == "text/x-legacy"
    finally:
        await runner.cleanup()


async def test_callbacks_go_only_to_the_registered_callback_endpoint(node: RunningNode) -> None:
    delivered: dict[str, list[dict[str, Any]]] = {"registered": [], "payload_address": []}

    def collector(name: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def collect(request: web.Request) -> web.Response:
            delivered[name].append(await request.json())
            return web.json_response({"ok": True})
        return collect

    app = web.Application()
    app.router.add_post("/registered", collector("registered"))
    app.router.add_post("/from-payload", collector("payload_address"))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{bound_port(runner)}"
    agent = await EnvelopeAgent("ocr").start()
    try:
        await node.register(registration("vision.ocr.p1", capability="ocr.image", endpoint=agent.invoke_url))
        caller = "app.reader.one"
        await node.register(registration(caller, capability="read.docs", endpoint=base + "/unused",
                                         callback_endpoint=base + "/registered"))
        token = node.token(caller)
        envelope = Envelope(operation="ocr.image", payload={"image": "page.png", "callback_url": base + "/from-payload",
                                                           "reply_to": base + "/from-payload"})
        status, body, _ = await send(node, envelope, token=token, delivery="callback")
        assert status == 202 and body["accepted"] is True and body["callback_endpoint"] == base + "/registered"
        await wait_for(lambda: delivered["registered"], message="the callback")
        result = delivered["registered"][0]
        assert result["reply_to_id"] == envelope.id and result["trace_id"] == envelope.trace_id
        assert result["payload"]["handled_by"] == "ocr"
        assert delivered["payload_address"] == []  # the address in the payload is never used

        status, body, _ = await send(node, envelope, token=token, delivery="callback")
        assert status == 202 and body["duplicate"] is True
        status, trace = await node.call("GET", f"/v1/traces/{envelope.trace_id}", token=token)
        assert [e["event"] for e in trace["events"] if e["event"] == "callback"] == ["callback"]
        assert len(agent.received) == 1 and len(delivered["registered"]) == 1

        # a caller with no registered callback_endpoint cannot ask for one
        status, body, _ = await send(node, Envelope(operation="ocr.image", payload={}),
                                     token=node.token("app.unregistered.two"), delivery="callback")
        assert status == 422 and body["error"] == "no_callback_endpoint"
    finally:
        await agent.aclose()
        await runner.cleanup()


async def test_direct_calls_record_their_deliveries_in_the_trace(node: RunningNode) -> None:
    agent = await EnvelopeAgent("translator").start()
    try:
        await node.register(registration("lang.translate.direct", endpoint=agent.invoke_url))
        token = node.token("app.caller.one", TokenRole.CALLER)
        async with ReachClient(node.url, token=token) as client:
            result = await client.call("translate.text", {"text": "退款说明"}, trace_id="trace-direct")
            assert result.payload == {"handled_by": "translator", "echo": {"text": "退款说明"}}
            await client.flush_reports()
            trace = await client.trace("trace-direct")
        # the node recorded its routing decision, the client its delivery
        assert [(e.event.value, e.mode, e.agent_id, e.result) for e in trace.events] == \
            [("decision", "direct", "lang.translate.direct", "ok"), ("delivery", "direct", "lang.translate.direct",
                                                                     "success")]
        # a direct call is a hop too: the agent sees hop_count 1, and a chain at the limit is not sent
        assert agent.received[0]["hop_count"] == 1
        async with ReachClient(node.url, token=token) as client:
            deep = Envelope(operation="translate.text", payload={}, hop_count=5)
            with pytest.raises(HopLimitExceeded):
                await client.call("translate.text", envelope=deep)
            with pytest.raises(EnvelopeExpired):
                await client.call(envelope=Envelope(operation="translate.text", expire_at_ms=epoch_ms() - 1))
            routed = await client.call(envelope=Envelope(operation="translate.text", payload={"x": 1}, hop_count=2))
            assert routed.agent_id == "lang.translate.direct"
        assert len(agent.received) == 2 and agent.received[1]["hop_count"] == 3
    finally:
        await agent.aclose()


async def test_traces_are_capped_per_trace(redis_url: str, region: str) -> None:
    node = RegistryNode(NodeConfig(region=region, redis_url=redis_url, port=0,
                                   proxy=ProxySettings(trace_max_events=5, trace_ttl_ms=60_000)), secret=TEST_SECRET)
    running = await start_node(node)
    try:
        events = [{"event": "delivery", "at_ms": index, "trace_id": "trace-cap", "caller": "admin",
                   "attempt": index} for index in range(8)]
        status, body = await running.call("POST", "/v1/traces", json={"events": events})
        assert status == 200 and body == {"accepted": 8}
        status, trace = await running.call("GET", "/v1/traces/trace-cap")
        assert [event["attempt"] for event in trace["events"]] == [3, 4, 5, 6, 7]  # the newest five
        assert 0 < await node.store.redis.pttl(f"ar:{{{region}}}:trace:trace-cap/by/admin") <= 60_000
        # nobody records events in someone else's name
        status, body = await running.call("POST", "/v1/traces", json={"events": events[:1]},
                                          token=running.token("app.caller.one"))
        assert status == 403
    finally:
        await running.aclose()


async def test_send_rejects_what_it_cannot_route(node: RunningNode) -> None:
    token = node.token("app.caller.one")
    status, body, _ = await send(node, {"payload": {}}, token=token)
    assert status == 422 and body["field"] == "operation"
    status, body, _ = await send(node, {"operation": "nobody.has.this", "payload": {}}, token=token)
    assert status == 404 and body["error"] == "no_agent_available"
    status, body, _ = await send(node, {"operation": "x", "surprise": 1}, token=token)
    assert status == 422 and body["field"] == "surprise"
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{node.url}/v1/send", json={"operation": "x"}) as response:
            assert response.status == 401
