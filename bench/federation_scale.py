"""N regions under heartbeat load: what crosses a region, how fast registrations travel, how remote
routing spreads calls across regions by capacity.

Runs ``topology.launcher.LocalCluster`` over a generated topology of N regions (``r01`` … ``rNN``,
each preferring the next ones in ring order): one embedded Redis per region, the one embedded
Kafka broker, one node PROCESS per region — what ``agent-reach up`` starts. Then:

1. **Fleet.** ``--agents`` agents per region register over HTTP (``--capabilities`` capabilities,
   weight 100, ``max_concurrency`` 10, a lease of ``--lease-s``, 600 s by default so that no
   agent expires while the rest register on a slow machine: an expiry would be a change too).
2. **Heartbeats.** Every agent heartbeats every ``--heartbeat-s`` with a load that changes (a
   random inflight count; nine heartbeats in ten carry a different one), open loop, at most
   ``--in-flight`` requests outstanding; one heartbeat period of warm-up, then ``--seconds`` of
   steady state measured.
3. **What crosses a region** in that window: each node's ``agent_reach_federation_consumer_applied``
   (peer changes applied to its replicas) and ``…_published`` (its changes sent), read from
   ``/metrics``; and every federation topic's records and bytes per second (the records whose
   timestamp falls in the window), by kind: ``changes``, ``beacons``, ``summaries``.
4. **Registration propagation** while the heartbeats run: ``--registrations`` new agents
   registered in ``r01`` at ``--registration-rate`` per second; each peer's consumer stamps
   every change it commits to its replica with the wall-clock time (its replica feed,
   ``…:fed:feed``), so latency = committed there − just before the POST (one clock, ms). Peers
   that keep only summaries of ``r01`` (``--replicate-depth``) hold no record and are skipped.
5. **Remote spread.** A capability nobody in ``r01`` offers, served in ``r02`` by
   ``--spill-agents`` agents and in ``r03`` by half as many (capacity 2 : 1); ``--calls``
   resolves from ``r01`` in each of ``--rounds`` rounds, counted by the target's region.

``--before-tree DIR`` first runs the same measurement on another checkout (the nodes and this
script's imports come from ``PYTHONPATH=DIR``; e.g. ``git archive fef7d88 | tar -x -C DIR``, the
commit before issue 12) and prints both. Everything shares the machine; the achieved heartbeat
rate is printed next to the asked one, and events are also given per heartbeat sent.

Run from the repository root: ``make bench-federation-scale`` or
``.venv/bin/python -m bench.federation_scale [--regions 20 --agents 1000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition

from topology.launcher import LocalCluster
from topology.spec import Topology

SECRET = b"bench-federation-scale-secret-0123456789"
TOPIC_PREFIX = "agent-reach"
KEY_PREFIX = "ar"
SPILL_CAPABILITY = "scale.spill"
RESULT_MARK = "RESULT "
_METRIC_LINE = re.compile(r'^(agent_reach_federation_(?:consumer_applied|published)_total)\{region="([^"]+)"\} (\S+)$')


@dataclass(frozen=True, slots=True)
class Params:
    regions: int = 3
    agents: int = 10_000
    capabilities: int = 20
    heartbeat_s: float = 10.0
    lease_s: float = 600.0  # long: a machine that registers slowly loses no agent before its first heartbeat
    seconds: float = 30.0
    in_flight: int = 96
    registrations: int = 200
    registration_rate: float = 10.0
    spill_agents: int = 4
    calls: int = 1_000
    rounds: int = 3
    replicate_depth: int | None = None
    seed: int = 1


def topology_of(params: Params) -> Topology:
    names = [f"r{n:02d}" for n in range(1, params.regions + 1)]
    federation: dict[str, Any] = {"beacon_interval_ms": 1_000, "stale_after_ms": 5_000}
    if params.replicate_depth is not None:
        federation["replicate_depth"] = params.replicate_depth
    regions = [{"name": name, "node_urls": [f"http://127.0.0.1:{7_300 + n}"],
                "prefer": [names[(n + k) % len(names)] for k in range(1, len(names))],
                "policy": {"env": "dev", "egress": {"allow": ["loopback"]}}} for n, name in enumerate(names)]
    # no semantic discovery: embedding every registration's description would measure the model
    return Topology.model_validate({"name": "federation-scale", "kafka": {"topic_prefix": TOPIC_PREFIX},
                                    "semantic": {"enabled": False}, "federation": federation, "regions": regions})


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] if ordered else float("nan")


class Bench:
    def __init__(self, cluster: LocalCluster, session: aiohttp.ClientSession, params: Params) -> None:
        self.cluster = cluster
        self.session = session
        self.params = params
        self.regions = list(cluster.nodes)
        self.headers = {"Authorization": f"Bearer {cluster.admin_token()}"}
        self.rng = random.Random(params.seed)
        self.limit = asyncio.Semaphore(params.in_flight)
        self.errors: Counter[str] = Counter()

    async def request(self, region: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        async with self.limit:
            async with self.session.request(method, self.cluster.url(region) + path, json=body,
                                            headers=self.headers) as response:
                reply = await response.read()
                if response.status >= 300:
                    self.errors[f"{method} {path.split('/')[2]} {response.status}"] += 1
                    return None
                return json.loads(reply) if reply else None

    def registration(self, agent_id: str, capability: str) -> dict[str, Any]:
        return {"agent_id": agent_id, "endpoints": {"primary": "http://127.0.0.1:9"}, "weight": 100,
                "max_concurrency": 10, "lease_ttl_ms": int(self.params.lease_s * 1000),
                "capabilities": [{"name": capability, "description": "benchmark agent"}]}

    def fleet_id(self, region: str, n: int) -> str:
        return f"scale.{region}.a{n}"

    async def register_fleets(self) -> float:
        started = time.perf_counter()
        jobs = [self.request(region, "POST", "/v1/agents",
                             self.registration(self.fleet_id(region, n), f"scale.c{n % self.params.capabilities}"))
                for region in self.regions for n in range(self.params.agents)]
        for start in range(0, len(jobs), 2_000):
            await asyncio.gather(*jobs[start:start + 2_000])
        return len(jobs) / (time.perf_counter() - started)

    async def heartbeats(self, seconds: float) -> float:
        """Open loop at agents / heartbeat_s per region for ``seconds``; returns the achieved rate (all regions)."""
        rate = len(self.regions) * self.params.agents / self.params.heartbeat_s
        count = int(rate * seconds)
        pending: set[asyncio.Task[Any]] = set()
        started = time.perf_counter()
        for n in range(count):
            delay = started + n / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            region = self.regions[n % len(self.regions)]
            agent = self.fleet_id(region, (n // len(self.regions)) % self.params.agents)
            body = {"load": {"inflight": self.rng.randrange(10), "queued": 0}}
            task = asyncio.ensure_future(self.request(region, "PUT", f"/v1/agents/{agent}/heartbeat", body))
            pending.add(task)
            task.add_done_callback(pending.discard)
            while len(pending) >= self.params.in_flight:  # the machine cannot keep up: the rate says so
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*pending)
        return count / (time.perf_counter() - started)

    async def counters(self) -> dict[str, dict[str, float]]:
        """Per region: peer changes applied and own changes published (the federation's counters)."""
        found: dict[str, dict[str, float]] = {}
        for region in self.regions:
            async with self.session.get(self.cluster.url(region) + "/metrics") as response:
                text = await response.text()
            values = {"applied": 0.0, "published": 0.0}
            for line in text.splitlines():
                match = _METRIC_LINE.match(line)
                if match:
                    values["applied" if "applied" in match.group(1) else "published"] += float(match.group(3))
            found[region] = values
        return found

    async def propagation(self) -> tuple[list[tuple[float, str]], float]:
        """Register the probe agents in r01 at the asked rate; (sent at ms, agent_id) each, and the rate."""
        source = self.regions[0]
        sent: list[tuple[float, str]] = []
        jobs = []
        started = time.perf_counter()
        for n in range(self.params.registrations):
            delay = started + n / self.params.registration_rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            agent = f"scale.probe.p{n}"
            sent.append((time.time() * 1000, agent))
            jobs.append(asyncio.ensure_future(self.request(source, "POST", "/v1/agents",
                                                           self.registration(agent, "scale.probe"))))
        await asyncio.gather(*jobs)
        return sent, len(sent) / (time.perf_counter() - started)

    async def committed(self, region: str, agents: set[str]) -> dict[str, float]:
        """agent_id of r01 -> wall-clock ms its first change was committed in ``region``'s replica."""
        client = aioredis.Redis.from_url(self.cluster.resolved.region(region).redis_url, decode_responses=True)
        stamps: dict[str, float] = {}
        try:
            start = "-"
            while entries := await client.xrange(f"{KEY_PREFIX}:{{{region}}}:fed:feed", min=start, max="+",
                                                 count=5_000):
                for entry_id, fields in entries:
                    if fields.get("peer") == self.regions[0] and fields.get("agent_id") in agents:
                        stamps.setdefault(fields["agent_id"], float(fields["at"]))
                start = f"({entry_id}"
        finally:
            await client.aclose()
        return stamps

    async def spread(self) -> list[dict[str, float]]:
        """Shares of r01's resolves of a capability served only in r02 (capacity 2) and r03 (1)."""
        near, far = self.regions[1], self.regions[2 % len(self.regions)]
        for region, count in ((near, self.params.spill_agents), (far, max(1, self.params.spill_agents // 2))):
            for n in range(count):
                await self.request(region, "POST", "/v1/agents",
                                   self.registration(f"scale.spill{region}.a{n}", SPILL_CAPABILITY))
        body = {"capability": SPILL_CAPABILITY, "semantic": False}
        deadline = time.perf_counter() + 15
        seen: set[str] = set()
        while seen != {near, far} and time.perf_counter() < deadline:  # both replicated (or summarised) in r01
            ticket = await self.request(self.regions[0], "POST", "/v1/resolve", body)
            seen |= {target["region"] for target in ([ticket["target"], *ticket["alternates"]] if ticket else [])}
            await asyncio.sleep(0.2)
        rounds = []
        for _ in range(self.params.rounds):
            tickets = await asyncio.gather(*(self.request(self.regions[0], "POST", "/v1/resolve", body)
                                             for _ in range(self.params.calls)))
            regions = Counter(ticket["target"]["region"] for ticket in tickets if ticket)
            rounds.append({region: regions[region] / max(1, sum(regions.values())) for region in (near, far)})
        return rounds


async def topic_figures(bootstrap: str, since_ms: float, until_ms: float) -> dict[str, tuple[int, int]]:
    """Every federation topic: (records, bytes of key + value + headers) produced within the window.

    Counted by reading the topics from their start and keeping the records whose timestamp falls
    in the window: the embedded broker's end offset counts a batch of many records as one.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                max_partition_fetch_bytes=8 * 2**20)
    await consumer.start()
    try:
        topics = sorted(topic for topic in await consumer.topics() if topic.startswith(TOPIC_PREFIX + "."))
        partitions = [TopicPartition(topic, 0) for topic in topics]
        ends = await consumer.end_offsets(partitions) if partitions else {}
        consumer.assign(partitions)
        for partition in partitions:
            consumer.seek(partition, 0)
        seen = dict.fromkeys(partitions, -1)
        figures = dict.fromkeys(topics, (0, 0))
        deadline = time.perf_counter() + 60
        quiet = 0
        while partitions and time.perf_counter() < deadline and quiet < 2:
            batches = await consumer.getmany(timeout_ms=300, max_records=10_000)
            quiet = quiet + 1 if not batches and all(seen[p] >= ends[p] - 1 for p in partitions) else 0
            for partition, records in batches.items():
                seen[partition] = max(seen[partition], records[-1].offset)
                inside = [r for r in records if since_ms <= r.timestamp < until_ms]
                count, size = figures[partition.topic]
                figures[partition.topic] = (count + len(inside), size + sum(
                    len(r.key or b"") + len(r.value or b"") + sum(len(k) + len(v) for k, v in r.headers)
                    for r in inside))
        return figures
    finally:
        await consumer.stop()


def kind_of(topic: str) -> str:
    return topic.split(".")[-2]


async def measure(params: Params) -> dict[str, Any]:
    topology = topology_of(params)
    result: dict[str, Any] = {"params": asdict(params)}
    async with LocalCluster(topology, secret=SECRET, any_port=True, log_level="WARNING") as cluster:
        connector = aiohttp.TCPConnector(limit=params.in_flight + 50)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60), connector=connector) as session:
            bench = Bench(cluster, session, params)
            result["register_rate"] = await bench.register_fleets()
            result["warmup_rate"] = await bench.heartbeats(params.heartbeat_s)
            counters_before = await bench.counters()
            started, since_ms = time.perf_counter(), time.time() * 1000
            heartbeats = asyncio.ensure_future(bench.heartbeats(params.seconds))
            sent, result["registration_rate"] = await bench.propagation()
            result["heartbeat_rate"] = await heartbeats
            window, until_ms = time.perf_counter() - started, time.time() * 1000
            counters_after = await bench.counters()
            result["window_s"] = window
            result["nodes"] = {region: {key: (counters_after[region][key] - counters_before[region][key]) / window
                                        for key in ("applied", "published")} for region in bench.regions}
            topics = await topic_figures(cluster.resolved.kafka.bootstrap_servers or "", since_ms, until_ms)
            result["topics"] = {topic: {"records_per_s": count / window, "bytes_per_s": size / window}
                                for topic, (count, size) in topics.items()}
            await asyncio.sleep(2)  # the last registrations reach the peers
            agents = {agent for _, agent in sent}
            latencies: dict[str, list[float]] = {}
            for region in bench.regions[1:]:
                stamps = await bench.committed(region, agents)
                if stamps:
                    latencies[region] = [stamps[agent] - at for at, agent in sent if agent in stamps]
            result["propagation"] = latencies
            result["registrations"] = len(sent)
            result["spread"] = await bench.spread() if len(bench.regions) >= 3 else []
            result["spill_regions"] = [bench.regions[1], bench.regions[2 % len(bench.regions)]]
            result["errors"] = dict(bench.errors)
    return result


def report(label: str, result: dict[str, Any]) -> str:
    params = Params(**result["params"])
    asked = params.regions * params.agents / params.heartbeat_s
    lines = [f"[{label}] {params.regions} regions x {params.agents:,} agents, heartbeat every {params.heartbeat_s:g} s "
             f"with load: asked {asked:,.0f}/s, achieved {result['heartbeat_rate']:,.0f}/s over "
             f"{result['window_s']:.0f} s (registered {result['register_rate']:,.0f}/s)"]
    nodes = result["nodes"]
    per_heartbeat = result["heartbeat_rate"] / params.regions
    for region, figures in nodes.items():
        lines.append(f"  {region}: applies {figures['applied']:8.1f} peer changes/s, publishes "
                     f"{figures['published']:8.1f}/s ({figures['published'] / per_heartbeat:.3f} per heartbeat)")
    by_kind: dict[str, list[tuple[float, float]]] = {}
    for topic, figures in result["topics"].items():
        by_kind.setdefault(kind_of(topic), []).append((figures["records_per_s"], figures["bytes_per_s"]))
    for kind, rows in sorted(by_kind.items()):
        rate, size = sum(r for r, _ in rows), sum(b for _, b in rows)
        lines.append(f"  topics {kind:<9}: {rate / len(rows):8.1f} records/s per region topic "
                     f"({size / len(rows) / 1024:7.1f} KiB/s, {size / rate if rate else 0:5.0f} B each)")
    source = next(iter(nodes))  # r01, where the probe registrations go
    heartbeat_caused = [figures["published"] for region, figures in nodes.items() if region != source]
    others = sum(rate for topic, figures in result["topics"].items() if kind_of(topic) != "changes"
                 for rate in [figures["records_per_s"]]) / max(1, len(nodes))
    lines.append(f"  cross-region records per region at steady state (a region without the probe registrations): "
                 f"{statistics.fmean(heartbeat_caused) + others:.1f}/s ({statistics.fmean(heartbeat_caused):.1f} "
                 f"changes + {others:.1f} beacons and summaries)" if heartbeat_caused else "")
    everything = [latency for values in result["propagation"].values() for latency in values]
    reached = len(result["propagation"])
    if everything:
        lines.append(f"  registration propagation r01 -> {reached} peers ({result['registrations']} at "
                     f"{result['registration_rate']:.0f}/s, {len(everything)} commits): p50 "
                     f"{percentile(everything, 0.5):.0f} ms, p99 {percentile(everything, 0.99):.0f} ms, "
                     f"max {max(everything):.0f} ms")
    else:
        lines.append("  registration propagation: no peer committed a probe registration")
    near, far = result["spill_regions"]
    capacity = params.spill_agents / (params.spill_agents + max(1, params.spill_agents // 2))
    for n, shares in enumerate(result["spread"]):
        lines.append(f"  remote spread round {n + 1}: {near} {100 * shares.get(near, 0):5.1f} %  "
                     f"{far} {100 * shares.get(far, 0):5.1f} %  (capacity {100 * capacity:.1f} % : "
                     f"{100 * (1 - capacity):.1f} %)")
    if result["errors"]:
        lines.append(f"  errors: {result['errors']}")
    return "\n".join(lines)


def run_tree(tree: Path, params: Params) -> dict[str, Any]:
    """The measurement on another checkout, in a child process started in it: this file is run by
    path (``runpy``, which adds nothing to ``sys.path``), so ``node``, ``federation`` and ``topology``
    — the nodes' too — come from ``tree``."""
    argv = [f"--{name.replace('_', '-')}={value}" for name, value in asdict(params).items()
            if value is not None and name != "replicate_depth"]  # the tree before knows no partial replication
    code = ("import runpy, sys; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    completed = subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve()), *argv, "--json"],
                               cwd=tree, env=env, capture_output=True, text=True, check=False)
    for line in completed.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):])
    raise RuntimeError(f"the run on {tree} printed no result (exit {completed.returncode}):\n"
                       f"{completed.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Params()
    for name, value in asdict(defaults).items():
        kind = float if isinstance(value, float) else int
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=value)
    parser.add_argument("--before-tree", type=Path, help="also run on this checkout first (the code before)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line (for --before-tree)")
    args = parser.parse_args()
    params = Params(**{name: getattr(args, name) for name in asdict(defaults)})
    if args.before_tree is not None:
        print(report(f"before: {args.before_tree}", run_tree(args.before_tree.resolve(), params)), flush=True)
    result = asyncio.run(measure(params))
    if args.json:
        print(RESULT_MARK + json.dumps(result))
    else:
        print(report("this tree", result), flush=True)


if __name__ == "__main__":
    main()
