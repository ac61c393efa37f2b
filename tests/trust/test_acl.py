"""ACL policy: ``allowed_callers`` per capability as well as per agent, and the region's ACL rules
an admin sets at runtime (``/v1/acl``, ``agent-reach acl``), which hold on every node of the region
within the poll interval, with no agent registering again, on every route that shows or routes a
record. Other regions: ``tests/federation/test_acl_relay.py``."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from node.core.models import TokenRole
from node.service import RegistryNode
from topology.composition import attach_discovery

from ..conftest import TEST_SECRET, NodeFactory
from ..helpers import AgentServer, RunningNode, Watcher, registration, start_node, wait_for

AGENT_REACH = str(Path(sys.executable).with_name("agent-reach"))
POLL_MS = 100


async def _shown(node: RunningNode, token: str, agent_id: str, capability: str) -> dict[str, int | bool]:
    """What each route shows ``token`` of ``agent_id``: the status of get, both card routes and a
    resolve by capability and by id, and whether list and search name it (search's status when
    the node has none)."""
    seen: dict[str, int | bool] = {}
    seen["get"], _ = await node.call("GET", f"/v1/agents/{agent_id}", token=token)
    seen["card"], _ = await node.call("GET", f"/agents/{agent_id}/.well-known/agent-card.json", token=token)
    seen["v1_card"], _ = await node.call("GET", f"/v1/agents/{agent_id}/agent-card.json", token=token)
    seen["resolve_capability"], _ = await node.resolve(token, capability=capability)
    seen["resolve_id"], _ = await node.resolve(token, agent_id=agent_id)
    _, listed = await node.call("GET", "/v1/agents", token=token)
    seen["list"] = agent_id in {record["agent_id"] for record in listed["agents"]}
    status, found = await node.call("GET", f"/v1/search?q={capability.replace('.', '+')}", token=token)
    seen["search"] = agent_id in {hit["agent_id"] for hit in found["hits"]} if status == 200 else status
    return seen


HIDDEN = {"get": 404, "card": 404, "v1_card": 404, "resolve_capability": 404, "resolve_id": 404, "list": False,
          "search": False}
SHOWN = {"get": 200, "card": 200, "v1_card": 200, "resolve_capability": 200, "resolve_id": 200, "list": True,
         "search": True}


async def test_a_capability_s_allowed_callers_decide_who_is_routed_to_it(node: RunningNode) -> None:
    agent = await AgentServer("pay").start()
    try:
        body = registration("pay.refunds.core", capability="pay.quote", endpoint=f"{agent.url}/invoke")
        body["capabilities"].append({"name": "pay.refund", "version": "1", "allowed_callers": ["fin.*.*"]})
        await node.register(body)
        shop, fin = node.token("shop.web.front", TokenRole.CALLER), node.token("fin.app.main", TokenRole.CALLER)

        assert (await node.resolve(shop, capability="pay.quote"))[0] == 200
        status, refused = await node.resolve(shop, capability="pay.refund")
        assert status == 404 and refused["error"] == "no_agent_available", refused
        assert "pay.refunds.core" not in json.dumps(refused)  # nor does the refusal tell that it exists
        status, ticket = await node.resolve(fin, capability="pay.refund")
        assert status == 200 and ticket["target"]["agent_id"] == "pay.refunds.core"
        status, _ = await node.call("GET", "/v1/agents/pay.refunds.core", token=shop)
        assert status == 200  # the agent as a whole is open: only the capability is not

        envelope = {"id": "refund-1", "type": "request", "operation": "pay.refund", "payload": {"amount": 5}}
        status, sent = await node.call("POST", "/v1/send", json=envelope, token=shop)
        assert status == 404 and sent["error"] == "no_agent_available", sent
        status, sent = await node.call("POST", "/v1/send", json={**envelope, "id": "refund-2"}, token=fin)
        assert status == 200 and agent.calls == 1, sent

        bad = registration("pay.refunds.two", capability="pay.x")
        bad["capabilities"][0]["allowed_callers"] = ["not a pattern"]
        status, refused = await node.call("POST", "/v1/agents", json=bad)
        assert status == 422 and refused["field"] == "capabilities.0.allowed_callers.0", refused
    finally:
        await agent.aclose()


async def test_a_rule_set_through_one_node_holds_on_another_on_every_route_without_reregistration(
        node_factory: NodeFactory, redis_url: str, region: str) -> None:
    first = await node_factory(acl_poll_interval_ms=POLL_MS, public_cards=True)
    config = first.node.config
    other = RegistryNode(config, secret=TEST_SECRET)
    attach_discovery(other, semantic_enabled=False)  # lexical search, no model
    second = await start_node(other)
    try:
        await first.register(registration("ledger.books.core", capability="ledger.post",
                                          description="posts ledger entries"))
        await wait_for(lambda: second.node.find("ledger.books.core"), message="the record on the second node")
        shop, fin = second.token("shop.web.front", TokenRole.CALLER), second.token("fin.app.main", TokenRole.CALLER)
        assert await _shown(second, shop, "ledger.books.core", "ledger.post") == SHOWN

        async with (Watcher(second.session, f"{second.url}/v1/watch", shop) as watcher,
                    Watcher(second.session, f"{second.url}/v1/watch", fin) as fin_watcher):
            status, body = await first.call("PUT", "/v1/acl/only-fin", json={
                "agents": "ledger.*.*", "callers": ["fin.*.*"], "effect": "allow",
                "description": "the ledger is for finance"})
            set_at = time.monotonic()
            assert status == 200 and body["rule"]["origin"] == region, body
            await wait_for(lambda: second.node.acl.active, timeout_s=5, message="the rule on the second node")
            took_ms = (time.monotonic() - set_at) * 1000
            print(f"\nthe rule held on the other node after {took_ms:.0f} ms (poll {POLL_MS} ms)")
            assert await _shown(second, shop, "ledger.books.core", "ledger.post") == HIDDEN
            assert await _shown(second, fin, "ledger.books.core", "ledger.post") == SHOWN
            await first.call("PUT", "/v1/agents/ledger.books.core/heartbeat", json={"status": "degraded"},
                             token=first.token("ledger.books.core"))
            await wait_for(lambda: "ledger.books.core" in fin_watcher.agent_ids(), message="the change fin watches")
        assert "ledger.books.core" not in watcher.agent_ids()  # the watch no longer shows it to shop

        status, body = await second.call("GET", "/v1/acl", token=shop)
        assert status == 403
        status, body = await second.call("GET", "/v1/acl")
        assert status == 200 and [entry["id"] for entry in body["rules"]] == ["only-fin"], body
        status, body = await second.call("PUT", "/v1/acl/x", json={"agents": "a.b", "callers": ["x.*.*"]})
        assert status == 422 and body["field"] == "agents", body
        status, body = await second.call("PUT", "/v1/acl/x", json={"agents": "a.*.*", "callers": ["x.*.*"]},
                                         token=fin)
        assert status == 403 and body["error"] == "admins_only"

        status, body = await second.call("DELETE", "/v1/acl/only-fin")
        assert status == 200 and body["rule"]["rule"] is None
        await wait_for(lambda: not first.node.acl.active, timeout_s=5, message="the deletion on the first node")
        assert await _shown(first, first.token("shop.web.front", TokenRole.CALLER), "ledger.books.core",
                            "ledger.post") == {**SHOWN, "search": 503}  # the first node has no search attached
        status, body = await second.call("DELETE", "/v1/acl/only-fin")
        assert status == 404 and body["error"] == "unknown_rule"
    finally:
        await second.aclose()


async def test_a_deny_rule_on_one_capability_leaves_the_agent_s_other_capabilities(node: RunningNode) -> None:
    body = registration("pay.refunds.core", capability="pay.quote")
    body["capabilities"].append({"name": "pay.refund", "version": "1"})
    await node.register(body)
    shop = node.token("shop.web.front", TokenRole.CALLER)
    status, _ = await node.call("PUT", "/v1/acl/no-shop-refunds", json={
        "agents": "pay.*.*", "capability": "pay.refund", "callers": ["shop.*.*"], "effect": "deny"})
    assert status == 200
    assert (await node.resolve(shop, capability="pay.refund"))[0] == 404
    assert (await node.resolve(shop, capability="pay.quote"))[0] == 200
    assert (await node.call("GET", "/v1/agents/pay.refunds.core", token=shop))[0] == 200
    assert (await node.resolve(node.token("ops.desk.one", TokenRole.CALLER), capability="pay.refund"))[0] == 200


async def test_the_acl_command_sets_lists_and_deletes_rules(node: RunningNode) -> None:
    import asyncio

    env = {**os.environ, "AGENT_REACH_URL": node.url, "AGENT_REACH_TOKEN": node.admin_token}

    async def run(*argv: str) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(AGENT_REACH, "acl", *argv, env=env,
                                                       stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(), 60)
        return process.returncode or 0, out.decode(), err.decode()

    code, out, err = await run("set", "no-shop", "--agents", "fin.*.*", "--callers", "shop.*.*")
    assert code == 0 and "rule no-shop set" in out, (out, err)
    code, out, _ = await run("list")
    assert code == 0 and "no-shop" in out and "fin.*.*" in out and "deny" in out, out
    code, out, _ = await run("list", "--json")
    assert json.loads(out)["rules"][0]["rule"]["callers"] == ["shop.*.*"]
    code, _, err = await run("set", "bad", "--agents", "fin", "--callers", "shop.*.*")
    assert code == 1 and "agents" in err, err
    code, out, _ = await run("delete", "no-shop")
    assert code == 0 and "deleted" in out
    assert not node.node.acl.active


async def test_a_card_an_acl_rule_is_about_is_never_public(node_factory: NodeFactory) -> None:
    node = await node_factory(public_cards=True)
    card = {"name": "Ledger", "skills": [{"id": "post", "name": "post"}], "url": "http://127.0.0.1:9/"}
    status, body = await node.call("POST", "/v1/agent-cards", json={"agent_id": "ledger.books.card", "card": card,
                                                                    "public_card": True})
    assert status == 201, body
    path = "/agents/ledger.books.card/.well-known/agent-card.json"
    async with node.session.get(path) as anonymous:
        assert anonymous.status == 200
    status, _ = await node.call("PUT", "/v1/acl/only-fin", json={"agents": "ledger.*.*", "callers": ["fin.*.*"],
                                                                 "effect": "allow"})
    assert status == 200
    async with node.session.get(path) as anonymous:
        assert anonymous.status == 401
    assert (await node.call("GET", path, token=node.token("fin.app.main", TokenRole.CALLER)))[0] == 200


async def test_a_tombstone_keeps_the_agent_s_callers_not_a_capability_s(node: RunningNode) -> None:
    body = registration("fin.books.tomb", capability="books.read", allowed_callers=["fin.*.*"])
    body["capabilities"].insert(0, {"name": "books.post", "version": "1", "allowed_callers": ["ops.*.*"]})
    await node.register(body)
    await node.register(registration("pub.books.tomb", capability="books.read"))  # capabilities with callers []
    for agent_id in ("fin.books.tomb", "pub.books.tomb"):
        assert (await node.call("DELETE", f"/v1/agents/{agent_id}"))[0] == 200
    changes = await node.node.store.redis.xrevrange(f"ar:{{{node.node.region}}}:changes", count=2)
    assert [(fields["agent_id"], fields["acl"]) for _, fields in changes] == [
        ("pub.books.tomb", "[]"), ("fin.books.tomb", '["fin.*.*"]')]


async def test_a_rule_set_after_a_ticket_holds_for_its_alternates_credentials(node: RunningNode) -> None:
    for agent_id in ("pay.quote.a1", "pay.quote.a2"):
        await node.register(registration(agent_id, capability="pay.quote"))
    shop = node.token("shop.web.front", TokenRole.CALLER)
    status, ticket = await node.resolve(shop, capability="pay.quote")
    assert status == 200 and len(ticket["alternates"]) == 1, ticket
    alternate = ticket["alternates"][0]["agent_id"]
    asked = {"signature": ticket["signature"], "agent_id": alternate}
    assert (await node.call("POST", "/v1/credentials", json=asked, token=shop))[0] == 200
    status, _ = await node.call("PUT", "/v1/acl/no-shop", json={"agents": alternate, "callers": ["shop.*.*"]})
    assert status == 200
    status, body = await node.call("POST", "/v1/credentials", json=asked, token=shop)
    assert status == 403 and body["field"] == "agent_id", body
