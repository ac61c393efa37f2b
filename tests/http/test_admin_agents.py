"""An admin's actions on one agent (``node.http.admin``) against a real node on real Redis: drain and
set a status, a weight, deregister, revoke the agent's tokens; each refused to anyone but an admin,
each a clear 4xx for bad input, each a ``kind: "admin"`` line of the decision log. Also what the
console reads beside them: the probe history (``GET /v1/agents/{agent_id}/probes``) and lease
renewals on the watch (``leases=true``)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from node.core.models import TokenRole

from ..conftest import NodeFactory
from ..helpers import AgentServer, RunningNode, Watcher, registration, wait_for


async def _admin_entries(node: RunningNode, agent_id: str) -> list[dict[str, Any]]:
    status, body = await node.call("GET", f"/v1/agents/{agent_id}/decisions")
    assert status == 200, body
    return [entry for entry in body["decisions"] if entry["kind"] == "admin"]


async def _targets(node: RunningNode, capability: str, count: int = 20) -> Counter[str]:
    chosen: Counter[str] = Counter()
    for _ in range(count):
        status, ticket = await node.resolve(capability=capability)
        chosen[ticket["target"]["agent_id"] if status == 200 else ticket["error"]] += 1
    return chosen


async def test_an_admin_drains_an_agent_and_brings_it_back(node: RunningNode) -> None:
    for agent_id in ("lang.translate.d1", "lang.translate.d2"):
        await node.register(registration(agent_id))
    assert set(await _targets(node, "translate.text")) == {"lang.translate.d1", "lang.translate.d2"}

    status, changed = await node.call("PATCH", "/v1/admin/agents/lang.translate.d1",
                                      json={"status": "draining", "reason": "kernel upgrade"})
    assert status == 200, changed
    assert changed["status"] == "draining" and changed["changed"] is True and changed["region"] == node.node.region
    assert set(await _targets(node, "translate.text")) == {"lang.translate.d2"}
    status, record = await node.call("GET", "/v1/agents/lang.translate.d1")
    assert record["status"] == "draining" and record["version"] == changed["version"]
    [entry] = await _admin_entries(node, "lang.translate.d1")
    assert entry["action"] == "status" and entry["caller"] == "admin" and entry["result"] == "ok"
    assert entry["detail"] == "status ready -> draining (kernel upgrade)" and entry["version"] == changed["version"]
    assert entry["at_ms"] > 0 and entry["node_region"] == node.node.region

    status, back = await node.call("PATCH", "/v1/admin/agents/lang.translate.d1", json={"status": "ready"})
    assert status == 200 and back["status"] == "ready" and back["version"] > changed["version"]
    assert set(await _targets(node, "translate.text")) == {"lang.translate.d1", "lang.translate.d2"}
    newest = (await _admin_entries(node, "lang.translate.d1"))[0]
    assert newest["detail"] == "status draining -> ready"


async def test_an_admin_sets_the_weight_and_the_same_weight_again_changes_nothing(node: RunningNode) -> None:
    await node.register(registration("lang.translate.w1"))
    await node.register(registration("lang.translate.w2"))
    status, changed = await node.call("PATCH", "/v1/admin/agents/lang.translate.w1", json={"weight": 0})
    assert status == 200 and changed["weight"] == 0 and changed["changed"] is True, changed
    assert set(await _targets(node, "translate.text")) == {"lang.translate.w2"}  # weight 0: no traffic
    status, again = await node.call("PATCH", "/v1/admin/agents/lang.translate.w1", json={"weight": 0})
    assert status == 200 and again["changed"] is False and again["version"] == changed["version"]
    entries = await _admin_entries(node, "lang.translate.w1")
    assert [entry["detail"] for entry in entries] == ["no change", "weight 100 -> 0"]
    status, both = await node.call("PATCH", "/v1/admin/agents/lang.translate.w1",
                                   json={"status": "degraded", "weight": 250})
    assert status == 200 and (both["status"], both["weight"]) == ("degraded", 250)
    assert (await _admin_entries(node, "lang.translate.w1"))[0]["detail"] == \
        "status ready -> degraded; weight 0 -> 250"


async def test_an_admin_deregisters_an_agent_and_the_log_keeps_it(node: RunningNode) -> None:
    await node.register(registration("lang.translate.gone"))
    status, gone = await node.call("DELETE", "/v1/admin/agents/lang.translate.gone?reason=retired")
    assert status == 200 and gone == {"agent_id": "lang.translate.gone", "version": gone["version"],
                                      "deregistered": True}
    status, body = await node.call("GET", "/v1/agents/lang.translate.gone")
    assert status == 404
    [entry] = await _admin_entries(node, "lang.translate.gone")  # an admin still reads them
    assert entry["action"] == "deregister" and entry["detail"] == "deregistered (retired)"
    status, body = await node.call("DELETE", "/v1/admin/agents/lang.translate.gone")
    assert status == 404 and body["error"] == "unknown_agent" and body["field"] == "agent_id"


async def test_revoking_an_agents_tokens_refuses_them_everywhere_in_the_region(node_factory: NodeFactory) -> None:
    node = await node_factory()
    other = await node_factory()  # a second replica on the same Redis
    agent_token = node.token("lang.translate.rev")
    await node.register(registration("lang.translate.rev"), token=agent_token)
    neighbour = node.token("lang.translate.next")
    await node.register(registration("lang.translate.next"), token=neighbour)

    status, done = await node.call("POST", "/v1/admin/agents/lang.translate.rev/revoke-tokens?reason=leaked")
    assert status == 200, done
    assert done["agent_id"] == "lang.translate.rev" and done["new"] is True and done["peers"] == []
    assert abs(done["issued_until_s"] - time.time()) < 60
    status, body = await node.call("PUT", "/v1/agents/lang.translate.rev/heartbeat", json={}, token=agent_token)
    assert status == 401 and body["error"] == "token_revoked", body

    async def refused_by_the_other() -> bool:
        status, _ = await other.call("PUT", "/v1/agents/lang.translate.rev/heartbeat", json={}, token=agent_token)
        return status == 401

    await wait_for(refused_by_the_other, message="the other replica to refuse the agent's token")
    # Its neighbour's token, and a token of the same id issued after the revocation, are good.
    status, _ = await node.call("PUT", "/v1/agents/lang.translate.next/heartbeat", json={}, token=neighbour)
    assert status == 200
    fresh = node.node.signer.issue("lang.translate.rev", TokenRole.AGENT, now_s=done["issued_until_s"] + 1)
    status, body = await node.call("PUT", "/v1/agents/lang.translate.rev/heartbeat", json={}, token=fresh)
    assert status == 200, body
    # A caller token with the agent's name is not the agent's token.
    caller = node.node.signer.issue("lang.translate.rev", TokenRole.CALLER, now_s=done["issued_until_s"] - 5)
    status, _ = await node.call("POST", "/v1/resolve", json={"capability": "translate.text"}, token=caller)
    assert status == 200
    [entry] = await _admin_entries(node, "lang.translate.rev")
    assert entry["action"] == "revoke_tokens" and entry["detail"].endswith("refused (leaked)")


async def test_only_an_admin_may_act_on_an_agent(node: RunningNode) -> None:
    own = node.token("lang.translate.own")
    await node.register(registration("lang.translate.own"), token=own)
    for token in (own, node.token("sales.crm.viewer", TokenRole.CALLER), node.token("eu", TokenRole.PEER)):
        for method, path, body in (("PATCH", "/v1/admin/agents/lang.translate.own", {"status": "draining"}),
                                   ("DELETE", "/v1/admin/agents/lang.translate.own", None),
                                   ("POST", "/v1/admin/agents/lang.translate.own/revoke-tokens", None)):
            status, answer = await node.call(method, path, json=body, token=token)
            assert status == 403 and answer["error"] == "admins_only", (method, path, answer)
            assert "admin" in answer["message"]
    status, record = await node.call("GET", "/v1/agents/lang.translate.own")
    assert status == 200 and record["status"] == "ready"
    assert await _admin_entries(node, "lang.translate.own") == []


async def test_bad_admin_requests_are_named_4xx_answers(node: RunningNode) -> None:
    await node.register(registration("lang.translate.bad"))
    path = "/v1/admin/agents/lang.translate.bad"
    cases = [
        ("PATCH", path, {}, 422, "validation_failed", None),
        ("PATCH", path, {"reason": "only a reason"}, 422, "validation_failed", None),
        ("PATCH", path, {"status": "asleep"}, 422, "validation_failed", "status"),
        ("PATCH", path, {"weight": -1}, 422, "validation_failed", "weight"),
        ("PATCH", path, {"weight": "10"}, 422, "validation_failed", "weight"),
        ("PATCH", path, {"status": "ready", "colour": "red"}, 422, "validation_failed", "colour"),
        ("PATCH", "/v1/admin/agents/not-an-id", {"status": "ready"}, 422, "validation_failed", "agent_id"),
        ("PATCH", "/v1/admin/agents/lang.translate.nobody", {"status": "ready"}, 404, "unknown_agent", "agent_id"),
        ("DELETE", f"{path}?reason={'x' * 201}", None, 422, "validation_failed", "reason"),
        ("POST", "/v1/admin/agents/Bad.Id/revoke-tokens", None, 422, "validation_failed", "agent_id"),
    ]
    for method, target, body, status_wanted, code, field in cases:
        status, answer = await node.call(method, target, json=body)
        assert status == status_wanted and answer["error"] == code, (method, target, body, answer)
        if field is not None:
            assert answer["field"] == field, (body, answer)
    status, answer = await node.call("PATCH", path, data=b"{not json", headers={"Content-Type": "application/json"})
    assert status == 400 and answer["error"] == "invalid_json"
    status, answer = await node.call("PATCH", path)
    assert status == 400 and answer["error"] == "missing_body"
    status, record = await node.call("GET", "/v1/agents/lang.translate.bad")
    assert record["status"] == "ready" and record["weight"] == 100


async def test_the_probe_history_keeps_results_newest_first(node: RunningNode) -> None:
    agent = await AgentServer("probed").start()
    try:
        probe = {"url": f"{agent.url}/readyz", "interval_ms": 100, "timeout_ms": 500,
                 "failure_threshold": 2, "success_threshold": 1}
        await node.register(registration("ocr.receipt.h1", capability="ocr.receipt", endpoint=agent.url,
                                         readiness_probe=probe, allowed_callers=["ops.*.*"]))

        async def probes() -> list[dict[str, Any]]:
            status, body = await node.call("GET", "/v1/agents/ocr.receipt.h1/probes")
            assert status == 200 and body["leader"] is True, body
            return body["probes"]

        await wait_for(lambda: _has(probes, lambda found: sum(p["ok"] for p in found) >= 3), message="3 passes")
        agent.ready = False
        await wait_for(lambda: _has(probes, lambda found: not found[0]["ok"]), message="a failed probe")
        found = await probes()
        assert [p["at_ms"] for p in found] == sorted((p["at_ms"] for p in found), reverse=True)
        failed = found[0]
        assert failed["kind"] == "readiness" and "503" in failed["error"] and failed["latency_ms"] >= 0
        assert all(p["error"] is None for p in found if p["ok"])
        assert len(found) <= node.node.config.probe_history
        outsider = node.token("sales.crm.viewer", TokenRole.CALLER)
        status, body = await node.call("GET", "/v1/agents/ocr.receipt.h1/probes", token=outsider)
        assert status == 404 and body["error"] == "unknown_agent"
    finally:
        await agent.aclose()


async def _has(read, condition) -> bool:
    found = await read()
    return bool(found) and condition(found)


async def test_a_leases_watch_hears_of_renewals_and_no_other_watch_does(node: RunningNode) -> None:
    await node.register(registration("lang.translate.beat", lease_ttl_ms=2_000))
    await node.register(registration("ops.secret.vault", allowed_callers=["ops.*.*"]))
    viewer = node.token("sales.crm.viewer", TokenRole.CALLER)
    async with Watcher(node.session, f"{node.url}/v1/watch?leases=true", viewer) as leases, \
            Watcher(node.session, f"{node.url}/v1/watch", viewer) as plain:
        await wait_for(lambda: leases.data("leases"), message="the first leases event")
        first = leases.data("leases")[0]
        assert "lang.translate.beat" in first["leases"] and "ops.secret.vault" not in first["leases"]
        assert first["region"] == node.node.region and abs(first["now_ms"] - time.time() * 1000) < 60_000
        status, beat = await node.call("PUT", "/v1/agents/lang.translate.beat/heartbeat", json={})
        assert status == 200 and beat["changed"] is False
        renewed = beat["lease_expires_at_ms"]
        await wait_for(lambda: any(event["leases"].get("lang.translate.beat") == renewed
                                   for event in leases.data("leases")), message="the renewal on the watch")
        assert "leases" not in plain.kinds() and plain.kinds()[0] == "hello"
        assert not plain.changes()  # a renewal is no change
