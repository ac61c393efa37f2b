"""Agent-Reach next to etcd on the same three workloads, in the same run: heartbeat, register, resolve.

Everything on this machine over 127.0.0.1, each side its own process, wrk (-t1) driving both
from a third: the node (``agent-reach node --no-semantic`` over an embedded redis-server) and
etcd 3.4 (Debian's ``etcd-server``, through its HTTP/JSON gateway, data on a temporary
directory: it fsyncs every write, Redis here does not persist). A bare aiohttp handler is the
same run's ceiling for Python HTTP on this machine.

=========================  ================================  ==========================================
workload                   Agent-Reach                       etcd
=========================  ================================  ==========================================
heartbeat (lease only)     PUT /v1/agents/{id}/heartbeat     POST /v3/lease/keepalive of its lease
heartbeat (with load)      the same, body {"load": {...}}    (no equivalent: etcd leases carry no data)
register                   POST /v1/agents, a new agent      POST /v3/kv/put of a new key with a lease
resolve                    POST /v1/resolve of a capability  POST /v3/kv/range over its prefix
=========================  ================================  ==========================================

Agents (and etcd keys, one lease each) rotate at random over ``--agents`` (10,000 over 100
capabilities by default). The ratio column is Agent-Reach / etcd (> 1: Agent-Reach is faster).

Sessions (``bench.sessions``), against the same node in the same run: the node's CPU (with its
redis-server, as for wrk) per lease renewal and per load report over HTTP (wrk) and over sessions
(one renewal per frame, as a process of one agent sends, and 100 per frame), the renewals one
process drives through its sessions per second, and how long an SDK agent killed with SIGKILL
stays routable, with its session and over HTTP only. ``--only sessions`` runs the node and this
part alone (no etcd).

Run from the repository root: ``make bench-peers`` (installs wrk and etcd-server if absent) or
``.venv/bin/python -m bench.peers``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

import aiohttp

from node.core.models import TokenRole
from node.trust import Signer
from topology.embedded import EmbeddedRedis

from .resolve import (
    CAPABILITIES,
    REGION,
    SECRET,
    UNBOUNDED_BUDGETS,
    WRK_REPORT,
    baseline,
    free_port,
    line,
    populate,
    run_wrk,
    spawn,
    stop,
    wait_http,
)
from .sessions import AGENTS_PER_SESSION, SessionLoad, agent_ids, saturate, time_to_unroutable

# Every rate budget off (``node.trust.budgets``): what the node cost before they were on by default.
NO_BUDGETS = {name: "0" for name in UNBOUNDED_BUDGETS}

# The wrk scripts: one request builder each; script() adds the report of bench.resolve's.
HEARTBEAT = """
    wrk.method = "PUT"
    wrk.headers["Authorization"] = "Bearer {token}"
    local counter = 0
    request = function()
        local i = math.random(0, {agents} - 1)
        counter = counter + 1
        local body = {body}
        return wrk.format(nil, string.format("/v1/agents/bench.pool%d.a%d/heartbeat", i % 50, i), nil, body)
    end
"""
HEARTBEAT_LEASE_BODY = '""'
LOAD_REPORT = HEARTBEAT.replace("/heartbeat", "/load")
LOAD_REPORT_BODY = 'string.format(\'{"inflight": %d, "queued": 0, "rps": 1.5}\', counter % 7 + 1)'
HEARTBEAT_LOAD_BODY = 'string.format(\'{"load": {"inflight": %d, "queued": 0, "rps": 1.5}}\', counter % 7)'

REGISTER = """
    wrk.method = "POST"
    wrk.headers["Authorization"] = "Bearer {token}"
    local counter = 0
    request = function()
        counter = counter + 1
        local body = string.format('{{"agent_id": "bench.new.n%d", "display_name": "new agent %d", '
            .. '"capabilities": [{{"name": "cap.c%d", "version": "1"}}], '
            .. '"endpoints": {{"primary": "http://127.0.0.1:%d"}}, "lease_ttl_ms": 600000}}',
            counter, counter, counter % {capabilities}, 20000 + counter % 40000)
        return wrk.format(nil, "/v1/agents", nil, body)
    end
"""

RESOLVE = """
    wrk.method = "POST"
    wrk.headers["Authorization"] = "Bearer {token}"
    request = function()
        return wrk.format(nil, "/v1/resolve", nil,
                          string.format('{{"capability":"cap.c%d"}}', math.random(0, {capabilities} - 1)))
    end
"""

ETCD_KEEPALIVE = """
    wrk.method = "POST"
    local leases = {{{leases}}}
    request = function()
        return wrk.format(nil, "/v3/lease/keepalive", nil,
                          string.format('{{"ID": "%s"}}', leases[math.random(1, #leases)]))
    end
"""

ETCD_PUT = """
    wrk.method = "POST"
    local leases = {{{leases}}}
    local counter = 0
    local b64 = function(data)
        local chars = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'
        return ((data:gsub('.', function(x)
            local r, b = '', x:byte()
            for i = 8, 1, -1 do r = r .. (b % 2 ^ i - b % 2 ^ (i - 1) > 0 and '1' or '0') end
            return r
        end) .. '0000'):gsub('%d%d?%d?%d?%d?%d?', function(x)
            if (#x < 6) then return '' end
            local c = 0
            for i = 1, 6 do c = c + (x:sub(i, i) == '1' and 2 ^ (6 - i) or 0) end
            return chars:sub(c + 1, c + 1)
        end) .. ({{ '', '==', '=' }})[#data % 3 + 1])
    end
    local value = b64('{record}')
    request = function()
        counter = counter + 1
        local key = b64(string.format("agents/cap.c%d/bench.new.n%d", counter % {capabilities}, counter))
        return wrk.format(nil, "/v3/kv/put", nil, string.format(
            '{{"key": "%s", "value": "%s", "lease": "%s"}}', key, value, leases[math.random(1, #leases)]))
    end
"""

ETCD_RANGE = """
    wrk.method = "POST"
    local ranges = {{{ranges}}}
    request = function()
        local r = ranges[math.random(1, #ranges)]
        return wrk.format(nil, "/v3/kv/range", nil, string.format('{{"key": "%s", "range_end": "%s"}}', r[1], r[2]))
    end
"""

# A record of the size the node stores for a benchmark agent, as etcd's value.
RECORD = ('{"agent_id":"bench.new.n1","region":"bench","display_name":"new agent 1","capabilities":'
          '[{"name":"cap.c1","version":"1"}],"endpoints":{"primary":"http://127.0.0.1:20001"},'
          '"lease_ttl_ms":600000,"weight":100,"status":"ready"}')


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def script(template: str, **values: object) -> str:
    head = 'wrk.headers["Content-Type"] = "application/json"\n'
    return head + textwrap.dedent(template).format(**values) + WRK_REPORT


class Etcd:
    """etcd on free ports over a temporary data directory; the populated leases and prefixes."""

    def __init__(self) -> None:
        self.client_port = free_port()
        self.peer_port = free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.directory = tempfile.mkdtemp(prefix="bench-etcd-")
        self.process = spawn([
            "etcd", "--name", "bench", "--data-dir", self.directory, "--log-level", "error",
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-cluster", f"bench=http://127.0.0.1:{self.peer_port}",
        ])
        self.leases: list[str] = []

    def stop(self) -> None:
        stop(self.process)
        shutil.rmtree(self.directory, ignore_errors=True)

    async def populate(self, agents: int) -> None:
        """``agents`` keys under ``agents/<capability>/``, each with a lease of its own."""
        async with aiohttp.ClientSession(base_url=self.url) as session:
            semaphore = asyncio.Semaphore(32)

            async def one(i: int) -> str:
                async with semaphore:
                    async with session.post("/v3/lease/grant", json={"TTL": 3600}) as response:
                        lease = (await response.json())["ID"]
                    key = f"agents/cap.c{i % CAPABILITIES}/bench.pool{i % 50}.a{i}"
                    async with session.post("/v3/kv/put", json={"key": _b64(key), "value": _b64(RECORD),
                                                                "lease": lease}) as response:
                        response.raise_for_status()
                    return lease

            self.leases = await asyncio.gather(*(one(i) for i in range(agents)))

    def ranges(self) -> str:
        pairs = []
        for c in range(CAPABILITIES):
            prefix = f"agents/cap.c{c}/"
            pairs.append(f'{{"{_b64(prefix)}", "{_b64(prefix[:-1] + chr(ord(prefix[-1]) + 1))}"}}')
        return ", ".join(pairs)

    def lease_list(self, limit: int = 2_000) -> str:
        return ", ".join(f'"{lease}"' for lease in self.leases[:limit])


def measure(url: str, body: str, *, seconds: int, connections: int, cpu_of: list[int],
            warmup: bool = True) -> dict[str, float]:
    if warmup:
        run_wrk(url, body, seconds=1, connections=connections)
    return run_wrk(url, body, seconds=seconds, connections=connections, cpu_of=cpu_of)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=1, help="agent-reach node --workers")
    parser.add_argument("--budgets-cost", action="store_true",
                        help="the node alone, with rate budgets off and then spent on every request (at a rate no "
                             "run reaches), alternated --rounds times: what the budgets cost, in the same run")
    parser.add_argument("--rounds", type=int, default=2, help="with --budgets-cost: off/on pairs")
    parser.add_argument("--only", choices=("sessions",), help="the node's HTTP and session figures alone (no etcd)")
    args = parser.parse_args()
    if args.budgets_cost:
        _budgets_cost(args)
        return
    for tool, package in (("wrk", "wrk"), ("etcd", "etcd-server"))[:1 if args.only else 2]:
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed: `make bench-peers` installs it (apt-get install {package})")
    token = Signer(SECRET.encode()).issue("admin", TokenRole.ADMIN, ttl_s=3600)
    print(f"peer benchmark: wrk -t1 -c{args.connections} -d{args.seconds}s, {args.agents:,} agents over "
          f"{CAPABILITIES} capabilities; {os.cpu_count()} cores shared by server, wrk and the store")

    if args.only == "sessions":
        _measure_node(args, token)
        return
    base = baseline(script(RESOLVE, token=token, capabilities=CAPABILITIES), seconds=args.seconds,
                    connections=args.connections)

    ours = _measure_node(args, token, budgets={})  # the defaults: admins are not limited
    etcd = Etcd()
    try:
        wait_http(f"{etcd.url}/health")
        asyncio.run(etcd.populate(args.agents))
        options = {"seconds": args.seconds, "connections": args.connections, "cpu_of": [etcd.process.pid]}
        theirs = {
            "heartbeat (lease only)": measure(etcd.url, script(ETCD_KEEPALIVE, leases=etcd.lease_list()), **options),
            "register": measure(etcd.url, script(ETCD_PUT, leases=etcd.lease_list(), record=RECORD,
                                                 capabilities=CAPABILITIES), **options),
            "resolve": measure(etcd.url, script(ETCD_RANGE, ranges=etcd.ranges()), **options),
        }
    finally:
        etcd.stop()
    print(f"\n{'workload':<26} {'Agent-Reach':>52}   {'etcd 3.4 (HTTP gateway)':>52}   ratio   cost ratio")
    for name, figures in ours.items():
        other = theirs.get(name)
        left = _short(figures)
        right = _short(other) if other else "(no equivalent)"
        ratio = f"{figures['RPS'] / other['RPS']:.2f}" if other else "—"
        cost = f"{other['CPU_US'] / figures['CPU_US']:.2f}" if other else "—"
        print(f"{name:<26} {left:>52}   {right:>52}   {ratio:>5}   {cost:>10}")
    print(f"{'bare aiohttp handler':<26} {_short(base):>52}")
    print("\nratio: Agent-Reach's throughput / etcd's. cost ratio: etcd's server CPU per request / Agent-Reach's "
          "(node and its redis-server together); > 1: Agent-Reach is faster / cheaper. The machine's cores are shared "
          "by wrk, the server and its store: the CPU a request costs is skewed far less by other load than the "
          "throughput is.")
    resolve = ours["resolve"]
    print(f"\nresolve / bare handler: {resolve['RPS'] / base['RPS']:.2f} of its throughput, "
          f"p99 {resolve['P99'] / max(base['P99'], 1):.1f} x its p99")


def _budgets_cost(args: argparse.Namespace) -> None:
    """Rate budgets off, then on for the admin token of every request, ``args.rounds`` times in turn."""
    token = Signer(SECRET.encode()).issue("admin", TokenRole.ADMIN, ttl_s=3600)
    print(f"rate budgets' cost: wrk -t1 -c{args.connections} -d{args.seconds}s, {args.agents:,} agents, "
          f"{args.rounds} rounds of budgets off then on; {os.cpu_count()} cores shared by server, wrk and the store")
    rounds = []
    for round_ in range(args.rounds):
        print(f"-- round {round_ + 1}: off")
        off = _measure_node(args, token, budgets=NO_BUDGETS)
        print(f"-- round {round_ + 1}: on")
        rounds.append((off, _measure_node(args, token, budgets=UNBOUNDED_BUDGETS)))
    heading = f"{'cpu/request off → on (us), each round':>48}   {'cost on/off':>11}   {'rps on/off':>10}"
    print(f"\n{'workload':<26} {heading}")
    for name in rounds[0][0]:
        pairs = [(off[name], on[name]) for off, on in rounds]
        cpu = "  ".join(f"{off['CPU_US']:.1f} → {on['CPU_US']:.1f}" for off, on in pairs)
        cost = statistics.median(on["CPU_US"] / off["CPU_US"] for off, on in pairs)
        rps = statistics.median(on["RPS"] / off["RPS"] for off, on in pairs)
        print(f"{name:<26} {cpu:>48}   {cost:>11.2f}   {rps:>10.2f}")
    print("\ncost on/off: the median over rounds of the CPU a request costs (node and redis-server) with budgets "
          "spent on every request, over the same without budgets; < 1.05 is within this machine's noise.")


def _measure_node(args: argparse.Namespace, token: str, *, budgets: dict[str, str]) -> dict[str, dict[str, float]]:
    redis = EmbeddedRedis()
    redis.start_sync()
    try:
        asyncio.run(populate(redis.url, args.agents, lease_ttl_ms=3_600_000))
        port = free_port()
        env = {**os.environ, **budgets, "AGENT_REACH_SECRET": SECRET}
        command = [str(Path(sys.executable).with_name("agent-reach")), "--log-level", "WARNING", "node",
                   "--region", REGION, "--redis", redis.url, "--port", str(port), "--no-semantic",
                   "--egress-allow", "loopback"]
        if args.workers > 1:
            command += ["--workers", str(args.workers)]
        node = spawn(command, env=env)
        try:
            wait_http(f"http://127.0.0.1:{port}/readyz")
            url = f"http://127.0.0.1:{port}"
            options = {"seconds": args.seconds, "connections": args.connections, "cpu_of": [node.pid, redis.pid]}
            figures = {
                "heartbeat (lease only)": measure(url, script(HEARTBEAT, token=token, agents=args.agents,
                                                              body=HEARTBEAT_LEASE_BODY), **options),
                "heartbeat (with load)": measure(url, script(HEARTBEAT, token=token, agents=args.agents,
                                                             body=HEARTBEAT_LOAD_BODY), **options),
            }
            reports = measure(url, script(LOAD_REPORT, token=token, agents=args.agents, body=LOAD_REPORT_BODY),
                              **options)
            asyncio.run(_sessions(url, token, args, http={"heartbeat": figures["heartbeat (lease only)"],
                                                          "load report": reports}, cpu_of=[node.pid, redis.pid]))
            if not args.only:
                figures |= {
                    "resolve": measure(url, script(RESOLVE, token=token, capabilities=CAPABILITIES), **options),
                    # Last: it adds agents (about 8 s worth) to the region the others measured.
                    "register": measure(url, script(REGISTER, token=token, capabilities=CAPABILITIES),
                                        warmup=False, **options),
                }
        finally:
            stop(node)
    finally:
        redis.stop_sync()
    for name, value in figures.items():
        print(line(f"agent-reach {name}", value))
    return figures


async def _sessions(url: str, token: str, args: argparse.Namespace, *, http: dict[str, dict[str, float]],
                    cpu_of: list[int]) -> None:
    """Renewals and load reports over sessions against the HTTP figures of the same run; a killed
    SDK agent's time to unroutable with and without its session."""
    agents = agent_ids(min(args.agents, 4 * AGENTS_PER_SESSION))
    seconds = args.seconds
    async with SessionLoad(url, token, agents) as load:
        runs = {
            "renewal, 1 per frame": await saturate(load, seconds=seconds, beats_per_frame=1, in_flight=4,
                                                   cpu_of=cpu_of),
            "renewal, 100 per frame": await saturate(load, seconds=seconds, beats_per_frame=100, in_flight=2,
                                                     cpu_of=cpu_of),
            "load report, 1 per frame": await saturate(load, seconds=seconds, beats_per_frame=1, in_flight=4,
                                                       cpu_of=cpu_of, load_reports=True),
        }
        errors = load.errors
    print(f"\nsessions: {len(agents):,} agents on {len(load.sessions)} sessions from this process "
          f"(frames in flight: 4 per session of 1, 2 of 100); CPU: node + redis-server per item")
    heartbeat, report = http["heartbeat"], http["load report"]
    print(f"{'HTTP heartbeat (wrk)':<28} {heartbeat['RPS']:>10,.0f}/s  cpu {heartbeat['CPU_US']:6.1f} us")
    print(f"{'HTTP load report (wrk)':<28} {report['RPS']:>10,.0f}/s  cpu {report['CPU_US']:6.1f} us")
    for name, figures in runs.items():
        versus = report if name.startswith("load") else heartbeat
        print(f"{'session ' + name:<28} {figures['RPS']:>10,.0f}/s  cpu {figures['CPU_US']:6.1f} us   "
              f"cpu ratio to HTTP {figures['CPU_US'] / versus['CPU_US']:.2f} (target <= 0.20)")
    if errors:
        print(f"  ({errors} items answered with an error)")
    signer = Signer(SECRET.encode())
    issue = lambda agent_id: signer.issue(agent_id, TokenRole.AGENT, ttl_s=3600)  # noqa: E731
    for lease_ms, session in ((30_000, True), (5_000, False)):
        seconds_to = await time_to_unroutable(url, admin_token=token, agent_token=issue, lease_ms=lease_ms,
                                              agent_id=f"bench.kill{int(session)}.a1", session=session)
        how = "with its session" if session else "HTTP heartbeats only"
        print(f"SDK agent killed with SIGKILL, lease {lease_ms / 1000:.0f} s, {how}: unroutable after "
              f"{seconds_to:.3f} s")


def _short(figures: dict[str, float]) -> str:
    bad = f" non-2xx {int(figures['NON2XX'])}" if figures["NON2XX"] else ""
    cpu = f" cpu {figures['CPU_US']:5.1f} us" if "CPU_US" in figures else ""
    return f"{figures['RPS']:>8,.0f}/s p50 {figures['P50'] / 1000:5.2f} p99 {figures['P99'] / 1000:6.2f} ms{cpu}{bad}"


if __name__ == "__main__":
    main()
