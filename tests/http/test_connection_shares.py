"""Fair shares of the node's connections (``node.http.connections``): a hostile client cannot lock
the others out by holding sockets.

The hostile connections come from other loopback addresses (127.0.0.2 …) and the victim works
from 127.0.0.1: an agent with a short lease heartbeating and a caller resolving, each on fresh
connections, while the hostile client holds the node's whole cap of idle keep-alive connections
— the attack that, before shares, reset every other client and let the victim's lease lapse.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import aiohttp
import pytest

from node.core.models import TokenRole
from node.http import bound_port

from ..conftest import NodeFactory
from ..helpers import RunningNode, registration, wait_for
from .test_hygiene import HEALTHZ, close, read_response, request

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

HOSTILE_SOURCES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
VICTIM_ROUNDS = 40  # bounded: each round is one heartbeat and one resolve


async def _connect_from(node: RunningNode, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", bound_port(node.runner), local_addr=(source, 0))


async def _hold(node: RunningNode, source: str, count: int) -> list:
    """``count`` connections from ``source``, each having sent one request and idling (keep-alive)."""
    held = []
    for _ in range(count):
        connection = await _connect_from(node, source)
        try:
            await request(connection, HEALTHZ)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # a later one of its own took its place: the hostile client pays, nobody else
        held.append(connection)
    return held


async def _victim_rounds(node: RunningNode, agent_id: str, agent_token: str, caller_token: str) -> list[float]:
    """Heartbeats and resolves from 127.0.0.1, each on a new connection; their latencies (ms)."""
    url = f"http://127.0.0.1:{bound_port(node.runner)}"
    took = []
    for _ in range(VICTIM_ROUNDS):
        for method, path, token, body in (
                ("PUT", f"/v1/agents/{agent_id}/heartbeat", agent_token, {}),
                ("POST", "/v1/resolve", caller_token, {"capability": "share.victim"})):
            started = time.perf_counter()
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                async with session.request(method, url + path, json=body,
                                           headers={"Authorization": f"Bearer {token}"}) as response:
                    assert response.status == 200, (path, response.status, await response.text())
            took.append((time.perf_counter() - started) * 1000)
    return took


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def test_a_client_holding_the_whole_cap_of_idle_connections_locks_nobody_out(
        node_factory: NodeFactory) -> None:
    node = await node_factory()  # the default caps: 1,000 connections, 250 per source address
    cap, share = node.node.config.max_connections, node.node.config.max_connections_per_source
    assert (cap, share) == (1_000, 250)
    agent_id = "share.victim.one"
    await node.register(registration(agent_id, capability="share.victim", lease_ttl_ms=3_000))
    agent_token, caller = node.token(agent_id), node.token("app.share.caller", TokenRole.CALLER)
    unloaded = await _victim_rounds(node, agent_id, agent_token, caller)

    # The agent keeps heartbeating (every 500 ms, each on a new connection) while the attack
    # builds up and runs: a refused heartbeat fails the test, a lapsed lease too.
    stop = asyncio.Event()
    beats: list[float] = []

    async def keep_beating() -> None:
        url = f"http://127.0.0.1:{bound_port(node.runner)}/v1/agents/{agent_id}/heartbeat"
        for _ in range(240):  # bounded: 2 minutes at the most
            started = time.perf_counter()
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                async with session.put(url, json={}, headers={"Authorization": f"Bearer {agent_token}"}) as response:
                    assert response.status == 200, (response.status, await response.text())
            beats.append((time.perf_counter() - started) * 1000)
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
                return
            except TimeoutError:
                pass

    held = []
    beating = asyncio.create_task(keep_beating())
    try:
        for source in HOSTILE_SOURCES:  # 4 × 250: the whole cap, every one idle on keep-alive
            held += await _hold(node, source, share + 10)  # 10 more each: they replace its own
        await wait_for(lambda: node.runner.server.open_connections >= cap - 5, timeout_s=10,  # type: ignore[union-attr]
                       message="the hostile client holding the cap")
        attacked = await _victim_rounds(node, agent_id, agent_token, caller)
        status, record = await node.call("GET", f"/v1/agents/{agent_id}")
        assert status == 200 and record["agent_id"] == agent_id, record  # the 3 s lease held throughout
    finally:
        stop.set()
        await beating
        for connection in held:
            await close(connection)
    print(f"\nvictim on new connections, unloaded: p50 {statistics.median(unloaded):.1f} ms, p99 "
          f"{_p99(unloaded):.1f} ms; with {len(held)} hostile connections from {len(HOSTILE_SOURCES)} addresses: "
          f"p50 {statistics.median(attacked):.1f} ms, p99 {_p99(attacked):.1f} ms "
          f"({2 * VICTIM_ROUNDS} requests each, all answered 200); {len(beats)} heartbeats meanwhile, "
          f"p99 {_p99(beats):.1f} ms")


async def test_one_address_gets_its_share_and_no_more_when_its_connections_are_busy(
        node_factory: NodeFactory) -> None:
    node = await node_factory(max_connections=40, max_connections_per_source=10, header_read_timeout_ms=20_000)
    busy = []
    try:
        for _ in range(12):  # each in the middle of a request head: busy, none idle
            connection = await _connect_from(node, "127.0.0.2")
            connection[1].write(b"GET /healthz HTTP/1.1\r\n")
            busy.append(connection)
        refused = []
        for reader, _ in busy[10:]:
            status, _, body = await read_response(reader)
            refused.append((status, body))
        assert all(status == 503 and b"share of 10 connections" in body for status, body in refused), refused
        status, body = await node.call("GET", "/healthz")  # another address is served
        assert status == 200 and body["status"] == "ok"
        for _, writer in busy[:10]:  # the ten admitted finish their requests
            writer.write(b"Host: node\r\n\r\n")
        for reader, _ in busy[:10]:
            assert (await read_response(reader))[0] == 200
    finally:
        for connection in busy:
            await close(connection)


async def test_one_token_gets_its_share_of_connections_from_any_address(node_factory: NodeFactory) -> None:
    # Behind a load balancer every connection has its address: no share per source, one per token.
    node = await node_factory(max_connections=100, max_connections_per_source=0, max_connections_per_token=10,
                              watch_streams_per_caller=20)
    hog, other = node.token("app.conn.hog", TokenRole.CALLER), node.token("app.conn.other", TokenRole.CALLER)
    server = node.runner.server
    url = f"http://127.0.0.1:{bound_port(node.runner)}"
    streams = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    held = []
    try:
        for _ in range(10):  # ten busy connections of the token: watch streams
            response = await streams.get(url + "/v1/watch", headers={"Authorization": f"Bearer {hog}"})
            assert response.status == 200
            held.append(response)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
            async with fresh.get(url + "/v1/regions", headers={"Authorization": f"Bearer {hog}"}) as refused:
                body = await refused.json()
                assert refused.status == 503 and body["error"] == "too_many_connections", body
                assert "share of 10 connections" in body["message"] and refused.headers["Retry-After"] == "1"
            async with fresh.get(url + "/v1/regions", headers={"Authorization": f"Bearer {other}"}) as served:
                assert served.status == 200
    finally:
        for response in held:
            response.close()
        await streams.close()
    await wait_for(lambda: len(server.table) == 0, message="the streams closed")  # type: ignore[union-attr]

    # Idle keep-alive connections of the token make room instead: the oldest is closed.
    together = asyncio.Barrier(10)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as pooled:
        async def regions() -> int:
            async with pooled.get(url + "/v1/regions", headers={"Authorization": f"Bearer {hog}"}) as response:
                await together.wait()  # each holds its connection until all ten are open
                return response.status
        assert await asyncio.gather(*(regions() for _ in range(10))) == [200] * 10
        evicted = server.table.evicted  # type: ignore[union-attr]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as fresh:
            async with fresh.get(url + "/v1/regions", headers={"Authorization": f"Bearer {hog}"}) as response:
                assert response.status == 200
        assert server.table.evicted == evicted + 1  # type: ignore[union-attr]
