"""Loop protection the node owns (``node.http.proxy.hops``): two agents ping-ponging one trace through
``POST /v1/send`` with envelopes they write afresh (``hop_count`` 0) stop at the hop limit.

Before, the node trusted the number the agent sent, and such a pair looped until the test's own cap
(30 deliveries). Each agent here is real: an HTTP server the node delivers to, sending with its own
agent token; every loop is capped at :data:`CAP` deliveries.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from node.client.host import AgentHost
from node.core import DEFAULT_MAX_HOPS, Envelope
from node.core.models import TokenRole

from ..helpers import RunningNode, registration, wait_for
from .test_proxy import EnvelopeAgent, send

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

CAP = 30  # deliveries in all, whatever the node does: the test's own bound
HOP_HEADER = "X-Reach-Hop"  # node.core.HOP_HEADER, spelled out: what an agent's HTTP library sends


async def test_hand_written_agents_sending_fresh_envelopes_stop_at_the_hop_limit(node: RunningNode) -> None:
    """Each agent answers a delivery by sending the other a new envelope of the same trace, hop_count 0,
    and never passes the node's stamp on: the trace's ledger counts for them."""
    tokens = {name: node.token(name) for name in ("loop.fresh.a", "loop.fresh.b")}
    refusals: list[dict[str, Any]] = []
    agents: dict[str, EnvelopeAgent] = {}

    def bouncer(me: str, other: str):
        async def handle(body: dict[str, Any]) -> web.StreamResponse:
            if sum(len(agent.received) for agent in agents.values()) < CAP:
                fresh = Envelope(operation="loop.fresh", target_agent=other, trace_id=body["trace_id"],
                                 payload={"from": me})  # hop_count 0: what a hand-written agent writes
                status, answer, _ = await send(node, fresh, token=tokens[me])
                if status != 200:
                    refusals.append({"at": me, "status": status, "answer": answer})
            reply = Envelope.model_validate(body).reply({"at": me})
            return web.Response(body=reply.to_json(), content_type="application/json")
        return handle

    agents["loop.fresh.a"] = await EnvelopeAgent("a", bouncer("loop.fresh.a", "loop.fresh.b")).start()
    agents["loop.fresh.b"] = await EnvelopeAgent("b", bouncer("loop.fresh.b", "loop.fresh.a")).start()
    try:
        for name, agent in agents.items():
            await node.register(registration(name, capability="loop.fresh", endpoint=agent.invoke_url))
        status, body, _ = await send(node, Envelope(operation="loop.fresh", target_agent="loop.fresh.a",
                                                    trace_id="trace-fresh-loop"),
                                     token=node.token("app.loop.starter", TokenRole.CALLER))
        assert status == 200, body
        hops = sorted(received["hop_count"] for agent in agents.values() for received in agent.received)
        assert hops == list(range(1, DEFAULT_MAX_HOPS + 1)), hops  # 5 deliveries, then refused
        assert [r["answer"]["error"] for r in refusals] == ["hop_limit_exceeded"], refusals
    finally:
        for agent in agents.values():
            await agent.aclose()


async def test_sdk_agents_carry_the_count_even_into_a_new_trace(node: RunningNode) -> None:
    """Agents on the SDK's host send new envelopes with new trace ids: the node's stamp, sent back
    by the SDK by itself, carries the count from one to the next."""
    delivered: list[int] = []
    refused: list[str] = []
    hosts: dict[str, AgentHost] = {}

    def bouncer(me: str, other: str):
        async def handle(envelope: Envelope) -> dict[str, Any]:
            delivered.append(envelope.hop_count)
            client = hosts[me].client
            assert client is not None
            if len(delivered) < CAP:
                try:
                    await client.send(Envelope(operation="loop.sdk", target_agent=other, payload={"from": me}))
                except Exception as exc:  # the node's refusal, as the SDK raises it
                    refused.append(getattr(exc, "code", repr(exc)))
            return {"at": me}
        return handle

    for me, other in (("loop.sdk.a", "loop.sdk.b"), ("loop.sdk.b", "loop.sdk.a")):
        hosts[me] = AgentHost({"agent_id": me, "capabilities": [{"name": "loop.sdk"}]}, bouncer(me, other),
                              node_url=node.url, token=node.token(me))
        await hosts[me].start()
    try:
        async with AgentHost({"agent_id": "loop.sdk.start", "capabilities": [{"name": "loop.none"}]},
                             bouncer("loop.sdk.start", "loop.sdk.a"), node_url=node.url,
                             token=node.token("loop.sdk.start")) as starter:
            assert starter.client is not None
            answer = await starter.client.send(Envelope(operation="loop.sdk", target_agent="loop.sdk.a"))
            assert answer.status == 200, answer
        await wait_for(lambda: refused, message="the refusal at the hop limit")
        assert delivered == list(range(1, DEFAULT_MAX_HOPS + 1)), delivered
        assert refused == ["hop_limit_exceeded"], refused
    finally:
        for host in hosts.values():
            await host.aclose()


async def test_an_agent_can_raise_the_count_but_not_forge_the_stamp(node: RunningNode) -> None:
    agent = await EnvelopeAgent("stamped").start()
    try:
        await node.register(registration("loop.stamp.target", capability="loop.stamp", endpoint=agent.invoke_url))
        token = node.token("app.stamp.caller", TokenRole.CALLER)
        status, body, _ = await send(node, Envelope(operation="loop.stamp", hop_count=3), token=token)
        assert status == 200 and agent.received[-1]["hop_count"] == 4, body
        async with node.session.post(node.url + "/v1/send", data=Envelope(operation="loop.stamp").to_json(),
                                     headers={**node.headers(token), "Content-Type": "application/json",
                                              HOP_HEADER: "eyJob3AiOjB9.forgedmacforgedmac"}) as response:
            refusal = await response.json()
            assert response.status == 422 and refusal["error"] == "invalid_hop_stamp", refusal
        assert len(agent.received) == 1
    finally:
        await agent.aclose()
