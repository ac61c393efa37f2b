"""A region's Redis goes away and comes back empty: the node keeps routing from memory, refuses
writes with a clear 503, and heals by itself when Redis returns."""

from __future__ import annotations

from node.config import NodeConfig
from node.service import RegistryNode
from topology.embedded import EmbeddedRedis

from ..conftest import TEST_SECRET
from ..helpers import registration, start_node, wait_for


async def test_redis_outage_and_data_loss() -> None:
    async with EmbeddedRedis() as redis:
        node = await start_node(RegistryNode(NodeConfig(region="outage", redis_url=redis.url, port=0,
                                                        lease_sync_interval_ms=100, sweep_interval_ms=100,
                                                        egress={"allow": ["loopback"]}),
                                             secret=TEST_SECRET))
        try:
            await node.register(registration("lang.translate.o1", lease_ttl_ms=60_000))
            assert (await node.call("GET", "/readyz"))[0] == 200
            await redis.stop()

            # Not ready while Redis is gone (a load balancer sends writes elsewhere), reads go on.
            async def unready() -> bool:
                status, body = await node.call("GET", "/readyz")
                return status == 503 and body["store"] == "disconnected"

            await wait_for(unready, timeout_s=10, message="/readyz 503 while Redis is gone")

            # Routing reads memory only: it does not notice the outage.
            for _ in range(20):
                status, ticket = await node.resolve(capability="translate.text")
                assert status == 200 and ticket["target"]["agent_id"] == "lang.translate.o1"
            # Writes need Redis: a clear 503, not a crash.
            status, body = await node.call("POST", "/v1/agents", json=registration("lang.translate.o2"))
            assert status == 503 and body["error"] == "store_unavailable", body
            status, body = await node.call("PUT", "/v1/agents/lang.translate.o1/heartbeat", json={})
            assert status == 503 and body["error"] == "store_unavailable", body
            assert (await node.call("GET", "/healthz"))[0] == 200
            status, body = await node.call("GET", "/v1/watch?since=0")  # a replay needs Redis: a clean 503
            assert status == 503 and body["error"] == "store_unavailable", body

            # Redis comes back on the same port, empty (it forgot everything): the cache notices the
            # version went backwards and reloads; the agent's next heartbeat says register again.
            await redis.start()
            await wait_for(lambda: _status(node, "translate.text", 404), timeout_s=10, message="cache reloaded")
            await wait_for(lambda: _ready(node), timeout_s=10, message="/readyz 200 once Redis answers")
            status, body = await node.call("PUT", "/v1/agents/lang.translate.o1/heartbeat", json={})
            assert status == 404 and body["error"] == "unknown_agent", body
            await node.register(registration("lang.translate.o1", lease_ttl_ms=60_000))
            assert await _status(node, "translate.text", 200)
        finally:
            await node.aclose()


async def _status(node, capability: str, expected: int) -> bool:
    status, _ = await node.resolve(capability=capability)
    return status == expected


async def _ready(node) -> bool:
    return (await node.call("GET", "/readyz"))[0] == 200
