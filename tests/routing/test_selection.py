"""Router selection: version constraints, patterns, affinity, weights, breaker, ACL, labels."""

from __future__ import annotations

from node.core import now_ms
from node.core.models import Outcome, TokenRole

from ..helpers import RunningNode, registration, route_many


async def test_version_constraints_select_compatible_majors(node: RunningNode) -> None:
    await node.register(registration("lang.translate.v1", version="1.4"))
    await node.register(registration("lang.translate.v2", version="v2.0.1"))
    for version, expected in [("1", "lang.translate.v1"), ("v1.2", "lang.translate.v1"),
                              ("2", "lang.translate.v2"), ("v2", "lang.translate.v2"),
                              (">=2,<3", "lang.translate.v2")]:
        status, ticket = await node.resolve(capability="translate.text", version=version)
        assert status == 200 and ticket["target"]["agent_id"] == expected, (version, ticket)
        assert ticket["match"]["version"] in {"1.4", "v2.0.1"}
    status, body = await node.resolve(capability="translate.text", version="1.5")
    assert status == 404 and "2 incompatible_version" in str(body["details"]["stages"]), body
    status, body = await node.resolve(capability="translate.text", version="3")
    assert status == 404 and body["error"] == "no_agent_available"


async def test_pattern_and_agent_id_select(node: RunningNode) -> None:
    for agent_id in ("payment.risk_check.a", "payment.risk_check.b", "payment.refund.c"):
        await node.register(registration(agent_id, capability="payment.check"))
    picked = route_many(node, 200, pattern="payment.risk_check.*")
    assert set(picked) == {"payment.risk_check.a", "payment.risk_check.b"}
    status, ticket = await node.resolve(pattern="payment.*.c")
    assert status == 200 and ticket["target"]["agent_id"] == "payment.refund.c"
    assert ticket["match"]["kind"] == "pattern"
    status, ticket = await node.resolve(agent_id="payment.risk_check.b")
    assert ticket["target"]["agent_id"] == "payment.risk_check.b" and ticket["match"]["kind"] == "agent_id"
    status, body = await node.resolve(pattern="billing.*.*")
    assert status == 404


async def test_conversation_affinity_is_sticky_and_moves_only_when_needed(node: RunningNode) -> None:
    agents = [f"lang.translate.s{i}" for i in range(4)]
    for agent_id in agents:
        await node.register(registration(agent_id))
    pinned = {f"conv-{c}": route_many(node, 20, capability="translate.text", conversation_id=f"conv-{c}")
              for c in range(60)}
    assert all(len(choices) == 1 for choices in pinned.values()), "a conversation moved between agents"
    owners = {conv: next(iter(choices)) for conv, choices in pinned.items()}
    assert len(set(owners.values())) == 4, "affinity should still spread conversations"

    removed = owners["conv-0"]
    await node.call("DELETE", f"/v1/agents/{removed}")
    for conv, owner in owners.items():
        now = next(iter(route_many(node, 1, capability="translate.text", conversation_id=conv)))
        if owner == removed:
            assert now != removed
        else:
            assert now == owner, "rendezvous hashing must not move conversations of surviving agents"


async def test_weights_hold_within_tolerance(node: RunningNode) -> None:
    weights = {"lang.translate.w1": 100, "lang.translate.w2": 200, "lang.translate.w7": 700}
    for agent_id, weight in weights.items():
        await node.register(registration(agent_id, weight=weight))
    count = 5_000
    picked = route_many(node, count, capability="translate.text")
    for agent_id, weight in weights.items():
        assert abs(picked[agent_id] / count - weight / 1000) < 0.03, picked


async def test_status_and_load_lower_the_share(node: RunningNode) -> None:
    await node.register(registration("lang.translate.calm", max_concurrency=10))
    await node.register(registration("lang.translate.busy", max_concurrency=10))
    await node.call("PUT", "/v1/agents/lang.translate.busy/heartbeat",
                    json={"status": "degraded", "load": {"inflight": 10, "queued": 0}})
    picked = route_many(node, 2_000, capability="translate.text")
    # degraded (×0.5) and at capacity (×0.5): a quarter of the calm one's weight → 20 %.
    assert abs(picked["lang.translate.busy"] / 2_000 - 0.2) < 0.04, picked
    await node.call("PUT", "/v1/agents/lang.translate.busy/heartbeat", json={"status": "draining"})
    assert set(route_many(node, 200, capability="translate.text")) == {"lang.translate.calm"}


async def test_reports_must_carry_a_genuine_ticket(node: RunningNode) -> None:
    await node.register(registration("lang.translate.r1"))
    caller = node.token("ops.caller.c2", TokenRole.CALLER)
    status, ticket = await node.resolve(capability="translate.text", token=caller)
    forged = ticket["signature"][:-4] + ("AAAA" if not ticket["signature"].endswith("AAAA") else "BBBB")
    status, body = await node.call("POST", "/v1/reports", token=caller, json={
        "signature": forged, "agent_id": "lang.translate.r1", "outcome": "failure"})
    assert status == 403 and body["error"] == "invalid_ticket"
    status, body = await node.call("POST", "/v1/reports", token=caller, json={
        "signature": ticket["signature"], "agent_id": "lang.translate.other", "outcome": "failure"})
    assert status == 403 and body["field"] == "agent_id"
    other = node.token("ops.caller.c3", TokenRole.CALLER)
    status, body = await node.call("POST", "/v1/reports", token=other, json={
        "signature": ticket["signature"], "agent_id": "lang.translate.r1", "outcome": "failure"})
    assert status == 403


async def test_labels_acl_and_alternates(node: RunningNode) -> None:
    await node.register(registration("lang.translate.eu", labels={"zone": "eu"}))
    await node.register(registration("lang.translate.us", labels={"zone": "us"}))
    await node.register(registration("lang.translate.vip", allowed_callers=["finance.*.*"]))
    picked = route_many(node, 100, capability="translate.text", labels={"zone": "eu"})
    assert set(picked) == {"lang.translate.eu"}

    outsider = node.token("ops.caller.x", TokenRole.CALLER)
    insider = node.token("finance.ledger.y", TokenRole.CALLER)
    status, ticket = await node.resolve(agent_id="lang.translate.vip", token=outsider)
    # A hidden agent does not exist for the outsider: the reasons name no ACL, no match count.
    assert status == 404 and ticket["details"]["stages"]["local"] == "no agent lang.translate.vip"
    status, ticket = await node.resolve(agent_id="lang.translate.vip", token=insider)
    assert status == 200

    status, ticket = await node.resolve(capability="translate.text", token=outsider)
    named = [ticket["target"]["agent_id"], *(a["agent_id"] for a in ticket["alternates"])]
    assert sorted(named) == ["lang.translate.eu", "lang.translate.us"], "two alternates, no ACL-denied agent"
    assert ticket["expires_at_ms"] > ticket["issued_at_ms"]


async def test_breakers_eject_at_most_half_of_a_pool(node: RunningNode) -> None:
    agents = [f"lang.translate.e{i}" for i in range(4)]
    for agent_id in agents:
        await node.register(registration(agent_id))
    outcomes = node.node.outcomes
    for agent_id in agents[:3]:
        for _ in range(outcomes.failure_threshold):
            outcomes.record(agent_id, Outcome.FAILURE, now_ms=now_ms())
    # A fourth failure on e0 makes it the worst: it stays out, the least-failing ejected one returns.
    outcomes.record(agents[0], Outcome.TIMEOUT, now_ms=now_ms())
    routed = set(route_many(node, 400, capability="translate.text"))
    assert len(routed) == 2 and agents[3] in routed and agents[0] not in routed, routed
    status, body = await node.resolve(agent_id=agents[1])
    assert status == 404 and "circuit_open" in str(body["details"]), "a named agent gets no pool exemption"
    # 429s lower the weight but never open a breaker.
    for _ in range(outcomes.failure_threshold * 2):
        outcomes.record(agents[3], Outcome.REJECTED, now_ms=now_ms())
    assert outcomes.admits(agents[3], now_ms=now_ms())
    assert outcomes.weight_factor(agents[3], now_ms=now_ms()) < 0.5


async def test_resolve_with_a_trace_id_records_the_decision(node: RunningNode) -> None:
    await node.register(registration("lang.translate.traced"))
    caller = node.token("ops.caller.tracer", TokenRole.CALLER)
    status, ticket = await node.resolve(capability="translate.text", trace_id="collab-42", token=caller)
    assert status == 200 and ticket["trace_id"] == "collab-42"
    status, body = await node.resolve(capability="nobody.does_this", trace_id="collab-42", semantic=False, token=caller)
    assert status == 404
    status, trace = await node.call("GET", "/v1/traces/collab-42", token=caller)
    assert status == 200, trace
    decisions = [(e["event"], e["agent_id"] if "agent_id" in e else None, e["result"]) for e in trace["events"]]
    assert decisions == [("decision", "lang.translate.traced", "ok"), ("decision", None, "no_agent_available")]
    status, body = await node.resolve(capability="translate.text", trace_id="bad id with spaces")
    assert status == 422 and body["field"] == "trace_id"
