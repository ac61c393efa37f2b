"""What a region of many agents costs: registering them, memory per agent, resolve at that size,
cold start, and loading a 1,000,000-record region in one process.

Two parts, on an embedded redis-server over 127.0.0.1:

1. **A node process** (``agent-reach node --no-semantic``): ``--agents`` agents (100,000 by
   default) registered over HTTP by ``--clients`` concurrent clients (registrations/s, p50/p99);
   the node's RSS before and after (bytes per agent); resolve throughput and p99 at that size
   with wrk -c16 next to a bare aiohttp handler in the same run; the federation snapshot (served
   streamed; read by a peer streamed and, for comparison, whole); then the node is stopped and
   started again over the stored records (cold start: until /readyz answers 200).
2. **In this process**: a 10,000-agent pool of one capability whose agents change one at a time
   (a load report), each change followed by a routing lookup: the table patched for the one agent
   against the table built afresh, per change; then ``--million`` records (1,000,000 by default) written straight into the
   region's Redis, then a :class:`node.view.cache.RegionCache` started over them, as a node does at
   start-up: load time and RSS per record.

3. **Sessions** (``--only sessions``): ``--session-agents`` agents (100,000 by default) written
   straight into the region's Redis, a node process started over them, then every agent joined
   on a session from this process (1,000 to a session, ``bench.sessions``) and renewed every
   ``--renew-interval-s`` (10 s), spread over the interval: the node's CPU as a share of one core
   (and with its redis-server), and its RSS per agent — all of it, and what the sessions added.

Run from the repository root: ``make bench-scale`` or ``.venv/bin/python -m bench.scale``
(``--agents 10000 --million 100000`` for a quick look; ``--only load`` for the in-process load alone).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import statistics
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson

from federation.snapshot_reader import read_snapshot
from node.core.models import AgentRecord, Capability, Load, Locality, RouteRequest, Snapshot, TokenRole
from node.delivery import OutcomeTracker
from node.ops import collector_paused
from node.routing.candidates import CandidateTables, Source
from node.store import RegionStore
from node.store.region import now_ms
from node.trust import Signer
from node.view import AgentIndex, RegionCache
from topology.embedded import EmbeddedRedis

from .resolve import (
    CAPABILITIES,
    REGION,
    SECRET,
    baseline,
    cpu_seconds,
    free_port,
    line,
    resolve_script,
    run_wrk,
    spawn,
    stop,
    wait_http,
)
from .sessions import SessionLoad, agent_ids, steady


def rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as status:
        for entry in status:
            if entry.startswith("VmRSS:"):
                return int(entry.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/<pid>/status")


def registration(i: int) -> dict[str, object]:
    return {"agent_id": f"scale.pool{i % 50}.a{i}", "display_name": f"agent {i}",
            "description": "an agent of the scale benchmark",
            "capabilities": [{"name": f"cap.c{i % CAPABILITIES}", "version": "1"}],
            "endpoints": {"primary": f"http://127.0.0.1:{10_000 + i % 50_000}"},
            "lease_ttl_ms": 3_600_000, "weight": 100}


async def register_all(url: str, token: str, agents: int, clients: int) -> tuple[float, list[float]]:
    """Register ``agents`` agents with ``clients`` concurrent clients; (seconds, latencies in ms)."""
    latencies: list[float] = []
    queue = iter(range(agents))
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(base_url=url, connector=connector,
                                     headers={"Authorization": f"Bearer {token}"}) as session:
        async def client() -> None:
            for i in queue:
                started = time.perf_counter()
                async with session.post("/v1/agents", data=orjson.dumps(registration(i)),
                                        headers={"Content-Type": "application/json"}) as response:
                    await response.read()
                    if response.status not in (200, 201):
                        raise SystemExit(f"registration {i} failed: {response.status} {await response.text()}")
                latencies.append((time.perf_counter() - started) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return time.perf_counter() - started, latencies


def node_command(redis_url: str, port: int) -> list[str]:
    return [str(Path(sys.executable).with_name("agent-reach")), "--log-level", "WARNING", "node", "--region", REGION,
            "--redis", redis_url, "--port", str(port), "--no-semantic", "--egress-allow", "loopback"]


def node_part(args: argparse.Namespace) -> None:
    token = Signer(SECRET.encode()).issue("admin", TokenRole.ADMIN, ttl_s=3600)
    env = {**os.environ, "AGENT_REACH_SECRET": SECRET}
    base = baseline(resolve_script(token), seconds=args.seconds, connections=16)

    redis = EmbeddedRedis()
    redis.start_sync()
    try:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        node = spawn(node_command(redis.url, port), env=env)
        try:
            wait_http(f"{url}/readyz")
            empty = rss_bytes(node.pid)
            seconds, latencies = asyncio.run(register_all(url, token, args.agents, args.clients))
            gc_settle = time.monotonic() + 2
            while time.monotonic() < gc_settle:  # let the tail and the lease sync catch up
                time.sleep(0.1)
            full = rss_bytes(node.pid)
            latencies.sort()
            print(f"register {args.agents:,} agents, {args.clients} clients: {seconds:.1f} s, "
                  f"{args.agents / seconds:,.0f}/s, p50 {statistics.median(latencies):.2f} ms, "
                  f"p99 {latencies[int(len(latencies) * 0.99)]:.2f} ms")
            print(f"node RSS: {empty / 2**20:,.0f} MiB empty -> {full / 2**20:,.0f} MiB at {args.agents:,} agents: "
                  f"{(full - empty) / args.agents:,.0f} B per agent")
            run_wrk(url, resolve_script(token), seconds=1, connections=16)
            figures = run_wrk(url, resolve_script(token), seconds=args.seconds, connections=16)
            print(line(f"resolve @ {args.agents:,} agents", figures)
                  + f"   ratio {figures['RPS'] / base['RPS']:.2f}")
            asyncio.run(snapshot_figures(url, Signer(SECRET.encode()).issue("bench", TokenRole.PEER, ttl_s=3600),
                                         node.pid, args.agents))
        finally:
            stop(node)
        started = time.monotonic()
        node = spawn(node_command(redis.url, port), env=env)
        try:
            wait_http(f"{url}/readyz", timeout_s=300)
            print(f"cold start over {args.agents:,} stored agents: {time.monotonic() - started:.1f} s to ready, "
                  f"RSS {rss_bytes(node.pid) / 2**20:,.0f} MiB")
        finally:
            stop(node)
    finally:
        redis.stop_sync()


async def snapshot_figures(url: str, token: str, pid: int, agents: int) -> None:
    """The federation snapshot of the whole region: served (time to the first byte and to the
    last, bytes, the node's RSS growth while serving) and read by a peer, streamed
    (``federation.snapshot_reader``) against the whole document parsed at once (time, peak memory)."""
    peak = [rss_bytes(pid)]
    before = peak[0]
    sampling = True

    async def sample() -> None:
        while sampling:
            peak[0] = max(peak[0], rss_bytes(pid))
            await asyncio.sleep(0.005)

    sampler = asyncio.create_task(sample())
    pieces: list[bytes] = []
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session:
        started = time.perf_counter()
        async with session.get(f"{url}/v1/federation/snapshot") as response:
            first_byte = None
            async for piece in response.content.iter_any():
                first_byte = first_byte or time.perf_counter() - started
                pieces.append(piece)
        served = time.perf_counter() - started
    sampling = False
    await sampler
    body = b"".join(pieces)
    print(f"snapshot of {agents:,} agents served: {len(body) / 2**20:,.1f} MiB, first byte {first_byte * 1000:,.0f} ms, "
          f"last {served:,.2f} s; node RSS +{(peak[0] - before) / 2**20:,.0f} MiB while serving")

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 65_536):
            yield body[start:start + 65_536]

    async def whole() -> Snapshot:
        data = orjson.loads(body)
        return Snapshot.model_validate({**data, "agents": [AgentRecord.model_validate(a) for a in data["agents"]]})

    async def streamed() -> Snapshot:
        return await read_snapshot(chunks(), bad_record=lambda *problem: None)

    for name, parse in (("whole document", whole), ("streamed", streamed)):
        started = time.perf_counter()
        snapshot = await parse()
        seconds = time.perf_counter() - started
        del snapshot
        gc.collect()
        tracemalloc.start()
        await parse()
        peak_bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"  read by a peer, {name}: {seconds:.2f} s, peak {peak_bytes / 2**20:,.0f} MiB of Python objects "
              f"beyond the received bytes")


async def fill(store: RegionStore, records: int) -> None:
    """``records`` records written straight into Redis (pipelined HSET/ZADD, as the scripts store them)."""
    now = now_ms()
    lease = now + 3_600_000
    template = AgentRecord(agent_id="scale.pool0.a0", region=REGION, display_name="agent 0",
                           description="an agent of the scale benchmark",
                           capabilities=[Capability(name="cap.c0", version="1")],
                           endpoints={"primary": "http://127.0.0.1:10000"}, lease_ttl_ms=3_600_000, weight=100,
                           registered_at_ms=now, updated_at_ms=now, lease_expires_at_ms=lease)
    body = template.model_dump(mode="json", exclude={"version"})
    for start in range(0, records, 10_000):
        agents: dict[str, str] = {}
        for i in range(start, min(records, start + 10_000)):
            body.update(agent_id=f"scale.pool{i % 50}.a{i}", display_name=f"agent {i}",
                        capabilities=[{"name": f"cap.c{i % CAPABILITIES}", "version": "1", "description": "",
                                       "tags": [], "examples": []}],
                        endpoints={"primary": f"http://127.0.0.1:{10_000 + i % 50_000}"})
            agents[body["agent_id"]] = orjson.dumps({"version": i + 1, **body}).decode()
        async with store.redis.pipeline(transaction=False) as pipe:
            pipe.hset(store.key_agents, mapping=agents)
            pipe.zadd(store.key_leases, dict.fromkeys(agents, lease))
            await pipe.execute()
    await store.redis.set(store.key_version, records)


async def million_part(records: int) -> None:
    redis = EmbeddedRedis()
    await redis.start()
    try:
        store = RegionStore.from_url(redis.url, region=REGION)
        await fill(store, records)
        gc.collect()
        before = rss_bytes()
        started = time.perf_counter()
        cache = RegionCache(store)
        with collector_paused():  # as `agent-reach node` starts (node.ops.loopwatch)
            await cache.start()
        seconds = time.perf_counter() - started
        gc.collect()
        after = rss_bytes()
        print(f"in-process cache load of {len(cache.index):,} records: {seconds:.1f} s "
              f"({len(cache.index) / seconds:,.0f} records/s), {(after - before) / records:,.0f} B per record "
              f"(RSS {before / 2**20:,.0f} -> {after / 2**20:,.0f} MiB)")
        await cache.aclose()
        await store.aclose()
    finally:
        await redis.stop()


def sessions_part(args: argparse.Namespace) -> None:
    """``--session-agents`` agents on sessions renewing every ``--renew-interval-s``: node CPU and RSS."""
    agents = args.session_agents
    token = Signer(SECRET.encode()).issue("admin", TokenRole.ADMIN, ttl_s=3600)
    redis = EmbeddedRedis()
    redis.start_sync()
    try:
        store = RegionStore.from_url(redis.url, region=REGION)
        asyncio.run(_fill_and_close(store, agents))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        node = spawn(node_command(redis.url, port), env={**os.environ, "AGENT_REACH_SECRET": SECRET})
        try:
            wait_http(f"{url}/readyz", timeout_s=300)
            asyncio.run(_sessions_figures(url, token, node.pid, redis.pid, agents, args))
        finally:
            stop(node)
    finally:
        redis.stop_sync()


async def _fill_and_close(store: RegionStore, records: int) -> None:
    await fill(store, records)
    await store.aclose()


async def _sessions_figures(url: str, token: str, node_pid: int, redis_pid: int, agents: int,
                            args: argparse.Namespace) -> None:
    await asyncio.sleep(2)  # the lease sync and the GC settle after the start
    held = rss_bytes(node_pid)
    signer = Signer(SECRET.encode())
    ids = agent_ids(agents, prefix="scale")
    tokens = {agent_id: signer.issue(agent_id, TokenRole.AGENT, ttl_s=3600) for agent_id in ids}  # as SDK agents
    started = time.perf_counter()
    async with SessionLoad(url, token, ids, agent_token=tokens.__getitem__) as load:
        joined_s = time.perf_counter() - started
        await asyncio.sleep(2)
        with_sessions = rss_bytes(node_pid)
        idle_from = cpu_seconds([node_pid])
        await asyncio.sleep(args.renew_interval_s)  # joined, renewing nothing: what holding them costs
        idle = (cpu_seconds([node_pid]) - idle_from) / args.renew_interval_s
        seconds = max(args.seconds, 2 * args.renew_interval_s)
        runs = {}
        for frames in (1, 100):
            figures = await steady(load, seconds=seconds, interval_s=args.renew_interval_s,
                                   frames_per_interval=frames, cpu_of=[node_pid])
            both = await steady(load, seconds=args.renew_interval_s, interval_s=args.renew_interval_s,
                                frames_per_interval=frames, cpu_of=[node_pid, redis_pid])
            runs[frames] = figures, both
        after = rss_bytes(node_pid)
        sessions = len(load.sessions)
    print(f"{agents:,} agents on {sessions} sessions (joined in {joined_s:.1f} s), each renewing every "
          f"{args.renew_interval_s:g} s; the node idle with them joined: {idle * 100:.1f} % of one core")
    for frames, (figures, both) in runs.items():
        how = "one frame per session (the SDK's aligned beats)" if frames == 1 else f"{frames} frames per session"
        print(f"  {how} an interval: {figures['RPS']:,.0f} renewals/s, node CPU {figures['CORE'] * 100:.1f} % of one "
              f"core ({figures['CPU_US']:.1f} us per renewal; target <= 10 %), with its redis-server "
              f"{both['CORE'] * 100:.1f} %")
    print(f"  node RSS {held / 2**20:,.0f} MiB holding the records -> {with_sessions / 2**20:,.0f} MiB with the "
          f"sessions joined -> {after / 2**20:,.0f} MiB after renewing: {after / agents:,.0f} B per agent in all, "
          f"{(after - held) / agents:,.0f} B per agent for its session (target <= 2,048 B with its session)")


def table_upkeep(pool: int = 10_000, changes: int = 2_000) -> None:
    """Per change of one agent in a ``pool``-agent capability: patch the routing table vs rebuild it."""
    index = AgentIndex(REGION)
    now = now_ms()
    for i in range(pool):
        index.put(AgentRecord(agent_id=f"scale.pool.a{i}", region=REGION, capabilities=[Capability(name="cap.big")],
                              endpoints={"primary": f"http://127.0.0.1:{10_000 + i}"}, lease_ttl_ms=3_600_000,
                              weight=100, lease_expires_at_ms=now + 3_600_000))
    source = Source(region=REGION, index=index, locality=Locality.LOCAL, lease_horizon_ms=now)
    request = RouteRequest(capability="cap.big")
    figures = {}
    for label, tables in (("patched", CandidateTables(outcomes=OutcomeTracker())), ("rebuilt", None)):
        kept = tables or CandidateTables(outcomes=OutcomeTracker())
        kept.table(source, request, now, False)
        started = time.perf_counter()
        for n in range(changes):
            index.set_load(f"scale.pool.a{n % pool}", Load(inflight=n % 9 + 1))  # a load report (node.store.loads)
            (tables or CandidateTables(outcomes=OutcomeTracker())).table(source, request, now, False)
        figures[label] = (time.perf_counter() - started) / changes * 1e6
    print(f"routing table upkeep, {pool:,}-agent pool, one agent's load changed then one lookup: "
          f"{figures['patched']:,.0f} µs per change patched, {figures['rebuilt']:,.0f} µs rebuilt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--million", type=int, default=1_000_000, help="records of the in-process load")
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--session-agents", type=int, default=100_000, help="agents on sessions (part 3)")
    parser.add_argument("--renew-interval-s", type=float, default=10.0, help="each session agent renews this often")
    parser.add_argument("--only", choices=("node", "upkeep", "load", "sessions"),
                        help="run one part: the node process (1), the routing table upkeep or the in-process load "
                             "(2), the agents on sessions (3)")
    args = parser.parse_args()
    if args.only in (None, "node") and shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: `make bench-scale` installs it (apt-get install wrk)")
    print(f"scale benchmark: {args.agents:,} agents over {CAPABILITIES} capabilities; {os.cpu_count()} cores "
          "shared by the node, its clients and redis")
    if args.only in (None, "node"):
        node_part(args)
    if args.only in (None, "upkeep"):
        table_upkeep()
    if args.only in (None, "load"):
        asyncio.run(million_part(args.million))
    if args.only in (None, "sessions"):
        sessions_part(args)


if __name__ == "__main__":
    main()
