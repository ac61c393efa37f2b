"""The SDK draws each call among a ticket's targets by their weights (a real node over HTTP).

A cached ticket used to pin every call to its target for the ticket's lifetime (9 s); now it is
reused for ``ticket_reuse_ms`` (1 s by default), and each call
draws its first target among the ticket's target and alternates in proportion to the effective
weights the node put on them (``POST /v1/resolve?weights=true``). A call with a conversation_id
keeps the ticket's target; an agent whose breaker opened is drawn no more.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from node.client import ReachClient
from node.core.models import TokenRole

from ..helpers import AgentServer, RunningNode, registration

CALLS = 600
WEIGHTS = {"lang.translate.six": 60, "lang.translate.three": 30, "lang.translate.one": 10}
TOLERANCE = 0.06  # absolute share; 600 calls put one binomial sd at <= 0.02


class FailingAgent(AgentServer):
    async def _invoke(self, request: web.Request) -> web.Response:
        self.calls += 1
        return web.json_response({"error": "down"}, status=503)


async def _fleet(node: RunningNode, weights: dict[str, int],
                 failing: frozenset[str] = frozenset()) -> dict[str, AgentServer]:
    servers: dict[str, AgentServer] = {}
    for agent_id, weight in weights.items():
        server = await (FailingAgent if agent_id in failing else AgentServer)(agent_id).start()
        servers[agent_id] = server
        await node.register(registration(agent_id, endpoint=server.url + "/invoke", weight=weight))
    return servers


@contextlib.asynccontextmanager
async def _calling(node: RunningNode, weights: dict[str, int], *, seed: int, failing: frozenset[str] = frozenset(),
                   **options: Any) -> AsyncIterator[tuple[ReachClient, dict[str, AgentServer]]]:
    """The agents of ``weights`` serving, and a started caller whose draws are seeded."""
    servers = await _fleet(node, weights, failing)
    client = ReachClient(node.url, token=node.token(f"caller.app.s{seed}", TokenRole.CALLER),
                         draw_rng=random.Random(seed), report_outcomes=False, **options)
    try:
        async with client:
            yield client, servers
    finally:
        for server in servers.values():
            await server.aclose()


def _resolves(node: RunningNode) -> float:
    value = node.node.metrics.registry.get_sample_value("agent_reach_resolves_total",
                                                        {"result": "ok", "match": "exact", "locality": "local"})
    return value or 0.0


async def test_weights_are_sent_only_when_asked(node: RunningNode) -> None:
    async with _calling(node, WEIGHTS, seed=1):
        status, plain = await node.resolve(capability="translate.text")
        assert status == 200
        assert all("weight" not in target for target in (plain["target"], *plain["alternates"])), plain
        async with node.session.post("/v1/resolve?weights=true", json={"capability": "translate.text"},
                                     headers=node.headers()) as response:
            weighted = await response.json()
        targets = [weighted["target"], *weighted["alternates"]]
        assert {target["agent_id"]: target["weight"] for target in targets} == WEIGHTS


async def test_calls_spread_over_one_tickets_targets_in_proportion_to_weight(node: RunningNode) -> None:
    # reused for as long as the ticket lives (9 s), so a slow machine still makes all calls on one ticket
    async with _calling(node, WEIGHTS, seed=3, ticket_reuse_ms=60_000) as (client, servers):
        before = _resolves(node)
        answered = Counter([(await client.call("translate.text", {"n": n})).agent_id for n in range(CALLS)])
        assert _resolves(node) - before == 1, "every call came from the one cached ticket"
        shares = {agent_id: answered[agent_id] / CALLS for agent_id in WEIGHTS}
        print(f"\n{CALLS} calls on one ticket: " + ", ".join(f"{a} {100 * s:.1f}%" for a, s in shares.items()))
        total = sum(WEIGHTS.values())
        for agent_id, weight in WEIGHTS.items():
            assert abs(shares[agent_id] - weight / total) < TOLERANCE, shares
            assert servers[agent_id].calls == answered[agent_id]


async def test_a_conversation_keeps_its_target(node: RunningNode) -> None:
    async with _calling(node, WEIGHTS, seed=3) as (client, _):
        for conversation in ("conv-a", "conv-b", "conv-c"):
            answered = {(await client.call("translate.text", {"n": n}, conversation_id=conversation)).agent_id
                        for n in range(40)}
            ticket = await client.resolve("translate.text", conversation_id=conversation)
            assert answered == {ticket.target.agent_id}, (conversation, answered)


async def test_an_agent_whose_breaker_opened_is_drawn_no_more(node: RunningNode) -> None:
    weights = {"lang.translate.good": 50, "lang.translate.bad": 50}
    async with _calling(node, weights, seed=5, failing=frozenset({"lang.translate.bad"}), breaker_failures=3,
                        retry_initial_backoff_ms=1, retry_max_backoff_ms=2) as (client, servers):
        results = [await client.call("translate.text", {"n": n}, idempotent=True) for n in range(60)]
        assert {result.agent_id for result in results} == {"lang.translate.good"}, "every call failed over"
        bad_first = sum(1 for result in results if result.attempts[0].agent_id == "lang.translate.bad")
        # half the draws would pick it; the breaker (3 failures) leaves at most a few
        assert servers["lang.translate.bad"].calls == bad_first <= 5, bad_first


async def test_a_ticket_is_reused_for_ticket_reuse_ms_only(node: RunningNode) -> None:
    now = [1_000.0]
    async with ReachClient(node.url, token=node.admin_token, clock=lambda: now[0], ticket_reuse_ms=1_000) as client:
        await node.register(registration("lang.translate.reused"))
        first = await client.resolve("translate.text")
        now[0] += 0.95
        assert (await client.resolve("translate.text")).ticket_id == first.ticket_id
        now[0] += 0.1  # 1.05 s: the ticket lives 10 s, but its weights are a second old
        assert (await client.resolve("translate.text")).ticket_id != first.ticket_id
    async with ReachClient(node.url, token=node.admin_token, ticket_reuse_ms=0) as client:
        assert (await client.resolve("translate.text")).ticket_id != (await client.resolve("translate.text")).ticket_id
