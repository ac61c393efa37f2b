"""Cross-region propagation and reconvergence, measured on a real local cluster.

Runs the packaged three-region topology (``topology/local.toml``: us-east, us-west, eu-west)
with ``topology.launcher.LocalCluster`` — an embedded Redis per region, the embedded Kafka
broker, one node PROCESS per region on free ports — exactly what ``agent-reach up`` starts.

1. Propagation: an open-loop generator re-registers a pool of agents in us-east at a fixed
   rate (each re-registration is one change, a new version). eu-west's consumer stamps every
   change it commits to its replica with the wall-clock time (the replica feed in eu-west's
   Redis, ``…:fed:feed``; the leader applies the change in memory, where routing reads it, in
   the same step). Latency = committed in eu-west − just before the POST to us-east, so it
   includes the HTTP register, the Redis script, the publisher, Kafka, the consumer's fetch
   and commit; one clock, millisecond resolution. The stamps are read after each run, so
   observing costs the cluster nothing (a ``/v1/watch`` client at 1,000 events/s measures
   mostly its own stream). Reported at 100 and 1,000 changes/s (target: p99 ≤ 50 ms at 100/s).
2. Reconvergence after a broker restart: the broker is stopped (losing every topic and
   record), changes are made in two regions while it is down, then it is started again; the
   time until every region's replica of every peer has the peer's own live count and digest
   (``GET /v1/federation/status``) is reported, over several rounds.

Everything (three nodes, three redis-servers, the broker and this load generator) shares the
machine; ``--rates``, ``--seconds`` and ``--rounds`` change the runs. Prints only numbers.

Run from the repository root: ``make bench-federation`` or ``.venv/bin/python -m bench.federation``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from topology import load_topology
from topology.launcher import LocalCluster

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

    async def committed_in_observer(self, after_seq: int) -> dict[tuple[str, int], float]:
        """(agent_id, version) of SOURCE -> wall-clock ms its change was committed in OBSERVER."""
        redis_url = self.cluster.resolved.region(OBSERVER).redis_url
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        stamps: dict[tuple[str, int], float] = {}
        try:
            start = f"({after_seq}-0"
            while entries := await client.xrange(f"ar:{{{OBSERVER}}}:fed:feed", min=start, max="+", count=5_000):
                for entry_id, fields in entries:
                    if fields.get("peer") == SOURCE and fields.get("type") == "change":
                        stamps.setdefault((fields["agent_id"], int(fields["version"])), float(fields["at"]))
                start = f"({entry_id}"
        finally:
            await client.aclose()
        return stamps

    async def feed_position(self) -> int:
        redis_url = self.cluster.resolved.region(OBSERVER).redis_url
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            return int(await client.get(f"ar:{{{OBSERVER}}}:fed:feed:seq") or 0)
        finally:
            await client.aclose()

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
        feed_start = await self.feed_position()
        started = time.perf_counter()
        for n in range(count):
            due = started + n / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await in_flight.acquire()
            sent.append((time.time() * 1000, asyncio.ensure_future(register(n))))
        send_duration = time.perf_counter() - started
        keys = [(reply["agent_id"], reply["version"]) for reply in await asyncio.gather(*(t for _, t in sent))]
        deadline = time.perf_counter() + 10
        stamps = await self.committed_in_observer(feed_start)
        while any(key not in stamps for key in keys) and time.perf_counter() < deadline:
            await asyncio.sleep(0.1)
            stamps = await self.committed_in_observer(feed_start)
        latencies = [stamps[key] - at for (at, _), key in zip(sent, keys, strict=True) if key in stamps]
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
            await bench.propagation(50, 1)  # warm-up: connections, Lua scripts, caches
            for rate in args.rates:
                print(await bench.propagation(rate, args.seconds), flush=True)
            print(await bench.broker_restart(args.rounds, args.changes_while_down), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[100, 1_000], help="changes/s (default 100 1000)")
    parser.add_argument("--seconds", type=float, default=10, help="seconds per rate (default 10)")
    parser.add_argument("--rounds", type=int, default=5, help="broker restarts (default 5)")
    parser.add_argument("--changes-while-down", type=int, default=50, help="changes made while the broker is down")
    asyncio.run(main(parser.parse_args()))
