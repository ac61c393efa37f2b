"""The final result by trace id: the proxy keeps the answer of a delivery — sync, or the result a
callback carried — for the trace's lifetime, readable only by the caller that sent it
(``GET /v1/traces/{trace_id}/result``), bounded in size. Real node, real agents, real HTTP."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from node.core.models import TokenRole

from ..conftest import NodeFactory
from ..helpers import AgentServer, RunningNode, registration, serve_routes, wait_for


async def _result(node: RunningNode, trace_id: str, token: str | None) -> tuple[int, Any]:
    return await node.call("GET", f"/v1/traces/{trace_id}/result", token=token)


async def test_a_sync_answer_is_kept_for_the_caller_that_sent_it_only(node: RunningNode) -> None:
    agent = await AgentServer("reports").start()
    try:
        await node.register(registration("rep.make.one", capability="report.make", endpoint=f"{agent.url}/invoke"))
        caller = node.token("shop.web.front", TokenRole.CALLER)
        envelope = {"id": "env-1", "type": "request", "operation": "report.make", "trace_id": "result-1",
                    "payload": {"month": 11}}
        status, answer = await node.call("POST", "/v1/send", json=envelope, token=caller)
        assert status == 200, answer

        status, kept = await _result(node, "result-1", caller)
        assert status == 200, kept
        assert kept["result"] == answer and kept["status"] == 200 and kept["delivery"] == "sync"
        assert (kept["agent_id"], kept["envelope_id"], kept["caller"]) == ("rep.make.one", "env-1", "shop.web.front")
        for other in (node.token("shop.web.other", TokenRole.CALLER), node.token("rep.make.one"), None):
            status, body = await _result(node, "result-1", other)  # None: the admin
            assert status == 404 and body["error"] == "unknown_result", body
        status, body = await _result(node, "no-such-trace", caller)
        assert status == 404
        status, body = await _result(node, "bad trace id", caller)
        assert status == 422 and body["field"] == "trace_id"
        ttl = await node.node.store.redis.pttl(f"ar:{{{node.node.region}}}:trace:result-1/result/shop.web.front")
        assert 0 < ttl <= node.node.config.proxy.trace_ttl_ms  # the trace's lifetime
    finally:
        await agent.aclose()


async def test_a_callback_s_result_is_kept_too(node: RunningNode) -> None:
    agent = await AgentServer("reports").start()
    delivered: list[dict[str, Any]] = []

    async def callback(request: web.Request) -> web.Response:
        delivered.append(await request.json())
        return web.json_response({"ok": True})

    runner, url = await serve_routes(web.post("/results", callback))
    try:
        await node.register(registration("rep.make.one", capability="report.make", endpoint=f"{agent.url}/invoke"))
        await node.register(registration("app.caller.cb", capability="app.other", callback_endpoint=f"{url}/results"))
        caller = node.token("app.caller.cb")
        envelope = {"type": "request", "operation": "report.make", "trace_id": "result-cb", "payload": {"n": 2}}
        status, accepted = await node.call("POST", "/v1/send?delivery=callback", json=envelope, token=caller)
        assert status == 202, accepted
        await wait_for(lambda: delivered, message="the callback")
        status, kept = await wait_for(lambda: _kept(node, "result-cb", caller), message="the kept result")
        assert kept["delivery"] == "callback" and kept["result"] == delivered[0], kept
        assert kept["result"]["payload"]["echo"]["payload"] == {"n": 2} and kept["agent_id"] == "rep.make.one"
    finally:
        await runner.cleanup()
        await agent.aclose()


async def _kept(node: RunningNode, trace_id: str, token: str) -> tuple[int, Any] | None:
    status, body = await _result(node, trace_id, token)
    return (status, body) if status == 200 else None


async def test_a_large_answer_is_kept_without_its_body_and_text_as_text(node_factory: NodeFactory) -> None:
    node = await node_factory(proxy={"result_max_bytes": 100})

    async def big(request: web.Request) -> web.Response:
        return web.json_response({"rows": ["x" * 50] * 20})

    async def plain(request: web.Request) -> web.Response:
        return web.Response(text="total: 42")

    runner, url = await serve_routes(web.post("/big", big), web.post("/plain", plain))
    try:
        await node.register(registration("rep.make.big", capability="report.big", endpoint=f"{url}/big"))
        await node.register(registration("rep.make.plain", capability="report.plain", endpoint=f"{url}/plain",
                                         transport="passthrough"))
        caller = node.token("shop.web.front", TokenRole.CALLER)
        for operation, trace_id in (("report.big", "result-big"), ("report.plain", "result-plain")):
            status, _ = await node.call("POST", "/v1/send", token=caller, json={
                "type": "request", "operation": operation, "trace_id": trace_id, "payload": "go"})
            assert status == 200
        status, kept = await _result(node, "result-big", caller)
        assert status == 200 and kept["too_large"] is True and kept["size_bytes"] > 1_000, kept
        assert "result" not in kept or kept["result"] is None
        status, kept = await _result(node, "result-plain", caller)
        assert status == 200 and kept["text"] == "total: 42" and kept["too_large"] is False, kept
    finally:
        await runner.cleanup()


async def test_a_kept_answer_counts_against_the_callers_trace_quota(node: RunningNode) -> None:
    # A kept answer is a Redis key of the caller's for the trace's lifetime, as its trace events are:
    # its bytes are charged to the same quota (trace_caller_bytes), or fresh trace ids would store
    # answers without bound.
    agent = await AgentServer("reports").start()
    try:
        await node.register(registration("rep.make.one", capability="report.make", endpoint=f"{agent.url}/invoke"))
        caller = node.token("shop.web.quota", TokenRole.CALLER)
        envelope = {"type": "request", "operation": "report.make", "trace_id": "result-quota", "payload": {"n": 7}}
        status, answer = await node.call("POST", "/v1/send", json=envelope, token=caller)
        assert status == 200, answer
        redis, prefix = node.node.store.redis, f"ar:{{{node.node.region}}}:trace:"
        events = await redis.lrange(f"{prefix}result-quota/node", 0, -1)
        kept = await redis.get(f"{prefix}result-quota/result/shop.web.quota")
        assert events and kept is not None
        (quota_key,) = [key async for key in redis.scan_iter(match=f"{prefix}/quota/*shop.web.quota")]
        charged = sum(int(value) for value in (await redis.hgetall(quota_key)).values())
        assert charged == sum(len(event) for event in events) + len(kept), (charged, len(kept))
    finally:
        await agent.aclose()
