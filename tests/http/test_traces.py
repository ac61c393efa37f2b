"""The trace log's writers (node/http/traces.py): the node's records, each caller's posts, the older single list.

Real HTTP against a real node on the test redis-server. The attack these rules answer (a caller
wiping someone else's trace with junk, or showing an agent events it took no part in) is in
tests/http/test_attacks.py; here: the bound on callers per trace, who is shown what, expiry, and
traces written by an older version.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from node.client._http import NodeApi
from node.client._reports import Reporter
from node.core import RouteEvent, RouteEventKind
from node.core.models import Outcome, OutcomeReport, TokenRole
from node.routing import WITHHELD

from ..conftest import NodeFactory
from ..helpers import RunningNode, registration, wait_for


def _event(trace_id: str, caller: str, **fields: Any) -> dict[str, Any]:
    return {"event": "delivery", "at_ms": fields.pop("at_ms", 1_000), "trace_id": trace_id, "caller": caller,
            "result": "success", **fields}


async def _post(node: RunningNode, token: str | None, *events: dict[str, Any]) -> tuple[int, Any]:
    return await node.call("POST", "/v1/traces", json={"events": list(events)}, token=token)


async def _seen(node: RunningNode, trace_id: str, token: str | None = None) -> list[tuple[str, str | None]]:
    status, trace = await node.call("GET", f"/v1/traces/{trace_id}", token=token)
    if status == 404:
        return []
    assert status == 200 and trace["count"] == len(trace["events"]), trace
    return [(event["caller"], event.get("agent_id")) for event in trace["events"]]


async def _writers(node: RunningNode, trace_id: str, token: str | None = None) -> list[str | None]:
    status, trace = await node.call("GET", f"/v1/traces/{trace_id}", token=token)
    assert status == 200, trace
    return [event["recorded_by"] for event in trace["events"]]


async def test_a_trace_keeps_the_posts_of_a_bounded_number_of_callers(node_factory: NodeFactory) -> None:
    node = await node_factory(proxy={"trace_max_callers": 2, "trace_ttl_ms": 2_000})
    one, two, three = (node.token(f"app.caller.{name}", TokenRole.CALLER) for name in ("one", "two", "three"))
    assert (await _post(node, one, _event("trace-full", "app.caller.one")))[0] == 200
    assert (await _post(node, two, _event("trace-full", "app.caller.two", at_ms=1_500)))[0] == 200
    # a third caller is refused, all of its batch (its event on another trace too), naming the trace
    status, body = await _post(node, three, _event("trace-free", "app.caller.three"),
                               _event("trace-full", "app.caller.three"))
    assert (status, body["error"], body["field"]) == (409, "trace_full", "events.trace_id"), body
    assert "trace-full" in body["message"]
    assert await _seen(node, "trace-free", three) == []
    # the callers already on it go on posting; an admin naming two new callers at once is refused too
    assert (await _post(node, one, _event("trace-full", "app.caller.one", at_ms=2_000)))[0] == 200
    status, body = await _post(node, None, _event("trace-other", "app.caller.a"), _event("trace-other", "app.caller.b"),
                               _event("trace-other", "app.caller.c"))
    assert (status, body["error"]) == (409, "trace_full"), body
    assert await _seen(node, "trace-other") == []
    assert await _seen(node, "trace-full") == [("app.caller.one", None), ("app.caller.two", None),
                                               ("app.caller.one", None)]
    # a caller whose posts expired frees its place (here after trace_ttl_ms, 2 s)
    async def posted() -> bool:
        return (await _post(node, three, _event("trace-full", "app.caller.three")))[0] == 200

    await wait_for(posted, timeout_s=8, interval_s=0.1, message="a freed place")
    assert await _seen(node, "trace-full", three) == [("app.caller.three", None)]


async def test_who_is_shown_which_events_of_a_trace(node: RunningNode) -> None:
    await node.register(registration("ledger.post.shown", capability="ledger.post"))
    caller = node.token("app.caller.one", TokenRole.CALLER)
    agent = node.token("ledger.post.shown")
    status, _ = await node.resolve(caller, capability="ledger.post", trace_id="trace-shown")
    assert status == 200
    # the caller's own delivery to the agent, and the agent's own post about a call it made
    assert (await _post(node, caller, _event("trace-shown", "app.caller.one", agent_id="ledger.post.shown")))[0] == 200
    assert (await _post(node, agent, _event("trace-shown", "ledger.post.shown", agent_id="ledger.post.next",
                                            at_ms=2_000)))[0] == 200
    # an admin recording on a caller's behalf writes into that caller's share, shown to it
    assert (await _post(node, None, _event("trace-shown", "app.caller.one", at_ms=3_000)))[0] == 200
    decision = ("app.caller.one", "ledger.post.shown")  # the node's, and the caller's post naming the agent
    assert await _seen(node, "trace-shown", caller) == [decision, ("app.caller.one", None), decision]
    # the agent sees that it was chosen, not by whom (node.routing.WITHHELD)
    assert await _seen(node, "trace-shown", agent) == [("ledger.post.shown", "ledger.post.next"),
                                                       (WITHHELD, "ledger.post.shown")]
    assert len(await _seen(node, "trace-shown")) == 4  # the admin: every writer's
    # each event says whether the node recorded it or a client posted it; a post cannot claim to be the node's
    assert await _writers(node, "trace-shown", caller) == ["client", "client", "node"]  # by at_ms: the decision is now
    assert await _writers(node, "trace-shown", agent) == ["client", "node"]
    status, body = await _post(node, caller, _event("trace-shown", "app.caller.one", recorded_by="node"))
    assert (status, body["field"]) == (422, "events.0.recorded_by"), body
    assert await _seen(node, "trace-shown", node.token("app.caller.other", TokenRole.CALLER)) == []
    ttls = [await node.node.store.redis.pttl(f"ar:{{{node.node.region}}}:trace:trace-shown{suffix}")
            for suffix in ("/node", "/callers", "/by/app.caller.one", "/by/ledger.post.shown")]
    assert all(0 < ttl <= 86_400_000 for ttl in ttls), ttls


async def test_a_trace_written_by_an_older_version_still_reads(node: RunningNode) -> None:
    # Older nodes kept one list per trace, the node's records and callers' posts together: it is
    # read with the rules of then (an event is shown to its caller and to the agent it names)
    # until it expires, trace_ttl_ms after its last event; nothing writes to it any more.
    old = [RouteEvent(event=RouteEventKind.DECISION, at_ms=5_000, trace_id="trace-old", mode="direct",
                      caller="app.caller.one", agent_id="ledger.post.old", result="ok"),
           RouteEvent(event=RouteEventKind.DELIVERY, at_ms=6_000, trace_id="trace-old", mode="direct",
                      caller="app.caller.one", agent_id="ledger.post.old", result="success")]
    key = f"ar:{{{node.node.region}}}:trace:trace-old"
    await node.node.store.redis.rpush(key, *(event.model_dump_json(exclude_none=True) for event in old))
    await node.node.store.redis.pexpire(key, 60_000)
    caller = node.token("app.caller.one", TokenRole.CALLER)
    assert (await _post(node, caller, _event("trace-old", "app.caller.one", at_ms=5_500)))[0] == 200
    both = ("app.caller.one", "ledger.post.old")
    assert await _seen(node, "trace-old", caller) == [both, ("app.caller.one", None), both]
    assert await _seen(node, "trace-old", node.token("ledger.post.old")) == [(WITHHELD, "ledger.post.old")] * 2
    assert await _writers(node, "trace-old", caller) == [None, "client", None]  # the old list could hold either
    assert await node.node.store.redis.llen(key) == 2


async def test_the_sdk_counts_a_refused_trace_post_as_dropped_not_the_reports_sent_beside_it(
        node_factory: NodeFactory) -> None:
    node = await node_factory(proxy={"trace_max_callers": 1})
    await node.register(registration("ledger.post.reported", capability="ledger.post"))
    caller = node.token("app.caller.one", TokenRole.CALLER)
    taken = node.token("app.caller.two", TokenRole.CALLER)  # holds the trace's only place
    assert (await _post(node, taken, _event("trace-taken", "app.caller.two")))[0] == 200
    status, ticket = await node.resolve(caller, capability="ledger.post")
    assert status == 200, ticket
    async with aiohttp.ClientSession() as session:
        reporter = Reporter(NodeApi(session, node.url, caller, timeout_s=5), batch_size=10, flush_interval_s=0.05,
                            queue_limit=100, flush_timeout_s=5)
        reporter.start()
        reporter.put(OutcomeReport(signature=ticket["signature"], agent_id="ledger.post.reported",
                                   outcome=Outcome.SUCCESS))
        reporter.put(RouteEvent(event=RouteEventKind.DELIVERY, at_ms=1_000, trace_id="trace-taken",
                                caller="app.caller.one", result="success"))
        await reporter.flush()
        assert (reporter.sent_reports, reporter.sent_events, reporter.dropped) == (1, 0, 1)
        await reporter.aclose()
    assert node.node.metrics.requests("/v1/reports", "200")._value.get() == 1


async def test_a_caller_s_posts_are_held_to_its_byte_quota_across_all_its_traces(node_factory: NodeFactory) -> None:
    # Made-up trace ids cost nothing to invent: without a quota one caller filled the region's Redis.
    node = await node_factory(proxy={"trace_caller_bytes": 4_000, "trace_ttl_ms": 2_400})
    one, two = (node.token(f"app.caller.{name}", TokenRole.CALLER) for name in ("one", "two"))
    detail = "x" * 900  # ~1 KB an event
    for number in range(3):  # three traces of its own, one event each
        assert (await _post(node, one, _event(f"trace-q{number}", "app.caller.one", detail=detail)))[0] == 200
    status, body = await _post(node, one, _event("trace-q3", "app.caller.one", detail=detail),
                               _event("trace-q4", "app.caller.one", detail=detail))
    assert (status, body["error"], body["field"]) == (429, "trace_quota", "events"), body
    assert 0 < body["details"]["retry_after_ms"] <= 2_400 + 100, body
    assert await _seen(node, "trace-q3", one) == []  # nothing of a refused post was written
    assert await _seen(node, "trace-q0", one) == [("app.caller.one", None)]  # nor anything lost
    # another caller's quota is its own; an admin is not counted
    assert (await _post(node, two, _event("trace-q0", "app.caller.two", detail=detail)))[0] == 200
    assert (await _post(node, None, *(_event(f"trace-a{n}", "app.caller.one", detail=detail) for n in range(5))))[0] == 200

    async def freed() -> bool:  # the caller's oldest posts expire and free its quota
        return (await _post(node, one, _event("trace-q5", "app.caller.one", detail=detail)))[0] == 200

    await wait_for(freed, timeout_s=8, interval_s=0.1, message="the quota freed by expiry")
