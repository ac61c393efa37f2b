"""Resolve throughput and latency at 1k and 10k agents, against a bare aiohttp handler.

Everything runs on this machine over 127.0.0.1: an embedded redis-server, the node as its own
process (`agent-reach node`), and wrk as the load generator in a third process, with a Lua
script that posts a resolve body for a random capability. The baseline is a bare aiohttp
handler that answers a fixed JSON body, driven the same way in the same run: the ratio says
how much of the machine's HTTP capacity the router keeps. The node runs with --no-semantic: this
measures routing, and indexing 10k agents' descriptions in the background would compete for the
same two cores (bench/semantic.py measures search).

Over https too, in the same run (``--no-tls`` skips it): a second node serves the same region
with a certificate made for the run (``openssl``), and each node is driven with keep-alive and
with ``Connection: close`` (a TCP connection, and a TLS handshake, per request), so the
handshake's cost shows beside TLS's steady-state cost. The ratios printed are https over http in
the same mode; the node's CPU time per request says the same where the shared machine skews req/s.

Run from the repository root: `make bench-resolve` (installs wrk if absent) or `.venv/bin/python -m bench.resolve`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import ssl
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path

from node.core.models import AgentRecord, Capability, TokenRole
from node.store import RegionStore
from node.store.region import now_ms
from node.trust import Signer
from topology.embedded import EmbeddedRedis

SECRET = "bench-secret-0123456789abcdef"
CAPABILITIES = 100
REGION = "bench"

BASELINE_APP = textwrap.dedent("""
    import asyncio
    import sys
    from aiohttp import web
    try:
        import uvloop  # the node runs on uvloop when installed: compare like with like
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    BODY = b'{"target":{"agent_id":"a.b.c","endpoint":"http://127.0.0.1:9"},"ok":true}'
    async def handler(request):
        await request.read()
        return web.Response(body=BODY, content_type="application/json")
    app = web.Application()
    app.router.add_post("/v1/resolve", handler)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
""")

# What every wrk script of the benchmarks prints at the end (run_wrk reads it back).
WRK_REPORT = """
response = function(status, headers, body)
    if status >= 300 then wrk.thread:set("bad", (wrk.thread:get("bad") or 0) + 1) end
end
done = function(summary, latency, requests)
    io.write(string.format("NON2XX %d\\n", summary.errors.status))
    for _, p in pairs({50, 90, 99, 99.9}) do
        io.write(string.format("P%g %d\\n", p, latency:percentile(p)))
    end
    io.write(string.format("RPS %.1f\\n", summary.requests / (summary.duration / 1e6)))
end
"""

WRK_SCRIPT = textwrap.dedent("""
    local capabilities = %d
    wrk.method = "POST"
    wrk.headers["Content-Type"] = "application/json"
    wrk.headers["Authorization"] = "Bearer %s"%s
    request = function()
        local body = string.format('{"capability":"cap.c%%d"}', math.random(0, capabilities - 1))
        return wrk.format(nil, "/v1/resolve", nil, body)
    end
""")


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    context = ssl._create_unverified_context() if url.startswith("https:") else None  # the run's own certificate
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1, context=context) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{url} did not come up within {timeout_s}s")


async def populate(redis_url: str, agents: int, *, lease_ttl_ms: int = 3_600_000) -> None:
    """``agents`` records over CAPABILITIES capabilities, written straight into the region's Redis."""
    store = RegionStore.from_url(redis_url, region=REGION)
    now = now_ms()
    lease = now + lease_ttl_ms
    await store.redis.delete(store.key_agents, store.key_leases, store.key_version, store.key_changes)
    for start in range(0, agents, 50):
        batch = []
        for i in range(start, min(agents, start + 50)):
            record = AgentRecord(
                agent_id=f"bench.pool{i % 50}.a{i}", region=REGION, display_name=f"agent {i}",
                description="benchmark agent", capabilities=[Capability(name=f"cap.c{i % CAPABILITIES}", version="1")],
                endpoints={"primary": f"http://127.0.0.1:{10_000 + i % 50_000}"}, lease_ttl_ms=lease_ttl_ms,
                weight=100, registered_at_ms=now, updated_at_ms=now, lease_expires_at_ms=lease,
            )
            batch.append(store.register(record, at_ms=now))
        await asyncio.gather(*batch)
    await store.aclose()


def resolve_script(token: str, *, keep_alive: bool = True) -> str:
    """The wrk script posting a resolve of a random capability with ``token`` (without
    ``keep_alive``: ``Connection: close``, so wrk opens a connection per request)."""
    close = "" if keep_alive else '\nwrk.headers["Connection"] = "close"'
    return WRK_SCRIPT % (CAPABILITIES, token, close) + WRK_REPORT


def run_wrk(url: str, lua: str, *, seconds: int, connections: int, cpu_of: Sequence[int] = ()) -> dict[str, float]:
    """wrk -t1 against ``url`` with the script ``lua`` (whose done() prints NON2XX, P50.. and RPS).

    ``cpu_of``: server processes (with their children) whose CPU time per request the figures
    report as ``CPU_US`` — the cost of a request, which a busy machine skews far less than the
    throughput.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(lua)
    try:
        cpu_before = cpu_seconds(cpu_of)
        output = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "2s", "-s", script.name, url],
            check=True, capture_output=True, text=True, timeout=seconds + 60,
        ).stdout
        cpu_used = cpu_seconds(cpu_of) - cpu_before
    finally:
        os.unlink(script.name)
    figures = {key: float(value) for key, value in re.findall(r"^(NON2XX|P[\d.]+|RPS) ([\d.]+)$", output, re.M)}
    if cpu_of and figures.get("RPS"):
        figures["CPU_US"] = 1e6 * cpu_used / (figures["RPS"] * seconds)
    return figures


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU time used so far by ``pids`` and their children (a node's ``--workers``);
    Linux ``/proc``, 0 for a process that is gone."""
    total, seen, pending = 0.0, set(), list(pids)
    while pending:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            for task in Path(f"/proc/{pid}/task").iterdir():
                pending.extend(int(child) for child in (task / "children").read_text().split())
        except (OSError, IndexError):
            continue
        total += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return total


def baseline(lua: str, *, seconds: int, connections: int) -> dict[str, float]:
    """The bare aiohttp handler's figures under ``lua`` (after a warm-up), printed."""
    port = free_port()
    process = spawn([sys.executable, "-c", BASELINE_APP, str(port)])
    try:
        wait_port(port)
        run_wrk(f"http://127.0.0.1:{port}", lua, seconds=1, connections=connections)
        figures = run_wrk(f"http://127.0.0.1:{port}", lua, seconds=seconds, connections=connections,
                          cpu_of=[process.pid])
    finally:
        stop(process)
    print(line("bare aiohttp handler", figures))
    return figures


def spawn(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# Rate budgets (node.trust.budgets) a benchmark's one token never exhausts: checked and synced on
# every request, as by default, but at a rate no run reaches.
UNBOUNDED_BUDGETS = {f"AGENT_REACH_RATE_LIMIT_{role}RPS": "1e9" for role in ("", "AGENT_", "ADMIN_", "CAPABILITY_")}


def line(label: str, figures: dict[str, float]) -> str:
    return (f"{label:<28} {figures['RPS']:>10,.0f} req/s   p50 {figures['P50'] / 1000:6.2f} ms   "
            f"p99 {figures['P99'] / 1000:6.2f} ms   p99.9 {figures['P99.9'] / 1000:6.2f} ms   "
            f"non-2xx {int(figures['NON2XX'])}" + (f"   server cpu {figures['CPU_US']:.1f} us/req" if "CPU_US" in figures else ""))


def make_certificate(directory: Path) -> list[str]:
    """A self-signed certificate for 127.0.0.1 (wrk does not check it): the node's TLS flags."""
    cert, key = directory / "node.pem", directory / "node.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=30)
    return ["--tls-cert", str(cert), "--tls-key", str(key)]


def drive_node(redis_url: str, token: str, args: argparse.Namespace, *, tls: list[str]) -> dict[str, dict[str, float]]:
    """Start a node (over https with ``tls``) and drive it with and without keep-alive."""
    port = free_port()
    # One caller token drives thousands of resolves a second: its budgets (200/s by default)
    # are raised out of the way, not turned off, so every request still pays for them.
    env = {**UNBOUNDED_BUDGETS, **os.environ, "AGENT_REACH_SECRET": SECRET}
    node = spawn([str(Path(sys.executable).with_name("agent-reach")), "--log-level", "WARNING", "node",
                  "--region", REGION, "--redis", redis_url, "--port", str(port), "--no-semantic", *tls], env=env)
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    figures = {}
    try:
        wait_http(f"{url}/readyz")
        for mode, keep_alive in (("keep-alive", True), ("close", False)) if args.tls else (("keep-alive", True),):
            script = resolve_script(token, keep_alive=keep_alive)
            run_wrk(url, script, seconds=2, connections=args.connections)  # warm-up
            figures[mode] = run_wrk(url, script, seconds=args.seconds, connections=args.connections, cpu_of=[node.pid])
    finally:
        stop(node)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--agents", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--no-tls", dest="tls", action="store_false", help="skip the https runs")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: `make bench-resolve` installs it (apt-get install wrk)")

    token = Signer(SECRET.encode()).issue("bench.caller.c1", TokenRole.CALLER, ttl_s=3600)
    print(f"resolve benchmark: wrk -t1 -c{args.connections} -d{args.seconds}s, {CAPABILITIES} capabilities, "
          f"random capability per request; {os.cpu_count()} cores shared by server, wrk and redis")

    base = baseline(resolve_script(token), seconds=args.seconds, connections=args.connections)

    redis = EmbeddedRedis()
    redis.start_sync()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-tls-") as directory:
            tls = make_certificate(Path(directory)) if args.tls else []
            for agents in args.agents:
                asyncio.run(populate(redis.url, agents))
                plain = drive_node(redis.url, token, args, tls=[])
                print(line(f"resolve @ {agents:,} agents", plain["keep-alive"])
                      + f"   ratio {plain['keep-alive']['RPS'] / base['RPS']:.2f}")
                if tls:
                    secure = drive_node(redis.url, token, args, tls=tls)
                    for mode in ("keep-alive", "close"):
                        if mode == "close":
                            print(line(f"  http, {mode}", plain[mode]))
                        print(line(f"  https, {mode}", secure[mode])
                              + f"   https/http {secure[mode]['RPS'] / plain[mode]['RPS']:.2f}"
                              f" (cpu {secure[mode]['CPU_US'] / plain[mode]['CPU_US']:.2f}x)")
    finally:
        redis.stop_sync()


def wait_port(port: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"port {port} did not open within {timeout_s}s")


if __name__ == "__main__":
    main()
