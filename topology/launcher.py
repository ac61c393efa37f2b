"""``agent-reach up [FILE]``: run a whole topology on this machine, and stop all of it on Ctrl-C.

For every region without a ``redis_url`` an embedded ``redis-server`` is started, and an
embedded Kafka-compatible broker when the topology names no ``kafka.bootstrap_servers``
(``topology.embedded``). The topology, with those URLs filled in, is written to a run directory
and each region's node runs as its own process, ``agent-reach node --topology RESOLVED --region
NAME``, exactly as it would in production. Nodes get the cluster secret through their
environment, run in their own session (the terminal's Ctrl-C reaches only the launcher, which
stops them in order: nodes first, then the broker and Redis) and are asked by the kernel to exit
if the launcher dies without cleaning up (Linux ``PR_SET_PDEATHSIG``).

:class:`LocalCluster` is the same machinery as an async context manager; the tests and
``bench/federation.py`` use it to run, stop and restart nodes and the broker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from node.models import TokenRole
from node.security import SECRET_ENV, Signer, load_secret

from .embedded import EmbeddedKafka, EmbeddedRedis, EmbeddedServiceError
from .topology import DEFAULT_TOPOLOGY_FILE, Topology, TopologyError, load_topology

log = logging.getLogger(__name__)

DEFAULT_NODE_START_TIMEOUT_S = 30.0
DEFAULT_NODE_STOP_TIMEOUT_S = 10.0
_POLL_INTERVAL_S = 0.05
_LOG_TAIL_LINES = 30


class LauncherError(TopologyError):
    """A node or an embedded service of a local cluster could not be started."""


@dataclass(slots=True)
class NodeProcess:
    """One region's node process."""

    region: str
    url: str
    log_path: Path
    process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None


class LocalCluster:
    """A topology run locally: embedded services where no URL is given, one node process per region.

    ``async with LocalCluster(topology, secret=…) as cluster`` starts everything and waits until
    every node answers ``/readyz``; leaving stops every process it started. With
    ``any_port=True`` the nodes listen on free ports instead of the topology's.
    """

    def __init__(self, topology: Topology, *, secret: bytes, any_port: bool = False, run_dir: Path | None = None,
                 log_level: str = "INFO", node_start_timeout_s: float = DEFAULT_NODE_START_TIMEOUT_S,
                 node_stop_timeout_s: float = DEFAULT_NODE_STOP_TIMEOUT_S) -> None:
        self.topology = topology
        self.secret = secret
        self.any_port = any_port
        self.log_level = log_level
        self.node_start_timeout_s = node_start_timeout_s
        self.node_stop_timeout_s = node_stop_timeout_s
        self._own_run_dir = run_dir is None
        self.run_dir = run_dir or Path(tempfile.mkdtemp(prefix="agent-reach-up-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.resolved: Topology = topology
        self.topology_file = self.run_dir / "topology.json"
        self.redis: dict[str, EmbeddedRedis] = {}
        self.kafka: EmbeddedKafka | None = None
        self.nodes: dict[str, NodeProcess] = {}
        self._closed = False

    async def __aenter__(self) -> LocalCluster:
        try:
            await self.start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start embedded services, write the resolved topology, start every node and wait for them."""
        regions = []
        for region in self.topology.regions:
            update: dict[str, object] = {}
            if region.redis_url is None:
                server = EmbeddedRedis()
                self.redis[region.name] = server
                await _start_service(server, f"Redis of region {region.name}")
                update["redis_url"] = server.url
            if self.any_port:
                update["node_urls"] = [_with_port(region.node_urls[0], _free_port()), *region.node_urls[1:]]
            regions.append(region.model_copy(update=update))
        kafka = self.topology.kafka
        if kafka.bootstrap_servers is None:
            self.kafka = EmbeddedKafka()
            await _start_service(self.kafka, "the Kafka broker")
            kafka = kafka.model_copy(update={"bootstrap_servers": self.kafka.bootstrap_servers})
        self.resolved = self.topology.model_copy(update={"regions": regions, "kafka": kafka})
        self.topology_file.write_text(self.resolved.model_dump_json(indent=2))
        for region in self.resolved.regions:
            self.nodes[region.name] = NodeProcess(region.name, region.node_urls[0].rstrip("/"),
                                                  self.run_dir / f"{region.name}.log")
        await asyncio.gather(*(self.start_node(name) for name in self.nodes))

    async def aclose(self) -> None:
        """Stop every node, then the broker and Redis; idempotent."""
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(*(self.stop_node(name) for name in self.nodes), return_exceptions=True)
        if self.kafka is not None:
            await self.kafka.aclose()
        for server in self.redis.values():
            await server.aclose()
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    async def start_node(self, region: str) -> NodeProcess:
        """Start (or restart) the node of ``region`` and wait until it answers ``/readyz``."""
        node = self.nodes[region]
        if node.running:
            return node
        env = {**os.environ, SECRET_ENV: self.secret.decode()}
        command = [sys.executable, "-m", "topology.cli", "--log-level", self.log_level, "node",
                   "--topology", str(self.topology_file), "--region", region]
        with open(node.log_path, "ab") as log_file:
            node.process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=env,
                start_new_session=True, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        await self._wait_ready(node)
        return node

    async def stop_node(self, region: str, *, kill: bool = False) -> None:
        """Stop the node of ``region``: SIGTERM (SIGKILL with ``kill`` or after the stop timeout)."""
        node = self.nodes[region]
        process = node.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=self.node_stop_timeout_s)
        except TimeoutError:
            log.warning("node of region %s did not stop within %.0f s; killing it", region, self.node_stop_timeout_s)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()

    async def wait_any_exit(self) -> NodeProcess:
        """Return the first node process that exits."""
        waits = {asyncio.ensure_future(node.process.wait()): node
                 for node in self.nodes.values() if node.process is not None}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            return waits[next(iter(done))]
        finally:
            for future in waits:
                future.cancel()

    # -- information -------------------------------------------------------------------------

    def admin_token(self, *, ttl_s: int = 24 * 3600) -> str:
        return Signer(self.secret).issue("admin", TokenRole.ADMIN, ttl_s=ttl_s)

    def url(self, region: str) -> str:
        return self.nodes[region].url

    def summary(self) -> str:
        lines = []
        kafka = self.resolved.kafka.bootstrap_servers
        lines.append(f"  kafka {kafka}{' (embedded)' if self.kafka else ''}  topics "
                     f"{self.resolved.kafka.topic_prefix}.changes.<region>")
        for region in self.resolved.regions:
            node = self.nodes[region.name]
            embedded = " (embedded)" if region.name in self.redis else ""
            lines.append(f"  region {region.name}  url {node.url}  redis {region.redis_url}{embedded}  "
                         f"log {node.log_path}")
        return "\n".join(lines)

    def log_tail(self, region: str) -> str:
        try:
            lines = self.nodes[region].log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no output)"
        return "\n".join(lines[-_LOG_TAIL_LINES:]) or "(no output)"

    async def _wait_ready(self, node: NodeProcess) -> None:
        deadline = time.monotonic() + self.node_start_timeout_s
        timeout = aiohttp.ClientTimeout(total=1.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                if node.process is not None and node.process.returncode is not None:
                    raise LauncherError(f"the node of region {node.region} exited with code "
                                        f"{node.process.returncode} while starting; its log:\n"
                                        f"{self.log_tail(node.region)}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                    async with session.get(f"{node.url}/readyz") as response:
                        if response.status == 200:
                            return
                if time.monotonic() > deadline:
                    raise LauncherError(f"the node of region {node.region} did not become ready at {node.url} "
                                        f"within {self.node_start_timeout_s:.0f} s; its log:\n"
                                        f"{self.log_tail(node.region)}")
                await asyncio.sleep(_POLL_INTERVAL_S)


async def _start_service(service: EmbeddedRedis | EmbeddedKafka, what: str) -> None:
    try:
        await service.start()
    except EmbeddedServiceError as exc:
        raise LauncherError(f"cannot start an embedded server for {what}: {exc}") from exc


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:{port}"))


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the launcher dies (Linux only)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


# -- the `up` command --------------------------------------------------------------------------

def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("up", help="run a whole topology locally (embedded Redis/Kafka where none is set)")
    parser.add_argument("file", nargs="?", default=None,
                        help=f"topology file (default: the packaged {DEFAULT_TOPOLOGY_FILE.name}, three regions)")
    parser.add_argument("--any-port", action="store_true",
                        help="listen on free ports instead of the topology's node URLs")
    parser.add_argument("--log-dir", metavar="DIR", help="keep node logs here (default: a temporary directory "
                                                         "removed on exit)")
    parser.add_argument("--secret-file", help="cluster secret file (see README: Security)")
    parser.add_argument("--demo", action="store_true", help="also start the demo agents (examples/) in different "
                                                            "regions and show a local and a cross-region call")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        topology = load_topology(args.file)
    except TopologyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_main(args, topology))


async def _main(args: argparse.Namespace, topology: Topology) -> int:
    secret, source = load_secret(secret_file=args.secret_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    cluster = LocalCluster(topology, secret=secret, any_port=args.any_port,
                           run_dir=Path(args.log_dir) if args.log_dir else None,
                           log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()))
    stopping = asyncio.ensure_future(stop.wait())
    demo = None
    try:
        starting = asyncio.ensure_future(cluster.start())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, LauncherError):
                await starting
            print("agent-reach up: interrupted while starting; stopped everything", flush=True)
            return 130
        try:
            starting.result()
        except LauncherError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 1
        print(f"agent-reach up: topology {topology.name!r} is running ({len(cluster.nodes)} regions)", flush=True)
        print(cluster.summary(), flush=True)
        print(f"  secret {source}", flush=True)
        print(f"admin token (24 h): {cluster.admin_token()}", flush=True)
        if args.demo:
            demo = await _start_demo(cluster)
        print("Ctrl-C stops everything.", flush=True)
        exited = asyncio.ensure_future(cluster.wait_any_exit())
        await asyncio.wait({stopping, exited}, return_when=asyncio.FIRST_COMPLETED)
        if exited.done() and not stopping.done():
            node = exited.result()
            print(f"error: the node of region {node.region} exited with code {node.process.returncode}; "
                  f"stopping everything. Its log:\n{cluster.log_tail(node.region)}", file=sys.stderr, flush=True)
            return 1
        exited.cancel()
        print("agent-reach up: stopping", flush=True)
        return 0
    finally:
        stopping.cancel()
        if demo is not None:
            await demo.aclose()
        await cluster.aclose()
        print("agent-reach up: stopped", flush=True)


async def _start_demo(cluster: LocalCluster):  # -> examples.demo.Demo
    """The demo agents of ``examples/`` (shipped with the source, not as a package), one region each."""
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from examples.demo import start_demo

    return await start_demo({name: cluster.url(name) for name in cluster.nodes}, cluster.admin_token())
