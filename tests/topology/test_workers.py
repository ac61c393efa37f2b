"""``agent-reach node --workers N``: N processes on one port sharing the region's Redis."""

from __future__ import annotations

import os
import signal

import aiohttp
import pytest
import redis.asyncio as aioredis

from node.core.models import TokenRole
from node.trust import Signer
from topology.cli.workers import child_argv, workers_problem

from ..helpers import (alive, both_workers_answer, descendants, free_port, registration, start_workers, terminate,
                       wait_for)

SECRET = "workers-test-secret-0123456789abcdef"


async def test_two_workers_share_a_port_and_a_region(redis_url: str, region: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    parent = start_workers(redis_url, region, port, "--egress-allow", "loopback", secret=SECRET)
    try:
        await wait_for(lambda: both_workers_answer(url), timeout_s=60, message="both workers to answer on the one port")
        admin = Signer(SECRET.encode()).issue("admin", TokenRole.ADMIN, ttl_s=600)
        headers = {"Authorization": f"Bearer {admin}"}
        async with aiohttp.ClientSession(headers=headers) as session:
            async with session.post(f"{url}/v1/agents", json=registration("wrk.grp.a1")) as response:
                assert response.status == 201, await response.text()

        async def every_worker_routes() -> bool:  # each worker's cache tails the region's stream
            for _ in range(10):
                async with aiohttp.ClientSession(headers=headers,
                                                 connector=aiohttp.TCPConnector(force_close=True)) as session:
                    async with session.post(f"{url}/v1/resolve", json={"capability": "translate.text"}) as response:
                        if response.status != 200:
                            return False
            return True

        await wait_for(every_worker_routes, message="the agent to be routable through both workers")

        # A worker that dies is replaced; the port keeps answering meanwhile.
        workers = sorted(descendants(parent.pid))
        assert len(workers) >= 2
        victim = workers[0]
        os.kill(victim, signal.SIGKILL)
        await wait_for(lambda: not alive(victim), message="the killed worker to go")
        await wait_for(lambda: both_workers_answer(url), timeout_s=60, message="a replacement worker to answer")
    finally:
        terminate(parent)
    errors = parent.stderr.read().decode() if parent.stderr else ""
    assert parent.returncode == 0, errors
    assert "starting another" in errors


async def test_two_workers_spend_one_rate_budget(redis_url: str, region: str) -> None:
    """A caller's budget is the region's, not each process's: requests spread over both workers on
    fresh connections are admitted about one burst in all (each worker held a burst of its own before)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    parent = start_workers(redis_url, region, port, secret=SECRET, env={
        "AGENT_REACH_RATE_LIMIT_RPS": "0.01", "AGENT_REACH_RATE_LIMIT_BURST": "20",
        "AGENT_REACH_RATE_LIMIT_SYNC_INTERVAL_MS": "20"})
    try:
        await wait_for(lambda: both_workers_answer(url), timeout_s=60, message="both workers to answer on the one port")
        caller = Signer(SECRET.encode()).issue("app.spread.caller", TokenRole.CALLER, ttl_s=600)
        admitted: dict[str, int] = {}
        refused = 0
        for _ in range(100):  # bounded: one at a time, each on a new connection (either worker)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                async with session.get(f"{url}/v1/regions", headers={"Authorization": f"Bearer {caller}"}) as answer:
                    if answer.status == 429:
                        refused += 1
                        continue
                    assert answer.status == 200, await answer.text()
                    node_id = (await answer.json())["node_id"]
                    admitted[node_id] = admitted.get(node_id, 0) + 1
        print(f"\nadmitted by worker {sorted(admitted.values())}, refused {refused}")
        assert len(admitted) == 2, admitted  # both workers admitted some
        # Within a sync interval each worker may admit from its own bucket (at most a burst each, once):
        # how many that is depends on how fast the syncs run on a loaded machine, so it is bounded, and
        # what holds for certain is that the region's one bucket counted every admission of both.
        assert 20 <= sum(admitted.values()) <= 40 and refused >= 60, (admitted, refused)
        redis = aioredis.from_url(redis_url)
        try:
            async def region_counted() -> bool:
                keys = [key async for key in redis.scan_iter(match="*:rate:caller:app.spread.caller")]
                if len(keys) != 1:
                    return False
                level = float(await redis.hget(keys[0], "t") or "nan")
                return abs(level - (20 - sum(admitted.values()))) < 1  # the refill at 0.01/s is below one

            await wait_for(region_counted, timeout_s=10, message="the region's bucket to count both workers' spending")
        finally:
            await redis.aclose()
    finally:
        terminate(parent)


@pytest.mark.unit
def test_workers_need_a_shared_redis_and_a_fixed_port() -> None:
    assert workers_problem(workers=1, redis_url=None, port=0) is None
    assert "Redis by URL" in workers_problem(workers=2, redis_url=None, port=7101)
    assert "fixed port" in workers_problem(workers=2, redis_url="redis://127.0.0.1:1", port=0)
    assert "at least 1" in workers_problem(workers=0, redis_url=None, port=1)
    assert child_argv(["--log-level", "INFO", "node", "--workers", "3", "--region", "r"]) == [
        "--log-level", "INFO", "node", "--region", "r", "--workers", "1", "--reuse-port"]
    assert child_argv(["node", "--workers=3"]) == ["node", "--workers", "1", "--reuse-port"]
