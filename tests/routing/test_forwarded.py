"""Global search reaches summary-only regions: region a keeps only summaries of c, so a search
from a asks c's node (as the caller) and merges its hits; with c down it answers from what is
left and names c (``node.routing.SummaryOnlyLookups.search``)."""

from __future__ import annotations

import time

import pytest

from node.core.models import TokenRole
from topology.embedded import EmbeddedKafka

from ..helpers import registration, wait_for
from tests.federation.test_summaries import FORWARD_TIMEOUT_MS, Trio

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


async def test_a_global_search_asks_summary_only_regions_and_names_one_that_is_down(redis_url: str,
                                                                                   region: str) -> None:
    async with EmbeddedKafka() as kafka:
        trio = Trio(redis_url, region, kafka.bootstrap_servers, discovery=True)
        a, b, c = trio.names
        try:
            node_a, node_b, node_c = [await trio.start(name) for name in trio.names]
            here = await node_a.register(registration("find.near.a1", capability="text.translate",
                                                      description="translates short chat messages"))
            far = registration("find.far.c1", capability="contract.translate",
                               description="translates Chinese legal contracts into English")
            hidden = registration("find.far.c2", capability="contract.translate", allowed_callers=["ops.*.*"],
                                  description="translates Chinese legal contracts into English, for ops only")
            await node_c.register(far)
            await node_c.register(hidden)
            catalog_a = trio.federations[a].catalog
            await wait_for(lambda: catalog_a.peer(c).summary is not None, timeout_s=15, message="c's summary in a")
            assert len(catalog_a.peer(c).index) == 0  # summary-only: a cannot search c's records itself

            caller = node_a.token("app.reader.one", TokenRole.CALLER)
            status, found = await node_a.call("GET", "/v1/search?q=translate+chinese+contracts&k=5", token=caller)
            assert status == 200, found
            by_id = {hit["agent_id"]: hit for hit in found["hits"]}
            assert by_id["find.far.c1"]["region"] == c and by_id["find.far.c1"]["locality"] == "remote"
            assert found["hits"][0]["agent_id"] == "find.far.c1", found["hits"]
            assert "find.far.c2" not in by_id  # c applied its allowed_callers to the forwarded caller
            assert here["agent_id"] in by_id and found["unanswered"] == []
            status, local = await node_a.call("GET", "/v1/search?q=translate+chinese+contracts&scope=local",
                                              token=caller)
            assert status == 200 and {hit["region"] for hit in local["hits"]} == {a}

            await trio.stop(c)
            started = time.perf_counter()
            status, left = await node_a.call("GET", "/v1/search?q=translate+chinese+contracts", token=caller)
            elapsed = time.perf_counter() - started
            assert status == 200 and left["unanswered"] == [c], left
            assert {hit["region"] for hit in left["hits"]} == {a}
            assert elapsed < FORWARD_TIMEOUT_MS / 1000 + 1.0
            print(f"\nglobal search with c down: answered in {elapsed * 1000:.0f} ms, unanswered {left['unanswered']}")
        finally:
            await trio.aclose()


async def test_a_forwarded_ticket_addresses_the_agent_as_a_caller_in_another_region(redis_url: str,
                                                                                  region: str) -> None:
    async with EmbeddedKafka() as kafka:
        trio = Trio(redis_url, region, kafka.bootstrap_servers)
        a, b, c = trio.names
        try:
            node_a, _, node_c = [await trio.start(name) for name in trio.names]
            far = registration("find.far.c3", capability="far.only", lease_ttl_ms=600_000,
                               endpoints={"primary": "http://127.0.0.1:9101", "external": "http://127.0.0.1:9102"})
            await node_c.register(far)
            catalog_a = trio.federations[a].catalog
            await wait_for(lambda: catalog_a.peer(c).summary is not None
                           and catalog_a.peer(c).summary.serving_weight("far.only") > 0, timeout_s=15,
                           message="c's summary of far.only in a")
            status, ticket = await node_a.resolve(capability="far.only")
            assert status == 200 and ticket["target"]["region"] == c, ticket
            assert ticket["target"]["endpoint"] == "http://127.0.0.1:9102" and ticket["locality"] == "remote"
            status, home = await node_c.resolve(capability="far.only")  # in its own region: the primary
            assert status == 200 and home["target"]["endpoint"] == "http://127.0.0.1:9101", home
        finally:
            await trio.aclose()


async def test_a_peer_that_hangs_is_not_asked_again_until_its_pause_ends() -> None:
    """A summary-only peer whose node accepts connections and never answers costs the deadline
    once; for ``forward_backoff_ms`` after that its lookups fail over at once, then it is tried again."""
    import asyncio

    from federation.config import FederationConfig
    from federation.forward import Forwarder
    from node.core import PeerUnreachable
    from node.core.models import TokenClaims
    from node.trust import Signer

    connections: list[asyncio.StreamWriter] = []
    answering = False

    async def node(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while True:  # one request after another on the connection
            await reader.readuntil(b"\r\n\r\n")
            if not answering:
                await asyncio.Event().wait()  # hangs: never refuses, never answers
            body = b'{"error": "unknown_agent", "message": "no such agent"}'
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()

    server = await asyncio.start_server(node, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    now = [1_000.0]
    config = FederationConfig(region="home", peers=[{"region": "far", "node_urls": [f"http://127.0.0.1:{port}"]}],
                              bootstrap_servers="127.0.0.1:1", forward_timeout_ms=200, forward_backoff_ms=5_000)
    caller = TokenClaims(sub="ops.caller.x", role=TokenRole.CALLER, iat=int(time.time()), exp=int(time.time()) + 60)
    try:
        async with Forwarder(config, signer=Signer(b"test-secret-0123456789abcdef"), clock=lambda: now[0]) as forwarder:
            with pytest.raises(PeerUnreachable, match="no answer within 200 ms"):
                await forwarder.agent("far", "far.grp.a", caller)
            assert len(connections) == 1 and forwarder.unanswered == 1

            now[0] += 4.9  # within the pause: failed over at once, the node not asked
            with pytest.raises(PeerUnreachable, match="asked again in 0.1 s"):
                await forwarder.agent("far", "far.grp.a", caller)
            assert len(connections) == 1 and forwarder.skipped == 1

            now[0] += 0.2  # the pause is over: asked again, and an answer ends the pause for good
            answering = True
            assert await forwarder.agent("far", "far.grp.a", caller) is None  # its 404: no such agent
            assert len(connections) == 2
            now[0] += 0.1
            assert await forwarder.agent("far", "far.grp.a", caller) is None
            assert forwarder.skipped == 1 and forwarder.unanswered == 1
    finally:
        for writer in connections:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_peer_s_answer_that_arrives_in_pieces_is_read_whole() -> None:
    """``content.read(limit)`` returned what had arrived so far: a forwarded answer sent in two
    writes came back cut, and a good record read as 'answered no agent record'."""
    import asyncio

    import orjson

    from federation.config import FederationConfig
    from federation.forward import Forwarder
    from node.core.models import TokenClaims
    from node.trust import Signer

    from ..helpers import registration

    record = orjson.dumps({**registration("far.grp.a", capability="far.only"), "region": "far", "version": 3,
                           "lease_expires_at_ms": 2**40})

    async def node(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(record)).encode() + b"\r\n\r\n" + record[:100])
        await writer.drain()
        await asyncio.sleep(0.05)  # the rest a moment later, as a long answer arrives
        writer.write(record[100:])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(node, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    config = FederationConfig(region="home", peers=[{"region": "far", "node_urls": [f"http://127.0.0.1:{port}"]}],
                              bootstrap_servers="127.0.0.1:1", forward_timeout_ms=2_000)
    caller = TokenClaims(sub="ops.caller.x", role=TokenRole.CALLER, iat=int(time.time()), exp=int(time.time()) + 60)
    try:
        async with Forwarder(config, signer=Signer(b"test-secret-0123456789abcdef")) as forwarder:
            found = await forwarder.agent("far", "far.grp.a", caller)
        assert found is not None and found.agent_id == "far.grp.a" and found.version == 3
    finally:
        server.close()
        await server.wait_closed()
