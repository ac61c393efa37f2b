"""Cross-region propagation and reconvergence, measured on a real local cluster.

Runs the packaged three-region topology (``topology/local.toml``: us-east, us-west, eu-west)
with ``topology.launcher.LocalCluster`` — an embedded Redis per region, the embedded Kafka
broker, one node PROCESS per region on free ports — exactly what ``agent-reach up`` starts.

1. Propagation: an open-loop generator re-registers a pool of agents in us-east at a fixed
   rate (each re-registration is one change, a new version) and a ``/v1/watch`` stream on
   eu-west timestamps the moment each (agent, version) is applied there — the moment routing
   in eu-west can use it. Latency = applied in eu-west − just before the POST to us-east, so it
   includes the HTTP register, the Redis script, the publisher, Kafka, the consumer's fetch
   and Redis commit. Reported at 100 and 1,000 changes/s (target: p99 ≤ 50 ms at 100/s).
2. Reconvergence after a broker restart: the broker is stopped (losing every topic and
   record), changes are made in two regions while it is down, then it is started again; the
   time until every region's replica of every peer has the peer's own live count and digest
   (``GET /v1/federation/status``) is reported, over several rounds.

Everything (three nodes, three redis-servers, the broker and this load generator) shares the
machine; ``--rates``, ``--seconds`` and ``--rounds`` change the runs. Prints only numbers.

Run: ``.venv/bin/python bench/federation.py``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from topology.launcher import LocalCluster  # noqa: E402
from topology.topology import load_topology  # noqa: E402

SECRET = b"bench-federation-secret-0123456789"
SOURCE, OBSERVER = "us-east", "eu-west"
POOL_SIZE = 500
MAX_IN_FLIGHT = 64
LEASE_MS = 600_000


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


class Bench:
    def __init__(self, cluster: LocalCluster, session: aiohttp.ClientSession) -> None:
        self.cluster = cluster
        self.session = session
        self.headers = {"Authorization": f"Bearer {cluster.admin_token()}"}
        self.applied: dict[tuple[str, int], float] = {}
        self.arrived = asyncio.Event()

    async def post(self, region: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(self.cluster.url(region) + path, json=body, headers=self.headers) as response:
            reply = await response.json()
            if response.status not in (200, 201):
                raise RuntimeError(f"{path} in {region}: {response.status} {reply}")
            return reply

    async def status(self, region: str) -> dict[str, Any]:
        async with self.session.get(self.cluster.url(region) + "/v1/federation/status",
                                    headers=self.headers) as response:
            return await response.json()

    async def converged(self) -> bool:
        statuses = {region: await self.status(region) for region in self.cluster.nodes}
        return all(view["digest"] == statuses[view["region"]]["digest"]
                   and view["agents"] == statuses[view["region"]]["live_count"]
                   for status in statuses.values() for view in status["peers"])

    async def wait(self, condition: Any, *, timeout_s: float, interval_s: float = 0.01) -> float:
        """Seconds until ``condition()`` holds (raises TimeoutError after ``timeout_s``)."""
        started = time.perf_counter()
        while not await condition():
            if time.perf_counter() - started > timeout_s:
                raise TimeoutError(f"not within {timeout_s} s")
            await asyncio.sleep(interval_s)
        return time.perf_counter() - started

    async def watch(self, ready: asyncio.Event) -> None:
        """Timestamp every change of SOURCE applied in OBSERVER (server-sent events)."""
        url = self.cluster.url(OBSERVER) + "/v1/watch?pattern=bench.*.*"
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with self.session.get(url, headers=self.headers, timeout=timeout) as response:
            event = None
            async for raw in response.content:
                now = time.perf_counter()
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                    if event == "hello":
                        ready.set()
                elif line.startswith("data: ") and event == "change":
                    change = json.loads(line[6:])
                    if change["region"] == SOURCE and change["kind"] != "delete":
                        self.applied.setdefault((change["agent_id"], change["version"]), now)
                        self.arrived.set()

    def registration(self, n: int) -> dict[str, Any]:
        agent = f"bench.prop.a{n % POOL_SIZE}"
        return {"agent_id": agent, "endpoints": {"primary": "http://127.0.0.1:9"}, "lease_ttl_ms": LEASE_MS,
                "capabilities": [{"name": "bench.propagate", "description": "benchmark agent"}]}

    async def propagation(self, rate: float, seconds: float) -> str:
        """Open loop: one change every 1/rate s regardless of how long each takes.

        At most ``MAX_IN_FLIGHT`` registrations are outstanding (the node's Redis pool holds
        100 connections); when the machine cannot keep up, the achieved rate says so.
        """
        sent: list[tuple[float, Awaitable[dict[str, Any]]]] = []
        in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)

        async def register(n: int) -> dict[str, Any]:
            try:
                return await self.post(SOURCE, "/v1/agents", self.registration(n))
            finally:
                in_flight.release()

        count = int(rate * seconds)
        started = time.perf_counter()
        for n in range(count):
            due = started + n / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await in_flight.acquire()
            sent.append((time.perf_counter(), asyncio.ensure_future(register(n))))
        send_duration = time.perf_counter() - started
        keys = [(reply["agent_id"], reply["version"]) for reply in await asyncio.gather(*(t for _, t in sent))]
        deadline = time.perf_counter() + 10
        while any(key not in self.applied for key in keys) and time.perf_counter() < deadline:
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), timeout=0.2)
        latencies = [(self.applied[key] - at) * 1000 for (at, _), key in zip(sent, keys) if key in self.applied]
        missing = len(keys) - len(latencies)
        achieved = count / send_duration
        return (f"propagation {SOURCE} -> {OBSERVER} at {rate:>6.0f} changes/s (achieved {achieved:.0f}/s, "
                f"n={len(latencies)}, missing={missing}): p50 {statistics.median(latencies):6.1f} ms  "
                f"p90 {percentile(latencies, 0.90):6.1f} ms  p99 {percentile(latencies, 0.99):6.1f} ms  "
                f"max {max(latencies):6.1f} ms")

    async def broker_restart(self, rounds: int, changes_while_down: int) -> str:
        kafka = self.cluster.kafka
        if kafka is None:
            raise RuntimeError("the topology names a Kafka cluster; the broker restart needs the embedded one")
        times = []
        for round_number in range(rounds):
            await self.wait(self.converged, timeout_s=30)
            await kafka.stop()
            regions = list(self.cluster.nodes)
            for n in range(changes_while_down):
                region = regions[n % 2]
                body = self.registration(10_000 + round_number * changes_while_down + n)
                body["agent_id"] = f"bench.down{region.replace('-', '')}.r{round_number}n{n}"
                await self.post(region, "/v1/agents", body)
            await kafka.start()
            times.append(await self.wait(self.converged, timeout_s=60) * 1000)
        return (f"broker restart (all data lost, {changes_while_down} changes in 2 regions while down), "
                f"{rounds} rounds: reconverged (equal digests everywhere) after p50 {statistics.median(times):.0f} ms, "
                f"max {max(times):.0f} ms")


async def main(args: argparse.Namespace) -> None:
    topology = load_topology()
    async with LocalCluster(topology, secret=SECRET, any_port=True, log_level="WARNING") as cluster:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30),
                                         connector=aiohttp.TCPConnector(limit=200)) as session:
            bench = Bench(cluster, session)
            print(f"cluster: {', '.join(cluster.nodes)} (3 node processes, 3 redis-servers, embedded Kafka), "
                  f"beacons every {topology.federation.beacon_interval_ms} ms", flush=True)
            await bench.wait(bench.converged, timeout_s=30)
            ready = asyncio.Event()
            watcher = asyncio.ensure_future(bench.watch(ready))
            try:
                await asyncio.wait_for(ready.wait(), timeout=10)
                await bench.propagation(50, 1)  # warm-up: connections, Lua scripts, JIT-less caches
                for rate in args.rates:
                    print(await bench.propagation(rate, args.seconds), flush=True)
            finally:
                watcher.cancel()
            print(await bench.broker_restart(args.rounds, args.changes_while_down), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[100, 1_000], help="changes/s (default 100 1000)")
    parser.add_argument("--seconds", type=float, default=10, help="seconds per rate (default 10)")
    parser.add_argument("--rounds", type=int, default=5, help="broker restarts (default 5)")
    parser.add_argument("--changes-while-down", type=int, default=50, help="changes made while the broker is down")
    asyncio.run(main(parser.parse_args()))
