"""The region's payload policy in proxy mode (``node.trust.payload``): a send whose payload or
extensions hold ``password``, ``secret`` or ``private_key`` is refused with a 422 naming where, and
never delivered; passthrough targets are exempt unless the region says otherwise; what the node
records of an envelope's extensions (traces, the decision log) keeps secret-looking values to their
last 4 characters, while the agent gets them as sent. Real node, real agents, real HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from node.core.models import TokenRole
from node.trust import mask_secrets

from ..conftest import NodeFactory
from ..helpers import AgentServer, RunningNode, registration, serve_routes

API_KEY = "sk-live-0123456789abcdef"


async def _send(node: RunningNode, token: str, **envelope: Any) -> tuple[int, Any]:
    return await node.call("POST", "/v1/send", json={"type": "request", "operation": "report.make", **envelope},
                           token=token)


async def test_a_send_carrying_a_refused_key_is_refused_naming_where_and_never_delivered(node: RunningNode) -> None:
    agent = await AgentServer("reports").start()
    try:
        await node.register(registration("rep.make.one", capability="report.make", endpoint=f"{agent.url}/invoke"))
        caller = node.token("shop.web.front", TokenRole.CALLER)
        status, body = await _send(node, caller, payload={"user": {"name": "bob", "password": "hunter2"}},
                                   trace_id="refused-1")
        assert status == 422 and body["error"] == "payload_refused" and body["field"] == "payload.user.password", body
        assert "password" in body["message"]
        status, body = await _send(node, caller, payload={"ok": 1}, extensions={"Private-Key": "-----BEGIN"})
        assert status == 422 and body["field"] == "extensions.Private-Key", body
        status, body = await _send(node, caller, payload={"items": [{"client_secret": 1}, {"SECRET": "x"}]})
        assert status == 422 and body["field"] == "payload.items.1.SECRET", body
        assert agent.calls == 0
        status, trace = await node.call("GET", "/v1/traces/refused-1", token=caller)
        assert status == 200 and [e["result"] for e in trace["events"] if e["event"] == "refused"] == [
            "payload_refused"]
        status, policy = await node.call("GET", "/v1/policy", token=caller)
        assert status == 200 and policy["refused_payload_keys"] == ["password", "private_key", "secret"]
        status, body = await _send(node, caller, payload={"user": {"name": "bob", "passwords_changed": 2}})
        assert status == 200 and agent.calls == 1, body  # a key that merely contains the word is not refused
    finally:
        await agent.aclose()


@pytest.mark.parametrize("held", [False, True])
async def test_passthrough_targets_are_exempt_unless_the_region_says_so(node_factory: NodeFactory, held: bool) -> None:
    seen: list[bytes] = []

    async def legacy(request: web.Request) -> web.Response:
        seen.append(await request.read())
        return web.Response(text="ok")

    runner, url = await serve_routes(web.post("/login", legacy))
    try:
        node = await node_factory(proxy={"payload_policy_passthrough": held})
        await node.register(registration("legacy.login.v0", capability="report.make", endpoint=f"{url}/login",
                                         transport="passthrough"))
        status, body = await _send(node, node.token("shop.web.front", TokenRole.CALLER),
                                   payload={"user": "bob", "password": "hunter2"})
        if held:
            assert status == 422 and body["field"] == "payload.password" and seen == [], body
        else:
            assert status == 200 and json.loads(seen[0]) == {"user": "bob", "password": "hunter2"}, body
    finally:
        await runner.cleanup()


async def test_recorded_extensions_keep_secrets_to_their_last_four_characters(node_factory: NodeFactory,
                                                                             tmp_path: Path) -> None:
    sink = tmp_path / "decisions.jsonl"
    node = await node_factory(decision_log=str(sink))
    received: list[dict[str, Any]] = []

    async def invoke(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.json_response({"done": True})

    runner, url = await serve_routes(web.post("/invoke", invoke))
    try:
        await node.register(registration("rep.make.one", capability="report.make", endpoint=f"{url}/invoke"))
        caller = node.token("shop.web.front", TokenRole.CALLER)
        extensions = {"conversation_id": "conv-7", "api_key": API_KEY, "Authorization": "Bearer abcdefghijklmnop",
                      "tenant": {"id": "acme", "accessToken": "tok_0123456789ABCDEFGHIJ"}}
        status, body = await _send(node, caller, payload={"n": 1}, extensions=extensions, trace_id="masked-1")
        assert status == 200, body
        assert received[0]["extensions"] == extensions  # the agent gets what was sent

        masked = {"conversation_id": "conv-7", "api_key": "****cdef", "Authorization": "****mnop",
                  "tenant": {"id": "acme", "accessToken": "****GHIJ"}}
        assert mask_secrets(extensions) == masked
        status, trace = await node.call("GET", "/v1/traces/masked-1", token=caller)
        decisions = [event for event in trace["events"] if event["event"] == "decision"]
        assert status == 200 and decisions[0]["extensions"] == masked, trace
        status, recent = await node.call("GET", "/v1/agents/rep.make.one/decisions")
        assert status == 200 and [e["extensions"] for e in recent["decisions"] if e["kind"] == "decision"] == [masked]
        logged = sink.read_text()
        assert "****cdef" in logged and "0123456789abcdef" not in logged and "abcdefghijklmnop" not in logged
        assert API_KEY not in json.dumps(trace) and API_KEY not in json.dumps(recent)
    finally:
        await runner.cleanup()


async def test_a_callback_send_is_refused_before_it_is_accepted(node: RunningNode) -> None:
    agent = await AgentServer("reports").start()
    try:
        await node.register(registration("rep.make.one", capability="report.make", endpoint=f"{agent.url}/invoke"))
        await node.register(registration("app.caller.cb", capability="app.other", callback_endpoint=f"{agent.url}/cb"))
        status, body = await node.call("POST", "/v1/send?delivery=callback", token=node.token("app.caller.cb"), json={
            "type": "request", "operation": "report.make", "payload": {"db": {"password": "hunter2"}}})
        assert status == 422 and body["field"] == "payload.db.password", body  # not a 202, then a failure
        assert agent.calls == 0
    finally:
        await agent.aclose()
