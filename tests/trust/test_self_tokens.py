"""Tokens a node mints for itself (``node.trust.SelfToken``): minutes long, renewed before they
end, each logged with what revoking it takes — and a peer that revoked one refuses it while the
node renews and goes on (the semantic vector fetch between regions, on a real node)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import time

import aiohttp
import pytest

from node.core.models import TokenRole
from node.http import bound_port, serve
from node.service import RegistryNode
from node.trust import DEFAULT_TOKEN_TTL_S, SelfToken, Signer
from topology.composition import attach_discovery, fetch_vectors

from ..conftest import TEST_SECRET
from ..helpers import wait_for

@pytest.mark.unit
def test_a_self_token_lives_minutes_is_logged_and_renewed_at_half_life(caplog: pytest.LogCaptureFixture) -> None:
    signer = Signer(TEST_SECRET)
    caplog.set_level(logging.INFO, logger="node.trust.tokens")
    token = SelfToken(signer, "federation:ra", TokenRole.PEER)
    first = token.current()
    claims = signer.verify(first)
    assert claims.role is TokenRole.PEER and claims.exp - claims.iat == 600 < DEFAULT_TOKEN_TTL_S
    assert token.current() == first and token.minted == 1  # reused while young
    assert f"--jti {claims.jti} --exp {claims.exp}" in caplog.text
    assert token.renew() != first and token.minted == 2
    with pytest.raises(ValueError, match="at least 2 seconds"):
        SelfToken(signer, "federation:ra", TokenRole.PEER, ttl_s=1)


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_a_short_self_token_is_renewed_once_half_its_life_is_gone() -> None:
    token = SelfToken(Signer(TEST_SECRET), "federation:ra", TokenRole.PEER, ttl_s=2)
    first = token.current()
    started = time.monotonic()
    await wait_for(lambda: token.current() != first, timeout_s=5, message="the token renewed")
    assert time.monotonic() - started < 2  # before the first one ended


@pytest.mark.asyncio
async def test_a_peer_that_revoked_the_vector_token_refuses_it_and_the_next_one_passes(node_factory) -> None:
    running = await node_factory()  # the region whose node answers /v1/semantic/vectors
    running_config = running.node.config
    peer = RegistryNode(running_config.model_copy(update={"region": f"{running_config.region}-v"}),
                        secret=TEST_SECRET)
    attach_discovery(peer, semantic_enabled=False)
    await peer.start()
    runner = await serve(peer)
    url = f"http://127.0.0.1:{bound_port(runner)}"
    token = SelfToken(Signer(TEST_SECRET), f"{running_config.region}.semantic.peer", TokenRole.PEER)
    try:
        async with aiohttp.ClientSession() as session:
            async def answered() -> int:
                async with session.post(f"{url}/v1/semantic/vectors", json={"keys": []},
                                        headers={"Authorization": f"Bearer {token.current()}"}) as response:
                    return response.status

            assert await answered() == 200
            claims = token.claims
            assert claims is not None
            async with session.post(f"{url}/v1/admin/tokens/revoke", json={"jti": claims.jti, "exp": claims.exp},
                                    headers={"Authorization": f"Bearer {peer.signer.issue('admin', TokenRole.ADMIN)}"}
                                    ) as response:
                assert response.status == 200, await response.text()
            assert await answered() == 401
            assert await fetch_vectors(session, url, ["k"], token=token) == {}  # refused: renews
            assert token.claims is not None and token.claims.jti != claims.jti
            assert await answered() == 200
    finally:
        await runner.cleanup()
        await peer.aclose()


@pytest.mark.unit
def test_a_ticket_seal_is_hmac_sha256_of_its_payload_so_nodes_of_any_release_verify_it() -> None:
    """The seal is keyed once and copied per ticket; the bytes stay the one-shot HMAC's, which
    every node of the region (of this release or the last) computes to verify a ticket."""
    secret = b"s" * 40
    signer = Signer(secret)
    sealed = signer.sign_ticket({"t": "0123", "a": ["lang.translate.t1"], "e": 1})
    payload, _, mac = sealed.partition(".")
    key = hmac.new(secret, b"agent-reach ticket", hashlib.sha256).digest()
    assert mac == base64.urlsafe_b64encode(hmac.digest(key, payload.encode(), "sha256")[:16]).rstrip(b"=").decode()
    assert signer.verify_ticket(sealed)["a"] == ["lang.translate.t1"]
    assert Signer(secret).verify_hop(signer.sign_hop({"h": 1})) == {"h": 1}
    assert Signer(b"t" * 40).verify_hop(signer.sign_hop({"h": 1})) is None  # another cluster's stamp
