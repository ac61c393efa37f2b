"""ACL rules everywhere: a rule set in one region holds in every region, carried over Kafka by each
region's ACL relay (``federation.acl``) — three regions in this process on the real Redis, the
embedded Kafka broker and real HTTP. Region a replicates b and keeps only c's summaries, so a's
lookups of c's agents are forwarded to c's node, which applies the rule to the real caller.

Measured here (printed): how long after the setting call returns every other region applies it.
"""

from __future__ import annotations

import time

import pytest

from node.core.models import TokenRole
from topology.embedded import EmbeddedKafka

from ..helpers import RunningNode, registration, wait_for
from .test_summaries import Trio

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(150)]


async def _statuses(node: RunningNode, token: str, agent_ids: list[str]) -> list[int]:
    return [(await node.call("GET", f"/v1/agents/{agent_id}", token=token))[0] for agent_id in agent_ids]


async def test_a_rule_set_in_one_region_holds_in_every_region_and_on_forwarded_lookups(redis_url: str,
                                                                                      region: str) -> None:
    async with EmbeddedKafka() as kafka:
        trio = Trio(redis_url, region, kafka.bootstrap_servers)
        a, b, c = trio.names
        try:
            nodes = {name: await trio.start(name) for name in trio.names}
            relays = [trio.federations[name].acl_relay for name in trio.names]
            await wait_for(lambda: all(relay.state.value == "relaying" for relay in relays), timeout_s=30,
                           message="every region's ACL relay running")
            replicated = registration("fin.books.b1", capability="books.post", lease_ttl_ms=600_000)
            forwarded = registration("fin.ledger.c1", capability="ledger.post", lease_ttl_ms=600_000)
            await nodes[b].register(replicated)
            await nodes[c].register(forwarded)
            await wait_for(lambda: nodes[a].node.find("fin.books.b1"), timeout_s=15, message="b's agent in a")
            shop = nodes[a].token("shop.web.front", TokenRole.CALLER)
            fin = nodes[a].token("fin.app.main", TokenRole.CALLER)
            ids = ["fin.books.b1", "fin.ledger.c1"]
            assert await _statuses(nodes[a], shop, ids) == [200, 200]  # c's through its node

            status, body = await nodes[b].call("PUT", "/v1/acl/no-shop", json={
                "agents": "fin.*.*", "callers": ["shop.*.*"], "effect": "deny"})
            assert status == 200, body
            started = time.monotonic()
            await wait_for(lambda: nodes[a].node.acl.active and nodes[c].node.acl.active, timeout_s=15,
                           interval_s=0.005, message="the rule in a and c")
            print(f"\nthe rule set in b held in a and c after {(time.monotonic() - started) * 1000:.0f} ms")
            assert nodes[a].node.acl.entries()[0].origin == b
            assert await _statuses(nodes[a], shop, ids) == [404, 404]  # a's replica, and c asked by a's node
            assert await _statuses(nodes[a], fin, ids) == [200, 200]
            status, refused = await nodes[a].resolve(shop, capability="books.post")
            assert status == 404 and refused["error"] == "no_agent_available", refused
            assert (await nodes[a].resolve(fin, capability="books.post"))[0] == 200

            # Deleted in another region than the one it was set in: the later entry wins everywhere.
            status, body = await nodes[a].call("DELETE", "/v1/acl/no-shop")
            assert status == 200 and body["rule"]["origin"] == a
            await wait_for(lambda: not nodes[b].node.acl.active and not nodes[c].node.acl.active, timeout_s=15,
                           message="the deletion in b and c")
            assert await _statuses(nodes[a], shop, ids) == [200, 200]
            assert trio.federations[b].acl_relay.stats.applied >= 1
            status, listed = await nodes[c].call("GET", "/v1/acl")
            assert status == 200 and listed["rules"] == []
        finally:
            await trio.aclose()
