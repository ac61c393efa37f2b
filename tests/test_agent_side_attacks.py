"""Attacks on the called agent's side (round 22): the SDK's host, the sidecar's gateway and the
route-credential verifier. Each test is one that worked on main before its fix.

Real HTTP on 127.0.0.1 against a real node on the test redis-server; the attacker holds a valid
caller token (so a valid route credential of its own) or nothing.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from node.client.host import AgentHost
from node.clock import now_ms
from node.envelope import Envelope
from node.models import Capability, TokenClaims, TokenRole

from .helpers import RunningNode


def _credential(node: RunningNode, caller: str, agent_id: str) -> str:
    """A route credential the node signs for ``caller`` (a caller token's subject) to call ``agent_id``."""
    now = now_ms()
    claims = TokenClaims(sub=caller, role=TokenRole.CALLER, iat=0, exp=2**40)
    return node.node.keys.issue(caller=claims, agent_id=agent_id, capability=None, ticket_id="0123456789abcdef",
                                index=0, expires_at_ms=now + 30_000, now_ms_=now)


async def test_one_caller_cannot_read_nor_preempt_another_s_answer_by_its_envelope_id(node: RunningNode) -> None:
    # The host answered a repeated envelope id from one cache for everyone: a caller that knew (or
    # guessed: ids are often business keys) another's id got that caller's answer, and one that
    # sent it first made the handler never run for the other.
    async def handle(envelope: Envelope) -> dict[str, Any]:
        return {"for": envelope.source_agent, "payload": envelope.payload}

    agent_id = "side.answers.one"
    registration = {"agent_id": agent_id, "capabilities": [Capability(name="side.answers")]}
    async with AgentHost(registration, handle, node_url=node.url, token=node.token(agent_id)) as host:
        async def post(caller: str, payload: str) -> dict[str, Any]:
            headers = {"Authorization": f"Bearer {_credential(node, caller, agent_id)}",
                       "Content-Type": "application/json"}
            envelope = Envelope(id="invoice-42", payload=payload)
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{host.url}/invoke", data=envelope.to_json(), headers=headers) as answer:
                    assert answer.status == 200, await answer.text()
                    return (await answer.json())["payload"]

        assert await post("mallory.evil.web", "first") == {"for": "mallory.evil.web", "payload": "first"}
        assert await post("alice.books.web", "secret") == {"for": "alice.books.web", "payload": "secret"}
        # Each caller's retry is still answered from the cache, without running the handler again.
        assert await post("alice.books.web", "again") == {"for": "alice.books.web", "payload": "secret"}
        assert await post("mallory.evil.web", "peek") == {"for": "mallory.evil.web", "payload": "first"}
        assert host.handled == 2
