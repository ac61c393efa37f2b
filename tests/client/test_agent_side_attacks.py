"""Attacks on the called agent's side (round 22): the SDK's host, the sidecar's gateway and the
route-credential verifier. Each test is one that worked on main before its fix.

Real HTTP on 127.0.0.1 against a real node on the test redis-server; the attacker holds a valid
caller token (so a valid route credential of its own) or nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import aiohttp
import jwt
import orjson
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from federation import FederationConfig, PeerConfig
from federation.keys import PeerKeys
from node.client import CallVerifier, CredentialRejected
from node.client.host import AgentHost
from node.core import Envelope, now_ms
from node.core.models import MAX_KEY_SET_BYTES, MAX_REGION_KEYS, Capability, TokenClaims, TokenRole
from node.trust import JWKS_PATH
from node.trust.credentials import SigningKey

from ..helpers import RunningNode, registration, serve_routes, wait_for


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


async def test_a_crowd_of_made_up_key_ids_waits_for_one_lookup_not_one_each(node: RunningNode) -> None:
    # Each credential naming an unknown key waited its turn for a lookup of its own, one per
    # second: twenty at once (no token needed to send them) held the verifier's lock for twenty
    # seconds, and a real caller whose key set had to be refreshed waited behind all of them.
    agent_id = "side.crowd.one"
    now = [1_000.0]
    waits: list[float] = []

    async def recorded(seconds: float) -> None:  # a clock that moves only when the verifier waits
        waits.append(seconds)
        now[0] += seconds
        await asyncio.sleep(0)

    def forged(n: int) -> str:
        return jwt.encode({"aud": agent_id}, Ed25519PrivateKey.generate(), algorithm="EdDSA",
                          headers={"kid": f"{node.node.region}.{'k' * 30}{n:013d}"})

    async with CallVerifier(node.url, agent_id=agent_id, cache_ttl_s=60, sleep=recorded,
                            clock=lambda: now[0]) as verifier:
        good = f"Bearer {_credential(node, 'billing.front.web', agent_id)}"
        assert (await verifier.verify(good)).sub == "billing.front.web"
        now[0] += 61  # the cached key set is stale: the next verification refreshes it
        answers = await asyncio.gather(*(verifier.verify(f"Bearer {forged(n)}") for n in range(20)),
                                       verifier.verify(good), return_exceptions=True)
    refused = answers[:-1]
    assert all(isinstance(answer, CredentialRejected) and answer.code == "credential_invalid"
               for answer in refused), refused
    assert getattr(answers[-1], "sub", None) == "billing.front.web", answers[-1]
    # the first fetch, the stale refresh (which asked for the first made-up kid), at most one more
    assert verifier.fetches <= 3 and sum(waits) <= 1.0, (verifier.fetches, waits)


async def test_a_key_set_is_read_to_a_bound_not_to_its_end(node: RunningNode) -> None:
    # The verifier read the node's key set, and a node its peers', with response.read(): whatever
    # the size. Here one key padded to twice the bound with blanks, valid JSON, was read whole and
    # believed (and an endless answer was read into memory until the fetch's timeout).
    key = orjson.dumps({"keys": [SigningKey.generate(region="hostile", created_at_ms=0).jwk.model_dump()]})

    async def padded(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(key[:-1])
        with contextlib.suppress(ConnectionError):  # the reader hangs up at the bound
            for _ in range(2 * MAX_KEY_SET_BYTES // 65_536):
                await response.write(b" " * 65_536)
            await response.write(b"}")
        return response

    runner, url = await serve_routes(web.get(JWKS_PATH, padded))
    try:
        async with CallVerifier(url, agent_id="side.keys.one", timeout_s=20) as verifier:
            with pytest.raises(CredentialRejected) as caught:
                await verifier.verify(f"Bearer {_credential(node, 'billing.front.web', 'side.keys.one')}")
            assert caught.value.code == "keys_unavailable", caught.value.message
            assert f"exceeds {MAX_KEY_SET_BYTES} bytes" in caught.value.message
        config = FederationConfig(region="here", bootstrap_servers="127.0.0.1:1", key_refresh_interval_ms=60_000,
                                  peers=[PeerConfig(region="hostile", node_urls=[url])])
        async with PeerKeys(config) as peers:
            await wait_for(lambda: peers.fetches == 1 and peers.failures == 1, timeout_s=10,
                           message="the peer's key set to be refused")
            assert peers.keys() == []
    finally:
        await runner.cleanup()


async def test_a_peer_keeps_at_most_its_share_of_keys_in_the_set_agents_read() -> None:
    # A peer may serve any number of keys of its own region; all were kept, and served by this
    # node to each of its agents on every key-set fetch.
    many = [{"kty": "OKP", "crv": "Ed25519", "x": "A" * 43, "kid": f"hostile.{n:016d}"} for n in range(1_000)]

    async def keys(request: web.Request) -> web.Response:
        return web.json_response({"keys": many})

    runner, url = await serve_routes(web.get(JWKS_PATH, keys))
    config = FederationConfig(region="here", bootstrap_servers="127.0.0.1:1", key_refresh_interval_ms=60_000,
                              peers=[PeerConfig(region="hostile", node_urls=[url])])
    try:
        async with PeerKeys(config) as peers:
            await wait_for(lambda: peers.fetches == 1 and peers.keys(), timeout_s=10, message="the peer's keys")
            assert [key.kid for key in peers.keys()] == [key["kid"] for key in many[:MAX_REGION_KEYS]]
    finally:
        await runner.cleanup()


async def test_a_watcher_that_stops_reading_is_cut_not_held_for_ever(node_factory) -> None:
    # A write to a watcher waits while the socket's buffers are full: one that asked for a replay
    # and never read held the stream, its connection, its place in the caller's share and the
    # events it was sent, for ever, its token's expiry or not (the loop never got past the write).
    node = await node_factory(watch_write_timeout_ms=300)
    prose = "x" * 3_900
    capabilities = [{"name": f"fat.cap{n}", "description": prose} for n in range(64)]
    for n in range(24):  # ~250 KB each: a replay larger than the socket buffers (~3 MB here)
        await node.register(registration(f"fat.watch.a{n}", lease_ttl_ms=600_000, capabilities=capabilities))
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4_096)
    try:
        reader.connect(("127.0.0.1", int(node.url.rsplit(":", 1)[1])))
        reader.sendall(f"GET /v1/watch?since=0 HTTP/1.1\r\nHost: node\r\n"
                       f"Authorization: Bearer {node.admin_token}\r\n\r\n".encode())
        await wait_for(lambda: node.node.watch.subscribers, timeout_s=10, message="the watch to open")
        await wait_for(lambda: not node.node.watch.subscribers, timeout_s=10,
                       message="the stream of the watcher that does not read to be cut")
        assert node.node.watch.cut == 1
    finally:
        reader.close()
