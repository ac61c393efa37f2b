"""Test helpers: a running node over real HTTP, a real agent server, polling with a deadline,
and the router on its own over an in-memory index (no Redis, no HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiokafka import AIOKafkaConsumer, TopicPartition

from federation import Federation
from federation.events import FederationMessage
from node.core import NoAgentAvailable
from node.core.models import AgentRecord, Capability, RouteRequest, SummaryView, TokenClaims, TokenRole
from node.delivery import OutcomeTracker
from node.http import bound_port, serve
from node.routing import Router
from node.service import RegistryNode
from node.trust import Signer
from node.view import AgentIndex
from topology import Topology
from topology.composition import attach_discovery, attach_federation


async def wait_for(condition: Callable[[], Any | Awaitable[Any]], *, timeout_s: float = 10.0,
                   interval_s: float = 0.02, message: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        last = condition()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {message} (last: {last!r})")
        await asyncio.sleep(interval_s)


@dataclass
class RunningNode:
    """A started node with its HTTP server on 127.0.0.1 and a session carrying an admin token."""

    node: RegistryNode
    runner: web.AppRunner
    url: str
    admin_token: str
    session: aiohttp.ClientSession = field(init=False)

    def __post_init__(self) -> None:
        self.session = aiohttp.ClientSession(base_url=self.url)

    def token(self, subject: str, role: TokenRole = TokenRole.AGENT, ttl_s: int = 3600) -> str:
        return self.node.signer.issue(subject, role, ttl_s=ttl_s)

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.admin_token}"}

    async def call(self, method: str, path: str, *, token: str | None = None, json: Any = None,
                   data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        all_headers = {**self.headers(token), **(headers or {})}
        async with self.session.request(method, path, json=json, data=data, headers=all_headers) as response:
            body = await response.read()
            if response.content_type == "application/json":
                return response.status, await response.json()
            return response.status, body.decode()

    async def register(self, registration: dict[str, Any], *, token: str | None = None) -> dict[str, Any]:
        status, body = await self.call("POST", "/v1/agents", json=registration, token=token)
        if status not in (200, 201):
            raise AssertionError(f"register failed: {status} {body}")
        return body

    async def resolve(self, token: str | None = None, **request: Any) -> tuple[int, Any]:
        return await self.call("POST", "/v1/resolve", json=request, token=token)

    async def aclose(self) -> None:
        await self.session.close()
        await self.runner.cleanup()
        await self.node.aclose()


async def start_node(node: RegistryNode) -> RunningNode:
    await node.start()
    runner = await serve(node, host="127.0.0.1", port=0)
    url = f"http://127.0.0.1:{bound_port(runner)}"
    return RunningNode(node=node, runner=runner, url=url,
                       admin_token=node.signer.issue("admin", TokenRole.ADMIN, ttl_s=3600))


def route_many(node: RunningNode, count: int, **request) -> Counter[str]:
    router = node.node.router
    parsed = RouteRequest(**request)
    return Counter(router.route(parsed, ADMIN).target.agent_id for _ in range(count))


class AgentServer:
    """A real agent over HTTP on 127.0.0.1 whose health the test flips."""

    def __init__(self, name: str = "agent") -> None:
        self.name = name
        self.live = True
        self.ready = True
        self.probes: dict[str, int] = {"healthz": 0, "readyz": 0}
        self.calls = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> AgentServer:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_post("/invoke", self._invoke)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{bound_port(self.runner)}"
        return self

    async def _healthz(self, request: web.Request) -> web.Response:
        self.probes["healthz"] += 1
        return web.json_response({"ok": self.live}, status=200 if self.live else 500)

    async def _readyz(self, request: web.Request) -> web.Response:
        self.probes["readyz"] += 1
        return web.json_response({"ready": self.ready}, status=200 if self.ready else 503)

    async def _invoke(self, request: web.Request) -> web.Response:
        self.calls += 1
        return web.json_response({"agent": self.name, "echo": await request.json()})

    async def aclose(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


def registration(agent_id: str, *, capability: str = "translate.text", version: str = "1",
                 endpoint: str = "http://127.0.0.1:9", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent_id": agent_id,
        "display_name": agent_id,
        "description": f"test agent {agent_id}",
        "capabilities": [{"name": capability, "version": version, "description": "test capability"}],
        "endpoints": {"primary": endpoint},
    }
    body.update(extra)
    return body


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def terminate(process: subprocess.Popen[Any], *, timeout_s: float = 30) -> None:
    """SIGTERM ``process`` and wait for it; SIGKILL it if it outlasts ``timeout_s``."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_workers(redis_url: str, region: str, port: int, *flags: str, secret: str,
                  env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``agent-reach node --workers 2`` for ``region`` on ``port`` (no drain grace), with ``flags``;
    stderr piped (a test reads it or closes it)."""
    return subprocess.Popen([sys.executable, "-m", "topology.cli", "--log-level", "WARNING", "node", "--region",
                             region, "--redis", redis_url, "--port", str(port), "--no-semantic", "--workers", "2",
                             "--drain-grace-ms", "0", *flags],
                            env={**os.environ, "AGENT_REACH_SECRET": secret, **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def both_workers_answer(url: str, attempts: int = 20) -> bool:
    """Two processes answered ``/healthz`` on ``url`` (their ``node_id``) within ``attempts`` fresh
    connections."""
    seen = set()
    try:
        for _ in range(attempts):
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                async with session.get(f"{url}/healthz") as response:
                    seen.add((await response.json())["node_id"])
    except aiohttp.ClientError:
        return False
    return len(seen) == 2


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie is dead; only its parent has not reaped it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


async def topic_records(bootstrap_servers: str, topic: str) -> list[Any]:
    """Every record of ``topic`` (partition 0), tombstones included, up to its high watermark at the
    time of reading."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False, fetch_max_wait_ms=20)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        records: list[Any] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            records += (await consumer.getmany(partition, timeout_ms=100)).get(partition, [])
            highwater = consumer.highwater(partition)
            if highwater is not None and await consumer.position(partition) >= highwater:
                break
        return records
    finally:
        await consumer.stop()


async def topic_messages(bootstrap_servers: str, topic: str) -> list[FederationMessage]:
    """Every message on ``topic`` (partition 0), tombstones left out (:func:`topic_records`)."""
    return [FederationMessage.decode(record.value) for record in await topic_records(bootstrap_servers, topic)
            if record.value is not None]


async def serve_routes(*routes: web.RouteDef) -> tuple[web.AppRunner, str]:
    """A small HTTP server on 127.0.0.1 playing a hostile agent, node or peer; its runner and base URL."""
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{bound_port(runner)}"


# Ports handed to a server that binds them later are drawn below the kernel's ephemeral range
# (net.ipv4.ip_local_port_range, 32768-60999 by default): a port the kernel picked as free was
# once the local port of some outgoing connection by the time the test bound it (EADDRINUSE).
LISTEN_PORTS = range(20_000, 32_768)
_draw_port = random.Random()


_handed: set[int] = set()  # not handed out twice: two draws for one test would otherwise meet now and then


def free_port() -> int:
    """A port of 127.0.0.1 nothing is bound to now and not handed out before by this process, from
    :data:`LISTEN_PORTS` (else the kernel's)."""
    if len(_handed) > len(LISTEN_PORTS) // 2:
        _handed.clear()
    for _ in range(100):
        port = _draw_port.randrange(LISTEN_PORTS.start, LISTEN_PORTS.stop)
        if port in _handed:
            continue
        _handed.add(port)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    with socket.socket() as probe:  # the range is crowded: whatever the kernel gives
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Pair:
    """Two federated regions in this process (each with its own port, sharing the test Redis).

    With ``discovery`` the nodes are built by the composition root (federation and lexical
    search attached), else with federation only.
    """

    def __init__(self, redis_url: str, region: str, bootstrap_servers: str, *, secret: bytes,
                 discovery: bool = False) -> None:
        self.secret = secret
        self.discovery = discovery
        self.names = (f"{region}-x", f"{region}-y")
        self.topology = Topology.model_validate({
            "kafka": {"bootstrap_servers": bootstrap_servers, "topic_prefix": f"test-{region}"},
            "federation": {"beacon_interval_ms": 100, "stale_after_ms": 800, "anti_entropy_min_interval_ms": 100,
                           "request_timeout_ms": 1_000},
            "node": {"leader_ttl_ms": 600, "sweep_interval_ms": 100, "lease_sync_interval_ms": 100,
                     "semantic_enabled": False},
            "regions": [{"name": name, "node_urls": [f"http://127.0.0.1:{free_port()}"], "redis_url": redis_url,
                         "policy": {"egress": {"allow": ["loopback"]}}} for name in self.names],
        })
        self.running: list[RunningNode] = []

    async def start(self, name: str, *, port: int | None = None) -> tuple[RunningNode, Federation]:
        config = self.topology.node_config(name, port=port)
        node = RegistryNode(config, secret=self.secret)
        federation = attach_federation(node, self.topology, secret=self.secret)
        if self.discovery:  # as topology.build_node does, keeping the federation at hand
            attach_discovery(node, semantic_enabled=False)
        await node.start()
        runner = await serve(node)
        running = RunningNode(node=node, runner=runner, url=f"http://127.0.0.1:{bound_port(runner)}",
                              admin_token=node.signer.issue("admin", TokenRole.ADMIN, ttl_s=3600))
        self.running.append(running)
        return running, federation

    async def aclose(self) -> None:
        for running in reversed(self.running):
            await running.aclose()
        self.running.clear()


class Watcher:
    """An open server-sent event stream (``/v1/watch``) read in the background.

    ``async with Watcher(session, path, token) as watcher`` connects and waits for the first
    event; ``events`` holds every event as the spec's items describe them (``{"event", "data"}``
    plus ``"id"`` when it carries one), ``data(kind)`` their parsed data.
    """

    def __init__(self, session: aiohttp.ClientSession, url: str, token: str) -> None:
        self.session = session
        self.url = url
        self.token = token
        self.events: list[dict[str, str]] = []
        self.ended = False
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Watcher:
        self._task = asyncio.create_task(self._read())
        await wait_for(lambda: self.ended or self.events, message=f"the first event of {self.url}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def kinds(self) -> list[str]:
        return [event["event"] for event in self.events]

    def data(self, kind: str) -> list[dict[str, Any]]:
        return [json.loads(event["data"]) for event in self.events if event["event"] == kind]

    def changes(self) -> list[dict[str, Any]]:
        return self.data("change")

    def agent_ids(self) -> set[str]:
        return {change["agent_id"] for change in self.changes()}

    async def _read(self) -> None:
        current: dict[str, str] = {}
        try:
            async with self.session.get(self.url, headers={"Authorization": f"Bearer {self.token}"},
                                        timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as response:
                assert response.status == 200 and response.content_type == "text/event-stream", response.status
                async for raw in response.content:
                    line = raw.decode().rstrip("\r\n")
                    if not line:
                        if "data" in current:
                            self.events.append(current)
                        current = {}
                    elif not line.startswith(":"):
                        name, _, value = line.partition(":")
                        current[name] = value.removeprefix(" ")
        finally:
            self.ended = True


# -- the router on its own: an in-memory AgentIndex, a simulated clock, a seeded RNG ----------

REGION = "home"
CAPABILITY = "translate.text"
START_MS = 1_000_000
LEASE_MS = 30_000
ADMIN = TokenClaims(sub="admin", role=TokenRole.ADMIN, exp=2**40, iat=0)
INSIDER = TokenClaims(sub="finance.ledger.y", role=TokenRole.CALLER, exp=2**40, iat=0)


class Clock:
    """Milliseconds that move only when a test moves them."""

    def __init__(self) -> None:
        self.now = START_MS

    def __call__(self) -> int:
        return self.now


class MemoryRegion:
    """What the router reads of a RegionCache: the index, the lease horizon, self-preservation."""

    def __init__(self, clock: Clock, region: str = REGION) -> None:
        self.index = AgentIndex(region)
        self.preserving = False
        self._clock = clock

    def routable_now_ms(self) -> int:
        return self._clock.now


@dataclass
class Peer:
    region: str
    index: AgentIndex
    stale: bool = False
    replicated: bool = True
    summary: SummaryView | None = None


class Catalog:
    def __init__(self, *peers: Peer) -> None:
        self._peers = list(peers)

    def peers(self) -> list[Peer]:
        return self._peers


def record(agent_id: str, *, region: str = REGION, capability: str = CAPABILITY, version: str = "1",
           **fields: Any) -> AgentRecord:
    fields.setdefault("lease_expires_at_ms", START_MS + LEASE_MS)
    return AgentRecord(agent_id=agent_id, region=region, capabilities=[Capability(name=capability, version=version)],
                       endpoints={"primary": f"http://{agent_id}.test:8080"}, lease_ttl_ms=LEASE_MS, **fields)


def make_router(*records: AgentRecord, peers: tuple[Peer, ...] = (), **options: Any
                ) -> tuple[Router, MemoryRegion, Clock]:
    clock = Clock()
    region = MemoryRegion(clock)
    for item in records:
        region.index.put(item)
    options.setdefault("rng", random.Random(7))
    router = Router(region, Signer(b"unit-test-secret-0123456789abcdef"), options.pop("outcomes", OutcomeTracker()),
                    clock=clock, **options)
    if peers:
        router.remote = Catalog(*peers)  # type: ignore[assignment]
    return router, region, clock


def index_of(region: str, *records: AgentRecord) -> AgentIndex:
    index = AgentIndex(region)
    for item in records:
        index.put(item)
    return index


def picks(router: Router, count: int, caller: TokenClaims = ADMIN, **request: Any) -> Counter[str]:
    parsed = RouteRequest(**request)
    return Counter(router.decide_exact(parsed, caller).target.agent_id for _ in range(count))


def stages(router: Router, caller: TokenClaims = ADMIN, **request: Any) -> dict[str, str]:
    with pytest.raises(NoAgentAvailable) as raised:
        router.decide_exact(RouteRequest(**request), caller)
    assert raised.value.details is not None
    return raised.value.details["stages"]  # type: ignore[return-value]
