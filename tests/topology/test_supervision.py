"""Supervision under a LocalCluster: a killed node, redis-server or broker comes back on its own
while the other regions keep answering; a deliberate stop stays stopped; a node that keeps
crashing at start is retried with growing waits, never in a tight loop."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from topology import Topology
from topology.embedded import EmbeddedState
from topology.launcher import LocalCluster, RestartPolicy

from ..helpers import registration, wait_for

pytestmark = pytest.mark.timeout(240)

SECRET = b"supervision-test-secret-0123456789"
OUTAGE_DEADLINE_S = 45.0
POLL_INTERVAL_S = 0.02


def three_regions(name: str = "supervision-test") -> Topology:
    node_url = "http://127.0.0.1:1"  # replaced by free ports (any_port)
    return Topology.model_validate({
        "name": name,
        "federation": {"beacon_interval_ms": 200, "stale_after_ms": 1_500, "anti_entropy_min_interval_ms": 200},
        "node": {"sweep_interval_ms": 200, "leader_ttl_ms": 1_000, "lease_sync_interval_ms": 200,
                 "semantic_enabled": False},
        "regions": [{"name": region, "node_urls": [f"{node_url}{n}"]}
                    for n, region in enumerate(("sa", "sb", "sc"))],
    })


# Never dialled (no probes); a documentation address, which no egress policy treats as loopback
# or private.
UNCONTACTED_ENDPOINT = "http://192.0.2.10:9"


class Probe:
    """HTTP to the cluster's nodes with an admin token."""

    def __init__(self, cluster: LocalCluster, session: aiohttp.ClientSession) -> None:
        self.cluster = cluster
        self.session = session
        self.headers = {"Authorization": f"Bearer {cluster.admin_token()}"}

    async def status(self, region: str, path: str) -> int:
        try:
            async with self.session.get(self.cluster.url(region) + path, headers=self.headers) as response:
                await response.read()
                return response.status
        except (aiohttp.ClientError, TimeoutError, OSError):
            return 0

    async def call(self, region: str, method: str, path: str, json: Any = None) -> tuple[int, Any]:
        async with self.session.request(method, self.cluster.url(region) + path, json=json,
                                        headers=self.headers) as response:
            return response.status, await response.json(content_type=None)

    async def through_outage(self, others: list[str], back: Callable[[], Awaitable[bool]], *,
                             what: str) -> tuple[float, int]:
        """Poll the other regions' /healthz (each must answer 200 every time) until ``back()``.

        Returns the seconds it took and how many health polls passed meanwhile.
        """
        started = time.monotonic()
        polls = 0
        while True:
            for region in others:
                status = await self.status(region, "/healthz")
                assert status == 200, f"region {region} stopped answering /healthz ({status}) while {what}"
                polls += 1
            if await back():
                return time.monotonic() - started, polls
            assert time.monotonic() - started < OUTAGE_DEADLINE_S, f"not back within {OUTAGE_DEADLINE_S} s: {what}"
            await asyncio.sleep(POLL_INTERVAL_S)


async def stored_record(redis_url: str, agent_id: str) -> bytes | None:
    """The agent's record as its region's Redis holds it (in the region's ``…:agents`` hash)."""
    client = aioredis.from_url(redis_url)
    try:
        async for key in client.scan_iter(match="*:agents"):
            value = await client.hget(key, agent_id)
            if value is not None:
                return value
        return None
    finally:
        await client.aclose()


def reaped(pid: int) -> bool:
    """Gone from the process table: neither running nor a zombie waiting for its parent."""
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture
async def probe() -> AsyncIterator[tuple[Probe, list[str]]]:
    said: list[str] = []
    async with LocalCluster(three_regions(), secret=SECRET, any_port=True, log_level="WARNING",
                            say=said.append) as cluster:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            yield Probe(cluster, session), said


async def test_killed_node_redis_and_broker_come_back_while_the_others_serve(probe: tuple[Probe, list[str]]) -> None:
    probe_, said = probe
    cluster = probe_.cluster

    # -- a node ------------------------------------------------------------------------------
    node = cluster.nodes["sa"]
    old_pid = node.pid
    assert old_pid is not None
    os.kill(old_pid, signal.SIGKILL)
    killed = time.monotonic()
    saw_down = False

    async def node_back() -> bool:
        nonlocal saw_down
        status = await probe_.status("sa", "/readyz")
        saw_down = saw_down or status != 200
        return saw_down and status == 200 and node.pid not in (None, old_pid)

    took_s, polls = await probe_.through_outage(["sb", "sc"], node_back, what="the node of sa was down")
    print(f"\nnode sa killed -> /readyz 200 again after {took_s:.2f} s ({polls} healthy polls of sb, sc meanwhile)")
    assert reaped(old_pid), "the killed node was left a zombie"
    await wait_for(lambda: node.restarts == 1, timeout_s=5, message="the supervisor to count the restart")
    assert any(line.startswith(f"the node of region sa: pid {old_pid} was killed by SIGKILL; restarting it in")
               for line in said), said

    # -- a redis-server (its data comes back with it) -----------------------------------------
    agent = "sup.kept.after_redis_kill"
    status, reply = await probe_.call("sb", "POST", "/v1/agents",
                                      registration(agent, capability="sup.kept", lease_ttl_ms=120_000,
                                                   endpoint=UNCONTACTED_ENDPOINT))
    assert status == 201, reply
    server = cluster.redis["sb"]
    stored_before = await stored_record(server.url, agent)
    assert stored_before is not None, "the registration left no record in sb's Redis"
    old_redis_pid = server.pid
    assert old_redis_pid is not None
    os.kill(old_redis_pid, signal.SIGKILL)
    readiness: list[int] = []

    async def redis_back() -> bool:
        status = await probe_.status("sb", "/readyz")
        if not readiness or readiness[-1] != status:
            readiness.append(status)
        return 503 in readiness and status == 200 and server.pid not in (None, old_redis_pid)

    took_s, polls = await probe_.through_outage(["sa", "sc"], redis_back, what="the Redis of sb was down")
    print(f"redis of sb killed -> node sb /readyz {' -> '.join(map(str, readiness))} after {took_s:.2f} s")
    assert reaped(old_redis_pid)
    assert await stored_record(server.url, agent) == stored_before, "the restarted Redis lost its data"
    status, record = await probe_.call("sb", "GET", f"/v1/agents/{agent}")
    assert status == 200 and record["agent_id"] == agent

    # -- the broker (federation recovers through it) ------------------------------------------
    broker = cluster.kafka
    assert broker is not None
    old_broker_pid, address = broker.pid, broker.bootstrap_servers
    assert old_broker_pid is not None
    os.kill(old_broker_pid, signal.SIGKILL)

    async def broker_back() -> bool:
        return broker.state is EmbeddedState.RUNNING and broker.pid not in (None, old_broker_pid)

    took_s, _ = await probe_.through_outage(["sa", "sb", "sc"], broker_back, what="the broker was down")
    assert reaped(old_broker_pid) and broker.bootstrap_servers == address
    federated = "sup.after.broker_kill"
    restarted = time.monotonic()
    status, reply = await probe_.call("sa", "POST", "/v1/agents",
                                      registration(federated, capability="sup.after", lease_ttl_ms=120_000,
                                                   endpoint=UNCONTACTED_ENDPOINT))
    assert status == 201, reply

    async def visible_in_sc() -> bool:
        status, _ = await probe_.call("sc", "GET", f"/v1/agents/{federated}")
        return status == 200

    await wait_for(visible_in_sc, timeout_s=OUTAGE_DEADLINE_S, interval_s=0.05,
                   message="a registration in sa to reach sc through the restarted broker")
    print(f"broker killed -> back after {took_s:.2f} s; a new registration in sa reached sc "
          f"{time.monotonic() - restarted:.2f} s after that")

    # -- a deliberate stop is not undone -----------------------------------------------------
    await cluster.stop_node("sc")
    assert not cluster.nodes["sc"].running
    window_end = time.monotonic() + 3 * cluster.supervisor.policy.initial_backoff_s
    while time.monotonic() < window_end:  # a restart would come within one backoff
        assert not cluster.nodes["sc"].running, "a deliberately stopped node was restarted"
        await asyncio.sleep(POLL_INTERVAL_S)
    assert not any("region sc" in line for line in said), said
    await cluster.start_node("sc")
    assert await probe_.status("sc", "/readyz") == 200
    print(f"killed in total: 3 children, {time.monotonic() - killed:.1f} s; supervisor said:\n  " + "\n  ".join(said))


async def test_node_that_keeps_crashing_at_start_is_retried_with_backoff() -> None:
    said: list[str] = []
    policy = RestartPolicy(initial_backoff_s=0.2, max_backoff_s=0.8, stable_after_s=30)
    topology = Topology.model_validate({
        "name": "crash-loop-test", "node": {"semantic_enabled": False},
        "regions": [{"name": "solo", "node_urls": ["http://127.0.0.1:1"]}],
    })
    async with LocalCluster(topology, secret=SECRET, any_port=True, log_level="WARNING", say=said.append,
                            restart_policy=policy) as cluster:
        node = cluster.nodes["solo"]
        port = int(node.url.rsplit(":", 1)[1])
        old_pid = node.pid
        assert old_pid is not None
        with socket.socket() as squatter:
            os.kill(old_pid, signal.SIGKILL)
            # The port is free once the killed process is gone; then hold it so every restart fails.
            deadline = time.monotonic() + 10

            def bound() -> bool:
                try:
                    squatter.bind(("127.0.0.1", port))
                except OSError:
                    return False
                return True

            while not bound():
                assert time.monotonic() < deadline, "the killed node's port never became free"
                await asyncio.sleep(0.005)
            squatter.listen()
            squatted = time.monotonic()

            def failed_starts() -> list[str]:
                return [line for line in said if "did not start again" in line]

            await wait_for(lambda: len(failed_starts()) >= 3, timeout_s=60, interval_s=0.05,
                           message="three failed restarts")
            loop_s = time.monotonic() - squatted
        # Port free again: the next try succeeds.
        await wait_for(lambda: any(line.startswith("the node of region solo is back") for line in said),
                       timeout_s=60, interval_s=0.05, message="the node back once its port is free")
        assert node.running and node.pid != old_pid
    failures = failed_starts()
    print(f"\ncrash loop: {len(failures)} failed restarts in {loop_s:.1f} s; supervisor said:\n  " + "\n  ".join(said))
    assert "in use" in failures[0], failures[0]  # the node's own reason, in the one line
    waits = [float(line.rsplit("next try in ", 1)[1].split()[0]) for line in failures]
    assert waits[:3] == [0.4, 0.8, 0.8], waits  # doubling from 0.2 s, capped at 0.8 s
    log_quotes = [line for line in said if line.startswith("the node of region solo: the last lines of its log:")]
    assert len(log_quotes) == 1, f"the log tail should be quoted once per streak: {said}"


async def test_a_cluster_data_dir_keeps_registrations_across_runs_and_admits_one_cluster(tmp_path: Path) -> None:
    from topology.embedded import DataDirError

    topology = Topology.model_validate({
        "name": "data-dir-test", "node": {"semantic_enabled": False},
        "regions": [{"name": "kept", "node_urls": ["http://127.0.0.1:1"]}],
    })
    data_dir = tmp_path / "cluster-data"
    body = registration("keep.across.runs", capability="keep.across", lease_ttl_ms=120_000,
                        endpoint=UNCONTACTED_ENDPOINT)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        async with LocalCluster(topology, secret=SECRET, any_port=True, log_level="WARNING",
                                data_dir=data_dir) as first:
            probe_ = Probe(first, session)
            status, reply = await probe_.call("kept", "POST", "/v1/agents", body)
            assert status == 201, reply
            status, before = await probe_.call("kept", "GET", "/v1/agents/keep.across.runs")
            with pytest.raises(DataDirError, match="in use by another agent-reach process"):
                async with LocalCluster(topology, secret=SECRET, any_port=True, data_dir=data_dir):
                    pass
        assert (data_dir / "kept" / "redis" / "appendonly.aof").exists()
        async with LocalCluster(topology, secret=SECRET, any_port=True, log_level="WARNING",
                                data_dir=data_dir) as second:
            status, after = await Probe(second, session).call("kept", "GET", "/v1/agents/keep.across.runs")
    assert status == 200, after
    assert (after["version"], after["registered_at_ms"]) == (before["version"], before["registered_at_ms"])
