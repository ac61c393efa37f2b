"""Forwarding that cannot loop: three regions that keep only summaries of each other
(``replicate_depth = 0``) in this process, on the real Redis, the embedded Kafka and real HTTP.

A request a node forwards carries a token marked as forwarded (``TokenClaims.fwd``: the region
that forwarded it and the caller's own token id); a node never forwards such a request again, a
peer's 404 is an answer, an agent id is checked against the agent-id pattern before it enters a
path, and the peer refuses a caller whose own token it has revoked (``federation.forward``).
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from node.core.models import TokenClaims, TokenRole
from node.http.plumbing import IN_FLIGHT_KEY
from node.trust import Signer, token_claims_unverified
from topology.embedded import EmbeddedKafka

from ..conftest import TEST_SECRET
from ..helpers import RunningNode, registration, wait_for
from .test_summaries import Trio

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

CAPABILITY = "fwd.only"
_REQUESTS_RE = re.compile(r'^agent_reach_http_requests_total\{route="([^"]*)",status="\d+"\} ([0-9.e+]+)$', re.M)
_REVOKED_RE = re.compile(r'^agent_reach_auth_refusals_total\{code="token_revoked"\} ([0-9.e+]+)$', re.M)


async def _requests_by_route(running: RunningNode) -> dict[str, int]:
    """The requests ``running``'s node has answered, by route (its own ``/metrics``)."""
    status, text = await running.call("GET", "/metrics")
    assert status == 200
    counts: dict[str, int] = {}
    for route, value in _REQUESTS_RE.findall(text):
        counts[route] = counts.get(route, 0) + int(float(value))
    counts.pop("/metrics", None)  # these reads themselves
    return counts


async def _revoked_refusals(running: RunningNode) -> int:
    status, text = await running.call("GET", "/metrics")
    assert status == 200
    found = _REVOKED_RE.search(text)
    return int(float(found.group(1))) if found else 0


def _idle(nodes: dict[str, RunningNode]) -> bool:
    """No node is inside a request: nothing can still be forwarding (only handlers forward)."""
    return all(running.runner.app[IN_FLIGHT_KEY].count == 0 for running in nodes.values())


async def _start_summary_only(trio: Trio) -> dict[str, RunningNode]:
    nodes = {name: await trio.start(name) for name in trio.names}
    for name in trio.names:
        catalog = trio.federations[name].catalog
        assert all(not catalog.peer(peer).replicated for peer in trio.names if peer != name)
    return nodes


async def _serving_in(trio: Trio, here: str, there: str) -> None:
    catalog = trio.federations[here].catalog
    await wait_for(lambda: catalog.peer(there).summary is not None
                   and catalog.peer(there).summary.serving_weight(CAPABILITY) > 0, timeout_s=15,
                   message=f"{there}'s summary of {CAPABILITY} in {here}")


async def test_one_unknown_id_lookup_asks_each_peer_once_and_leaves_them_answering(redis_url: str,
                                                                                   region: str) -> None:
    async with EmbeddedKafka() as kafka:
        trio = Trio(redis_url, region, kafka.bootstrap_servers, replicate_depth=0)
        a, b, c = trio.names
        try:
            nodes = await _start_summary_only(trio)
            await nodes[c].register(registration("fwd.known.c1", capability=CAPABILITY, lease_ttl_ms=600_000))
            await _serving_in(trio, a, c)
            caller = nodes[a].token("app.caller.one", TokenRole.CALLER)
            before = {name: (await _requests_by_route(running)).get("/v1/agents/{agent_id}", 0)
                      for name, running in nodes.items()}

            status, answer = await nodes[a].call("GET", "/v1/agents/no.such.agent", token=caller)
            # Right after the answer, while the peers may still be busy with it: a's lookup and resolve
            # of c's agent are served (the peers' 404s were answers: nobody was marked silent).
            right_after = [(await nodes[a].call("GET", "/v1/agents/fwd.known.c1", token=caller))[0],
                           (await nodes[a].resolve(token=caller, capability=CAPABILITY))[0]]
            await wait_for(lambda: _idle(nodes), timeout_s=60, message="every node done with the lookup")
            after = {name: (await _requests_by_route(running)).get("/v1/agents/{agent_id}", 0)
                     for name, running in nodes.items()}
            received = {name: after[name] - before[name] for name in trio.names}
            # The caller's two lookups at a (the unknown id, then c's agent), each forwarded once to
            # each peer: the unknown id's forwards are the rest once both lookups and c's agent's two
            # forwards are taken away.
            print(f"\none unknown-id lookup from {a}: {sum(received.values()) - 2 - 2} forwarded requests "
                  f"(received by region, with c's agent's lookup: {received}); a lookup and a resolve right "
                  f"after: {right_after}")
            assert status == 404 and answer["error"] == "unknown_agent", answer
            assert received == {a: 2, b: 2, c: 2}, received
            assert answer.get("details") is None, answer  # both peers answered: nobody is named silent
            assert right_after == [200, 200], right_after
            for name in trio.names:
                forwarder = trio.federations[name].forwarder
                assert (forwarder.unanswered, forwarder.skipped) == (0, 0), name

            # And after: no peer was marked silent anywhere.
            for _ in range(10):
                status, record = await nodes[a].call("GET", "/v1/agents/fwd.known.c1", token=caller)
                assert status == 200 and record["region"] == c, record
                status, ticket = await nodes[a].resolve(token=caller, capability=CAPABILITY)
                assert status == 200 and ticket["target"]["region"] == c, ticket
        finally:
            await trio.aclose()


async def test_an_agent_id_that_climbs_out_of_its_path_is_refused_and_reaches_no_peer(redis_url: str,
                                                                                      region: str) -> None:
    async with EmbeddedKafka() as kafka:
        trio = Trio(redis_url, region, kafka.bootstrap_servers, replicate_depth=0)
        a, b, c = trio.names
        try:
            nodes = await _start_summary_only(trio)
            await nodes[c].register(registration("fw.target.one", capability=CAPABILITY, lease_ttl_ms=600_000))
            caller = nodes[a].token("app.caller.two", TokenRole.CALLER)
            before = {name: await _requests_by_route(nodes[name]) for name in (b, c)}
            for path in ("/v1/agents/x%2F..%2Ffw.target.one", "/v1/agents/x%2F..%2F..%2Fhealthz"):
                status, answer = await nodes[a].call("GET", path, token=caller)
                assert status == 422 and answer["field"] == "agent_id", (path, answer)
            await wait_for(lambda: _idle(nodes), timeout_s=60, message="every node done with the lookups")
            for name in (b, c):
                assert await _requests_by_route(nodes[name]) == before[name], name  # no path of a peer reached
        finally:
            await trio.aclose()


async def test_a_token_revoked_in_a_region_is_refused_there_when_it_comes_through_a_peer(redis_url: str,
                                                                                        region: str) -> None:
    async with EmbeddedKafka() as kafka:
        trio = Trio(redis_url, region, kafka.bootstrap_servers, discovery=True, replicate_depth=0)
        a, b, c = trio.names
        try:
            nodes = await _start_summary_only(trio)
            await nodes[c].register(registration("fwd.revoked.c1", capability=CAPABILITY, lease_ttl_ms=600_000,
                                                 description="stamps notarised shipping manifests"))
            await _serving_in(trio, a, c)
            caller = nodes[a].token("app.caller.three", TokenRole.CALLER)
            lookup, query = "/v1/agents/fwd.revoked.c1", "/v1/search?q=notarised+shipping+manifests"

            # Through a, the caller reaches c's agent: by id, by search and by resolve.
            status, record = await nodes[a].call("GET", lookup, token=caller)
            assert status == 200 and record["region"] == c, record
            status, found = await nodes[a].call("GET", query, token=caller)
            assert status == 200 and "fwd.revoked.c1" in {hit["agent_id"] for hit in found["hits"]}, found
            status, ticket = await nodes[a].resolve(token=caller, capability=CAPABILITY)
            assert status == 200 and ticket["target"]["region"] == c, ticket

            # Revoked in c, where a has not heard of it yet: put on c's list as if another region had
            # sent it (its origin is not c, so c's relay does not pass it on), the window before a
            # revocation reaches every region (tests/federation/test_revocations.py).
            claims = token_claims_unverified(caller)
            done = await nodes[c].node.revocations.apply(claims.jti, until_ms=claims.exp * 1000, origin=b)
            assert done.new, done
            status, refused = await nodes[c].call("GET", lookup, token=caller)
            assert status == 401 and refused["error"] == "token_revoked", refused
            refusals = await _revoked_refusals(nodes[c])

            # Through a, c refuses it too: c's agent is neither shown, found nor routed to.
            status, answer = await nodes[a].call("GET", lookup, token=caller)
            assert status == 404, answer
            status, found = await nodes[a].call("GET", query, token=caller)
            assert status == 200 and "fwd.revoked.c1" not in {hit["agent_id"] for hit in found["hits"]}, found
            status, answer = await nodes[a].resolve(token=caller, capability=CAPABILITY)
            assert status != 200 and "revoked" in str(answer), answer
            assert await _revoked_refusals(nodes[c]) == refusals + 3
            status, _ = await nodes[a].call("GET", query, token=nodes[a].token("app.caller.four", TokenRole.CALLER))
            assert status == 200  # another caller's token is not affected

            # Revoked through c's API, it reaches a itself, which then refuses it at its own door.
            other = nodes[a].token("app.caller.five", TokenRole.CALLER)
            other_claims = token_claims_unverified(other)
            status, done = await nodes[c].call("POST", "/v1/admin/tokens/revoke",
                                               json={"jti": other_claims.jti, "exp": other_claims.exp})
            assert status == 200 and done["new"] and a in done["peers"], done

            async def refused_by_a() -> bool:
                status, _ = await nodes[a].call("GET", query, token=other)
                return status == 401

            await wait_for(refused_by_a, timeout_s=10, message="a refusing the token revoked in c")
        finally:
            await trio.aclose()


async def test_the_forwarded_token_names_the_caller_its_token_and_the_forwarding_region() -> None:
    """What a peer's node is sent: a token for the caller's subject and role, marked as forwarded
    by this region for the caller's own token id, lasting no longer than the caller's; a request
    that arrived forwarded, or an id that is no agent id, is not sent at all."""
    from federation.config import FederationConfig
    from federation.forward import Forwarder
    from node.core import PeerUnreachable, ValidationFailed

    seen: list[str] = []

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        seen.append(head)
        body = b'{"error": "unknown_agent", "message": "no such agent", "field": "agent_id"}'
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(peer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    config = FederationConfig(region="home", peers=[{"region": "far", "node_urls": [f"http://127.0.0.1:{port}"]}],
                              bootstrap_servers="127.0.0.1:1", forward_timeout_ms=2_000)
    signer = Signer(TEST_SECRET)
    now = int(time.time())
    caller = signer.verify(signer.issue("app.caller.five", TokenRole.CALLER, ttl_s=30))
    try:
        async with Forwarder(config, signer=signer) as forwarder:
            assert await forwarder.agent("far", "far.grp.a", caller) is None  # its 404 is an answer
            assert forwarder.unanswered == 0 and len(seen) == 1
            request_line, *headers = seen[0].split("\r\n")
            assert request_line == "GET /v1/agents/far.grp.a HTTP/1.1"
            token = next(line.split(" ", 2)[2] for line in headers if line.lower().startswith("authorization:"))
            sent = signer.verify(token)
            assert (sent.sub, sent.role) == (caller.sub, caller.role) and sent.jti != caller.jti
            assert sent.fwd is not None and (sent.fwd.region, sent.fwd.jti) == ("home", caller.jti)
            assert now < sent.exp <= caller.exp

            with pytest.raises(ValidationFailed) as refused:
                await forwarder.agent("far", "x/../far.grp.a", caller)
            assert refused.value.field == "agent_id"
            with pytest.raises(PeerUnreachable, match="arrived forwarded from region home"):
                await forwarder.agent("far", "far.grp.a", sent)
            assert isinstance(sent, TokenClaims) and len(seen) == 1  # neither was sent
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.unit
async def test_a_resolve_that_arrived_forwarded_never_draws_a_summary_only_region() -> None:
    """Even one not sent with scope=local: a peer's node answers from what it holds, or says why not."""
    from node.core import NoAgentAvailable
    from node.core.models import Forwarding, RouteRequest
    from node.routing.spill import ForwardTo
    from node.view import AgentIndex

    from ..helpers import CAPABILITY as SOME_CAPABILITY
    from ..helpers import Peer, make_router
    from .test_summary_parts import offered, view

    west = Peer("west", AgentIndex("west"), replicated=False, summary=view("west", offered(2, 200.0)))
    router, _, _ = make_router(peers=(west,))
    now = int(time.time())
    direct = TokenClaims(sub="app.caller.six", role=TokenRole.CALLER, iat=now, exp=now + 60, jti="callerjti01")
    forwarded = direct.model_copy(update={"fwd": Forwarding(region="east", jti="callerjti00")})
    request = RouteRequest(capability=SOME_CAPABILITY, scope="global")
    with pytest.raises(ForwardTo) as drawn:  # a caller's own resolve is sent there
        router.decide_exact(request, direct)
    assert drawn.value.region == "west"
    with pytest.raises(NoAgentAvailable) as refused:
        router.decide_exact(request, forwarded)
    assert "arrived forwarded from region east" in str(refused.value.details), refused.value.details
