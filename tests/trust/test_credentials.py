"""Route credentials over real HTTP: the called agent knows who calls it, without the cluster secret.

Agents here are the SDK's :class:`AgentHost` (which verifies with :class:`CallVerifier`) on real
ports, registered with real nodes; calls come from the SDK (direct), from proxy mode and from a
plain HTTP client that skips the registry. A two-region pair over the embedded Kafka shows a
credential issued in one region verifying at an agent of the other; a rotation keeps the
credentials already handed out valid.
"""

from __future__ import annotations

import stat
import time
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node.client import CallFailed, CallVerifier, CredentialRejected, ReachClient
from node.client.host import AgentHost
from node.core import Envelope, now_ms
from node.core.models import Capability, TokenClaims, TokenRole
from node.store import RegionStore
from node.trust import JWKS_PATH, RegionKeys, SigningKeyError
from node.trust.credentials import SigningKey
from topology import EmbeddedKafka

from ..conftest import TEST_SECRET
from ..helpers import AgentServer, Pair, RunningNode, registration, wait_for


def _registration(agent_id: str, capability: str = "cred.echo", **extra: Any) -> dict[str, Any]:
    return {"agent_id": agent_id, "description": f"echoes for {agent_id}",
            "capabilities": [Capability(name=capability)], **extra}


async def _echo(envelope: Envelope) -> dict[str, Any]:
    return {"caller": envelope.source_agent, "payload": envelope.payload}


async def _post(url: str, *, authorization: str | None = None, envelope: Envelope | None = None
                ) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=(envelope or Envelope(payload={})).to_json(), headers=headers) as response:
            return response.status, await response.json()


async def test_direct_calls_need_a_credential_for_this_agent_that_has_not_expired(node: RunningNode) -> None:
    async with AgentHost(_registration("cred.echo.one"), _echo, node_url=node.url,
                         token=node.token("cred.echo.one")) as one, \
               AgentHost(_registration("cred.echo.two", capability="cred.other"), _echo, node_url=node.url,
                         token=node.token("cred.echo.two")) as two:
        invoke = f"{one.url}/invoke"
        # Anyone who knows the endpoint and skips the registry: no credential, 401.
        status, body = await _post(invoke)
        assert (status, body["error"]) == (401, "credential_missing"), body
        status, body = await _post(invoke, authorization="Bearer not-a-jwt")
        assert (status, body["error"]) == (401, "credential_invalid"), body

        # Through the SDK: the credential names the caller, and the handler sees it as source_agent.
        async with ReachClient(node.url, token=node.token("billing.front.web", TokenRole.CALLER)) as caller:
            result = await caller.call("cred.echo", {"n": 1})
            ticket = await caller.resolve("cred.echo")
        assert result.status == 200 and result.payload == {"caller": "billing.front.web", "payload": {"n": 1}}
        assert ticket.target.credential is not None

        # The credential of one agent, shown to another: 403.
        status, body = await _post(f"{two.url}/invoke", authorization=f"Bearer {ticket.target.credential}")
        assert (status, body["error"]) == (403, "wrong_agent"), body

        # Expired (issued by the node's own key, ten seconds gone): 401.
        keys = node.node.keys
        gone = now_ms() - 10_000
        expired = keys.issue(caller=TokenClaims(sub="billing.front.web", role=TokenRole.CALLER, iat=0, exp=2**40),
                             agent_id="cred.echo.one", capability="cred.echo", ticket_id="0123456789abcdef",
                             index=0, expires_at_ms=gone, now_ms_=gone - 10_000)
        status, body = await _post(invoke, authorization=f"Bearer {expired}")
        assert (status, body["error"]) == (401, "credential_expired"), body

        # Signed by a key the region does not publish, under the region's own key id: 401.
        forged = jwt.encode({"iss": node.node.region, "sub": "admin", "rol": "admin", "aud": "cred.echo.one",
                             "tid": "x", "jti": "x.0", "iat": int(time.time()), "exp": int(time.time()) + 60},
                            Ed25519PrivateKey.generate(), algorithm="EdDSA", headers={"kid": keys.current.kid})
        status, body = await _post(invoke, authorization=f"Bearer {forged}")
        assert (status, body["error"]) == (401, "credential_invalid"), body
        # An HMAC "credential" (the algorithm-confusion attack) is refused before any key is used.
        confused = jwt.encode({"aud": "cred.echo.one"}, "s" * 32, algorithm="HS256", headers={"kid": keys.current.kid})
        status, body = await _post(invoke, authorization=f"Bearer {confused}")
        assert (status, body["error"]) == (401, "credential_invalid"), body
        assert one.refused == {"credential_missing": 1, "credential_invalid": 3, "credential_expired": 1}
        assert two.refused == {"wrong_agent": 1}


async def test_the_target_enforces_allowed_callers(node: RunningNode) -> None:
    restricted = _registration("cred.vault.one", capability="cred.vault", allowed_callers=["fin.*.*"])
    async with AgentHost(restricted, _echo, node_url=node.url, token=node.token("cred.vault.one")) as vault:
        async with ReachClient(node.url, token=node.token("fin.books.app", TokenRole.CALLER)) as insider:
            assert (await insider.call("cred.vault", {})).payload["caller"] == "fin.books.app"
        # The router never hands an outsider a ticket; a credential minted for one anyway (as a
        # node of the cluster could) is refused by the agent itself.
        outsider = TokenClaims(sub="ops.tool.cli", role=TokenRole.CALLER, iat=0, exp=2**40)
        now = now_ms()
        credential = node.node.keys.issue(caller=outsider, agent_id="cred.vault.one", capability="cred.vault",
                                          ticket_id="fedcba9876543210", index=0, expires_at_ms=now + 10_000,
                                          now_ms_=now)
        status, body = await _post(f"{vault.url}/invoke", authorization=f"Bearer {credential}")
        assert (status, body["error"]) == (403, "caller_not_allowed"), body


async def test_proxied_calls_and_failovers_carry_credentials_too(node: RunningNode) -> None:
    dead = await AgentServer("dead").start()
    await dead.aclose()  # its port refuses connections: the caller fails over
    await node.register(registration("cred.proxy.dead", capability="cred.proxy", endpoint=f"{dead.url}/invoke",
                                     weight=10_000))
    async with AgentHost(_registration("cred.proxy.live", capability="cred.proxy", weight=1), _echo,
                         node_url=node.url, token=node.token("cred.proxy.live")) as live:
        token = node.token("app.caller.one", TokenRole.CALLER)
        async with ReachClient(node.url, token=token, sleep=_no_wait) as caller:
            ticket = await caller.resolve("cred.proxy", fresh=True)
            result = await caller.call("cred.proxy", {"via": "sdk"}, idempotent=True)
        assert ticket.target.agent_id == "cred.proxy.dead" and ticket.alternates[0].credential is None
        # the alternate's credential was issued when the call failed over to it
        assert [a.agent_id for a in result.attempts] == ["cred.proxy.dead", "cred.proxy.live"]
        assert result.payload == {"caller": "app.caller.one", "payload": {"via": "sdk"}}

        envelope = Envelope(operation="cred.proxy", payload={"via": "proxy"}, idempotent=True)
        async with node.session.post("/v1/send", data=envelope.to_json(),
                                     headers={**node.headers(token), "Content-Type": "application/json"}) as sent:
            assert sent.status == 200, await sent.text()
            answer = await sent.json()
        assert answer["payload"] == {"caller": "app.caller.one", "payload": {"via": "proxy"}}
        assert live.refused == {}

        # An alternate's credential goes only to the ticket's caller, for an agent it names.
        body = {"signature": ticket.signature, "agent_id": "cred.proxy.live"}
        status, reply = await node.call("POST", "/v1/credentials", json=body, token=node.token("x.y.z", TokenRole.CALLER))
        assert (status, reply["error"]) == (403, "forbidden"), reply
        status, reply = await node.call("POST", "/v1/credentials", json={**body, "agent_id": "cred.proxy.other"},
                                        token=token)
        assert (status, reply["error"]) == (403, "agent_not_in_ticket"), reply
        status, reply = await node.call("POST", "/v1/credentials", json=body, token=token)
        assert status == 200 and reply["agent_id"] == "cred.proxy.live", reply
        claims = await CallVerifier(node.url, agent_id="cred.proxy.live").verify(f"Bearer {reply['credential']}")
        assert (claims.sub, claims.tid, claims.jti, claims.cap) == ("app.caller.one", ticket.ticket_id,
                                                                    f"{ticket.ticket_id}.1", "cred.proxy")


async def _no_wait(seconds: float) -> None:
    return None


async def test_a_rotation_keeps_the_credentials_in_flight_valid(node: RunningNode) -> None:
    await node.register(registration("cred.rot.one", capability="cred.rot"))
    verifier = CallVerifier(node.url, agent_id="cred.rot.one", refresh_min_interval_s=0.0)
    try:
        status, before = await node.resolve(capability="cred.rot")
        assert status == 200
        old = before["target"]["credential"]
        assert (await verifier.verify(f"Bearer {old}")).sub == "admin"  # the verifier caches the key set now
        old_kid = node.node.keys.current.kid
        status, rotated = await node.call("POST", "/v1/admin/keys/rotate")
        assert status == 200 and rotated["kid"] != old_kid and rotated["rotations"] == 1
        status, after = await node.resolve(capability="cred.rot")
        new = after["target"]["credential"]
        assert jwt.get_unverified_header(new)["kid"] == rotated["kid"] != jwt.get_unverified_header(old)["kid"]
        # the new key is learnt on first sight; the old one still verifies what it signed
        assert (await verifier.verify(f"Bearer {new}")).tid == after["ticket_id"]
        assert (await verifier.verify(f"Bearer {old}")).tid == before["ticket_id"]
        assert verifier.fetches == 2
        status, key_set = await node.call("GET", JWKS_PATH, token="ignored")  # public: no token needed
        assert status == 200 and {old_kid, rotated["kid"]} <= {key["kid"] for key in key_set["keys"]}
        status, refused = await node.call("POST", "/v1/admin/keys/rotate", token=node.token("a.b.c"))
        assert (status, refused["error"]) == (403, "admins_only")
    finally:
        await verifier.aclose()


async def test_an_old_key_leaves_the_key_set_once_its_lease_has_ended(redis_url: str, region: str) -> None:
    """On an injected clock: a rotated key stays published for its lease, then no longer."""
    store = RegionStore.from_url(redis_url, region=region)
    clock = [now_ms()]
    keys = RegionKeys(store.redis, key_base=store.key_base, region=region, ticket_ttl_ms=10_000,
                      publish_interval_ms=60_000, clock=lambda: clock[0])
    try:
        await keys.start()
        old = keys.current.kid
        await keys.rotate()
        clock[0] += keys.lease_ms - 1  # the old key's last credential may still be valid
        assert {old, keys.current.kid} <= set(await keys.published(max_age_ms=0))
        clock[0] += 2
        published = await keys.published(max_age_ms=0)
        assert old not in published and keys.current.kid in published
        assert keys.lease_ms > 3 * 60_000 + 10_000  # outlives every credential signed before the last renewal
    finally:
        await keys.aclose()
        await store.aclose()


async def test_a_credential_issued_in_one_region_verifies_at_an_agent_of_the_other(redis_url: str,
                                                                                    region: str) -> None:
    async with EmbeddedKafka() as kafka:
        pair = Pair(redis_url, region, kafka.bootstrap_servers, secret=TEST_SECRET)
        x, y = pair.names
        try:
            node_x, _ = await pair.start(x)
            node_y, _ = await pair.start(y)
            async with AgentHost(_registration("cred.far.one", capability="cred.far"), _echo, node_url=node_y.url,
                                 token=node_y.token("cred.far.one")) as far:
                caller = node_x.token("app.near.one", TokenRole.CALLER)
                async with ReachClient(node_x.url, token=caller) as client:
                    async def reached() -> bool:
                        try:
                            return (await client.resolve("cred.far", fresh=True)).target.region == y
                        except Exception:
                            return False
                    await wait_for(reached, timeout_s=20, message=f"cred.far.one reaching region {x}")
                    ticket = await client.resolve("cred.far")
                    result = await client.call("cred.far", {"from": x}, idempotent=True)
                assert jwt.decode(ticket.target.credential, options={"verify_signature": False})["iss"] == x
                assert result.region == y and result.payload == {"caller": "app.near.one", "payload": {"from": x}}
                assert far.refused == {}
                # y's key set holds x's keys (asked for by kid), and only under x's name
                status, key_set = await node_y.call("GET", JWKS_PATH)
                regions = {key["kid"].partition(".")[0] for key in key_set["keys"]}
                assert status == 200 and regions == {x, y}, key_set
        finally:
            await pair.aclose()


async def test_the_verifier_says_why_it_cannot_verify(node: RunningNode) -> None:
    verifier = CallVerifier("http://127.0.0.1:9", agent_id="cred.none.one", timeout_s=1.0)
    credential = (await node.resolve(capability="nothing.here"))[1]
    assert credential["error"] == "no_agent_available"
    await node.register(registration("cred.none.one", capability="cred.none"))
    status, ticket = await node.resolve(capability="cred.none")
    with pytest.raises(CredentialRejected) as caught:
        await verifier.verify(f"Bearer {ticket['target']['credential']}")
    assert caught.value.status == 503 and caught.value.code == "keys_unavailable"
    await verifier.aclose()
    with pytest.raises(CallFailed):  # nothing listens at the registered endpoint
        async with ReachClient(node.url, token=node.admin_token) as client:
            await client.call("cred.none", {})


async def test_replicas_publish_their_keys_and_a_key_file_stays_private(node_factory, tmp_path: Path) -> None:
    one, two = await node_factory(), await node_factory()  # two replicas of one region, keys in memory
    assert one.node.keys.current.kid != two.node.keys.current.kid
    await one.register(registration("cred.rep.one", capability="cred.rep"))
    status, ticket = await two.resolve(capability="cred.rep")  # signed by replica two …
    assert status == 200
    async with CallVerifier(one.url, agent_id="cred.rep.one") as verifier:  # … verified with replica one's set
        assert (await verifier.verify(f"Bearer {ticket['target']['credential']}")).tid == ticket["ticket_id"]

    key_file = tmp_path / "keys" / "signing.pem"
    first = await node_factory(signing_key_file=str(key_file))
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    again = await node_factory(signing_key_file=str(key_file))  # a restart (or a replica) with the file
    assert again.node.keys.current.kid == first.node.keys.current.kid
    key_file.chmod(0o644)
    with pytest.raises(SigningKeyError, match="chmod 600"):
        await node_factory(signing_key_file=str(key_file))


async def test_calls_in_flight_across_a_rotation_are_served(node: RunningNode) -> None:
    async with AgentHost(_registration("cred.spin.one", capability="cred.spin"), _echo, node_url=node.url,
                         token=node.token("cred.spin.one")) as agent:
        async with ReachClient(node.url, token=node.token("app.caller.two", TokenRole.CALLER)) as caller:
            before = await caller.call("cred.spin", {"n": 1})
            old_kid = node.node.keys.current.kid
            status, _ = await node.call("POST", "/v1/admin/keys/rotate")
            assert status == 200
            cached_ticket = await caller.resolve("cred.spin")  # the ticket cached before the rotation
            cached = await caller.call("cred.spin", {"n": 2})  # … and its old-key credential, still good
            fresh_ticket = await caller.resolve("cred.spin", fresh=True)  # signed with the new key
            fresh = await caller.call("cred.spin", {"n": 3})
        assert jwt.get_unverified_header(cached_ticket.target.credential)["kid"] == old_kid
        assert jwt.get_unverified_header(fresh_ticket.target.credential)["kid"] == node.node.keys.current.kid != old_kid
        assert [r.payload["payload"] for r in (before, cached, fresh)] == [{"n": 1}, {"n": 2}, {"n": 3}]
        assert agent.refused == {} and agent.handled == 3


async def test_unknown_keys_are_looked_up_at_most_once_a_second(node: RunningNode) -> None:
    # A clock that moves only when the verifier waits: the intervals are the verifier's own
    # arithmetic, not how long a fetch took on a loaded machine.
    waits: list[float] = []
    now = [1_000.0]

    async def recorded(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    def forged(letter: str) -> str:
        return jwt.encode({"aud": "cred.junk.one"}, Ed25519PrivateKey.generate(), algorithm="EdDSA",
                          headers={"kid": f"{node.node.region}.{letter * 43}"})

    async with CallVerifier(node.url, agent_id="cred.junk.one", sleep=recorded, clock=lambda: now[0]) as verifier:
        for credential in (forged("B"), forged("B"), forged("B"), forged("C"), forged("D")):
            with pytest.raises(CredentialRejected) as caught:
                await verifier.verify(f"Bearer {credential}")
            assert caught.value.code == "credential_invalid" and "does not publish" in caught.value.message
    # one fetch for B (asked for it; B again within the second is refused at once), then C and D
    # each wait for (nearly) the whole interval since the last lookup
    assert verifier.fetches == 3 and len(waits) == 2 and all(0.5 < wait <= 1.0 for wait in waits), waits


async def test_a_credential_is_signed_once_per_caller_agent_capability_and_reuse_window(node: RunningNode) -> None:
    keys = node.node.keys
    assert keys.reuse_ms == 5_000
    caller = TokenClaims(sub="billing.front.web", role=TokenRole.CALLER, iat=0, exp=2**40)
    other = TokenClaims(sub="billing.back.job", role=TokenRole.CALLER, iat=0, exp=2**40)
    window = (now_ms() // 5_000 + 6) * 5_000  # the start of a reuse window 25-30 s from now

    def issue(claims: TokenClaims, capability: str, expires_at_ms: int, ticket_id: str) -> str:
        return keys.issue(caller=claims, agent_id="cred.reuse.one", capability=capability, ticket_id=ticket_id,
                          index=0, expires_at_ms=expires_at_ms, now_ms_=expires_at_ms - 10_000)

    first = issue(caller, "cred.reuse", window + 100, "0000000000000001")
    reused = keys.reused
    assert issue(caller, "cred.reuse", window + 4_900, "0000000000000002") == first  # same window: reused
    assert keys.reused == reused + 1
    assert issue(caller, "cred.reuse", window + 5_100, "0000000000000003") != first  # the next window
    assert issue(other, "cred.reuse", window + 100, "0000000000000004") != first
    assert issue(caller, "cred.other", window + 100, "0000000000000005") != first
    claims = jwt.decode(first, options={"verify_signature": False})
    # never before its ticket, and less than the window after it
    assert claims["exp"] == window // 1000 + 5 and claims["tid"] == "0000000000000001"
    exact = issue(caller, "cred.exact", window, "0000000000000006")  # a ticket ending on the window's edge
    assert jwt.decode(exact, options={"verify_signature": False})["exp"] == window // 1000


@pytest.mark.unit
def test_the_reuse_window_is_whole_seconds() -> None:
    with pytest.raises(ValueError, match="whole number of seconds"):
        RegionKeys(None, key_base="k", region="r1", ticket_ttl_ms=10_000, reuse_ms=1_500)  # type: ignore[arg-type]


@pytest.mark.unit
def test_a_credential_is_the_jws_pyjwt_would_write_and_verifies_with_it() -> None:
    key = SigningKey.generate(region="cred-r1", created_at_ms=0)
    claims = {"iss": "cred-r1", "sub": "app.x.one", "rol": "caller", "aud": "cred.echo.one", "tid": "t1",
              "jti": "t1.0", "iat": 1, "exp": 4_102_444_800, "cap": "cred.echo"}
    written = key.sign_jwt(claims)
    assert written == jwt.encode(claims, key.private, algorithm="EdDSA", headers={"kid": key.kid})
    assert jwt.decode(written, key.private.public_key(), algorithms=["EdDSA"], audience="cred.echo.one") == claims
