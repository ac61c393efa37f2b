"""Bad input gets the right 4xx JSON error, never a 5xx, and never changes stored records."""

from __future__ import annotations

import json

import pytest

from node.core.models import TokenRole
from node.store import RegionSnapshots

from ..helpers import RunningNode, registration

GOOD = registration("lang.translate.keep")


async def _stored(node: RunningNode) -> list[tuple[str, int]]:
    snapshot = await RegionSnapshots(node.node.store).snapshot()
    return sorted((record.agent_id, record.version) for record in snapshot.records)


BODY_CASES = [
    # (name, body bytes, expected status, expected error code, expected field)
    ("malformed json", b'{"agent_id": "a.b.c",', 400, "invalid_json", None),
    ("not an object", b"[1, 2, 3]", 422, "validation_failed", None),
    ("wrong type", json.dumps({**GOOD, "weight": "heavy"}).encode(), 422, "validation_failed", "weight"),
    ("unknown field", json.dumps({**GOOD, "colour": "blue"}).encode(), 422, "validation_failed", "colour"),
    ("bad agent_id", json.dumps({**GOOD, "agent_id": "Not An Id"}).encode(), 422, "validation_failed", "agent_id"),
    ("two segments", json.dumps({**GOOD, "agent_id": "lang.translate"}).encode(), 422, "validation_failed", "agent_id"),
    ("no primary endpoint", json.dumps({**GOOD, "endpoints": {"x": "http://h:1"}}).encode(), 422,
     "validation_failed", "endpoints"),
    ("bad endpoint url", json.dumps({**GOOD, "endpoints": {"primary": "nowhere"}}).encode(), 422,
     "validation_failed", "endpoints"),
    ("bad version", json.dumps({**GOOD, "capabilities": [{"name": "x.y", "version": "one"}]}).encode(), 422,
     "validation_failed", "capabilities.0.version"),
    ("lease too short", json.dumps({**GOOD, "lease_ttl_ms": 5}).encode(), 422, "validation_failed", "lease_ttl_ms"),
    ("empty body", b"", 400, "missing_body", None),
    ("oversized body", json.dumps({**GOOD, "description": "x" * 300_000}).encode(), 413, "payload_too_large", None),
]


async def test_bad_registration_bodies(node: RunningNode) -> None:
    await node.register(GOOD)
    before = await _stored(node)
    for name, body, status, code, field in BODY_CASES:
        got, answer = await node.call("POST", "/v1/agents", data=body, headers={"Content-Type": "application/json"})
        assert got == status, (name, got, answer)
        assert answer["error"] == code, (name, answer)
        if field is not None:
            assert answer["field"] == field, (name, answer)
        assert answer["message"], name
    assert await _stored(node) == before


async def test_bad_tokens(node: RunningNode) -> None:
    await node.register(GOOD)
    before = await _stored(node)
    expired = node.node.signer.issue("lang.translate.keep", TokenRole.AGENT, ttl_s=-1)
    forged = node.token("lang.translate.keep")[:-3] + "xyz"
    other_agent = node.token("lang.translate.other")
    caller_only = node.token("ops.caller.c", TokenRole.CALLER)
    cases = [
        ({}, 401, "missing_token"),
        ({"Authorization": "Basic abc"}, 401, "invalid_token"),
        ({"Authorization": "Bearer garbage"}, 401, "invalid_token"),
        ({"Authorization": f"Bearer {forged}"}, 401, "invalid_token"),
        ({"Authorization": f"Bearer {expired}"}, 401, "token_expired"),
        ({"Authorization": f"Bearer {other_agent}"}, 403, "forbidden"),
        ({"Authorization": f"Bearer {caller_only}"}, 403, "forbidden"),
    ]
    for headers, status, code in cases:
        for method, path, body in [("POST", "/v1/agents", {**GOOD, "weight": 1}),
                                   ("PUT", "/v1/agents/lang.translate.keep/heartbeat", {"status": "draining"}),
                                   ("DELETE", "/v1/agents/lang.translate.keep", None)]:
            async with node.session.request(method, path, json=body, headers=headers) as response:
                answer = await response.json()
                assert response.status == status, (headers, method, answer)
                assert answer["error"] == code, (headers, method, answer)
    assert await _stored(node) == before


@pytest.mark.parametrize("path, body, status, field", [
    ("/v1/resolve", {}, 422, None),
    ("/v1/resolve", {"capability": "x", "scope": "galaxy"}, 422, "scope"),
    ("/v1/resolve", {"pattern": "no spaces allowed"}, 422, "pattern"),
    ("/v1/resolve", {"capability": "x", "version": "~~"}, 422, "version"),
    ("/v1/resolve", {"capability": "x", "extra": 1}, 422, "extra"),
    ("/v1/reports", {"signature": "x", "agent_id": "a.b.c", "outcome": "meh"}, 422, "outcome"),
    ("/v1/reports", {"signature": "nope", "agent_id": "a.b.c", "outcome": "failure"}, 403, "signature"),
    ("/v1/reports", {"reports": []}, 422, "reports"),
])
async def test_bad_resolve_and_report_bodies(node: RunningNode, path: str, body: dict, status: int,
                                             field: str | None) -> None:
    got, answer = await node.call("POST", path, json=body)
    assert got == status, answer
    if field is not None:
        assert answer["field"] == field, answer


async def test_bad_queries_and_unknown_routes(node: RunningNode) -> None:
    for path, status, code in [("/v1/agents?scope=everywhere", 422, "validation_failed"),
                               ("/v1/agents?pattern=bad%20pattern", 422, "validation_failed"),
                               ("/v1/agents?label=novalue", 422, "validation_failed"),
                               ("/v1/watch?since=abc", 422, "validation_failed"),
                               ("/v1/agents/no.such.agent", 404, "unknown_agent"),
                               ("/v1/nothing-here", 404, "not_found")]:
        got, answer = await node.call("GET", path)
        assert got == status and answer["error"] == code, (path, answer)
    got, answer = await node.call("PATCH", "/v1/agents")
    assert got == 405 and answer["error"] == "method_not_allowed"


async def test_transport_policy_is_enforced(node_factory) -> None:
    node = await node_factory(allowed_transports=["https+token"])
    got, answer = await node.call("POST", "/v1/agents", json=registration("lang.translate.t", transport="http+token"))
    assert got == 422 and answer["error"] == "transport_not_allowed" and answer["field"] == "transport"


async def test_rate_limit_answers_429(node_factory) -> None:
    node = await node_factory(rate_limit_rps=1.0, rate_limit_burst=3)
    caller = node.token("ops.caller.fast", TokenRole.CALLER)
    statuses = [(await node.call("GET", "/v1/agents", token=caller))[0] for _ in range(5)]
    assert statuses[:3] == [200, 200, 200] and statuses[-1] == 429
    # another caller has a bucket of its own
    assert (await node.call("GET", "/v1/agents"))[0] == 200


def _mutations(rng, base: dict) -> list[bytes]:
    """Seeded junk shaped like real bodies: wrong types, deletions, huge and odd values."""
    junk_values = [None, True, -1, 2**70, 1e308, "", "x" * 5_000, [], {}, [1, "a"], {"a": {"b": None}},
                   "\u0000", "../../etc", "<script>", "ó" * 100]
    bodies: list[bytes] = []
    for _ in range(60):
        body = dict(base)
        for _ in range(rng.randint(1, 3)):
            key = rng.choice([*body.keys(), "agent_id", "zzz", "capabilities", "endpoints"])
            action = rng.random()
            if action < 0.3:
                body.pop(key, None)
            else:
                body[key] = rng.choice(junk_values)
        bodies.append(json.dumps(body).encode())
    bodies += [b"\xff\xfe", b"null", b"1", b'"string"', b"{" * 1000, b'{"a":' * 200 + b"1" + b"}" * 200]
    return bodies


async def test_junk_never_gets_a_5xx_or_changes_records(node: RunningNode) -> None:
    import random

    rng = random.Random(20261130)
    await node.register(GOOD)
    before = await _stored(node)
    # Keep the good agent untouched: junk goes to other agent ids.
    bases = [
        ("POST", "/v1/agents", {**registration("lang.translate.fuzz")}),
        ("PUT", "/v1/agents/lang.translate.fuzz/heartbeat", {"status": "busy", "load": {"inflight": 1}}),
        ("POST", "/v1/resolve", {"capability": "translate.text", "version": "1", "labels": {"a": "b"}}),
        ("POST", "/v1/reports", {"signature": "x.y", "agent_id": "a.b.c", "outcome": "success"}),
    ]
    statuses: dict[int, int] = {}
    for method, path, base in bases:
        for body in _mutations(rng, base):
            status, answer = await node.call(method, path, data=body, headers={"Content-Type": "application/json"})
            statuses[status] = statuses.get(status, 0) + 1
            assert status < 500, (method, path, body[:200], answer)
            if status >= 400:
                assert isinstance(answer, dict) and answer.get("error") and answer.get("message"), answer
    print("junk statuses:", dict(sorted(statuses.items())))
    after = [(agent_id, version) for agent_id, version in await _stored(node) if agent_id != "lang.translate.fuzz"]
    assert after == before
