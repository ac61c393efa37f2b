"""A whole topology on this machine: :class:`LocalCluster`, which ``agent-reach up`` runs.

For every region without a ``redis_url`` an embedded ``redis-server`` is started, and an
embedded Kafka-compatible broker when the topology names no ``kafka.bootstrap_servers``
(:mod:`topology.embedded`). The topology, with those URLs filled in, is written to a run directory
and each region's node runs as its own process, ``agent-reach node --topology RESOLVED --region
NAME``, exactly as it would in production. Nodes get the cluster secret through their
environment, run in their own session (a terminal's Ctrl-C reaches only the launcher, which
stops them in order: nodes first, then the broker and Redis) and are asked by the kernel to exit
if the launcher dies without cleaning up (Linux ``PR_SET_PDEATHSIG``).

Starting: each node is waited for until it answers ``/readyz``, for as long as its process runs
(:mod:`topology.launcher.startup`: a line every few seconds says what it is doing) or, with a
``node_start_timeout_s``, until that deadline.

Supervision: a node, redis-server or broker that dies on its own is restarted on the same port
with exponential backoff (:mod:`topology.launcher.supervisor`), while everything else keeps
serving. A deliberate stop (:meth:`LocalCluster.stop_node`, a service's ``stop()``,
:meth:`aclose`) is not undone.

Persistence: each embedded Redis keeps an append-only file, under ``data_dir/<region>/redis``
when a ``data_dir`` is given (kept across runs; locked against a second cluster), else in a
temporary directory removed by :meth:`aclose`. Either way a restarted redis-server comes back
with its data. The embedded broker keeps its topics in memory only; the federation's
anti-entropy heals a broker that lost them.

The tests and ``bench/federation.py`` use :class:`LocalCluster` to run, stop and restart nodes
and the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import logging
import os
import shutil
import signal
import socket
import ssl
import sys
import tempfile
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from node.core.models import TokenRole
from node.envconfig import without_per_node_settings
from node.trust import DEFAULT_TOKEN_TTL_S, SECRET_ENV, Signer, mask_url

from ..embedded import (
    DEFAULT_STOP_TIMEOUT_S,
    DataDirLock,
    EmbeddedKafka,
    EmbeddedRedis,
    EmbeddedServiceError,
    prepare_data_dir,
)
from ..errors import LauncherError
from ..process import ChildExit, die_with_parent_preexec
from ..spec import Topology
from .startup import DEFAULT_START_PROGRESS_INTERVAL_S, NodeLaunch, log_tail, wait_until_ready
from .supervisor import RestartPolicy, ServiceChild, Supervisor

__all__ = [
    "DEFAULT_NODE_DRAIN_TIMEOUT_MS",
    "DEFAULT_NODE_STOP_TIMEOUT_S",
    "TOPIC_KINDS",
    "ClusterState",
    "LauncherError",
    "LocalCluster",
    "NodeProcess",
    "busy_node_port",
]

log = logging.getLogger(__name__)

DEFAULT_NODE_STOP_TIMEOUT_S = 10.0
# What a stopping node gives its in-flight requests; nobody load-balances a local cluster, so
# its nodes skip the drain grace (readiness 503 before the listener closes).
DEFAULT_NODE_DRAIN_TIMEOUT_MS = 2_000
# Each region's topics, {topic_prefix}.<kind>.<region> (federation.config's topic names; docs/events.md).
TOPIC_KINDS = ("changes", "beacons", "summaries", "revocations", "acl")


class ClusterState(enum.Enum):
    """NEW → STARTING → RUNNING → CLOSED (``aclose`` from any state)."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSED = "closed"


@dataclass(slots=True)
class NodeProcess:
    """One region's node process; ``keep_running`` is whether its supervisor restarts it."""

    region: str
    url: str
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    keep_running: bool = False
    restarts: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None


class LocalCluster:
    """A topology run locally: embedded services where no URL is given, one node process per region.

    ``async with LocalCluster(topology, secret=…) as cluster`` starts everything and waits until
    every node answers ``/readyz``; leaving stops every process it started. Keyword-only
    options: ``any_port`` (nodes listen on free ports instead of the topology's), ``run_dir``
    (node logs and the resolved topology; default a temporary directory removed at the end),
    ``data_dir`` (keep the embedded Redis data there across runs; default a temporary one),
    ``supervise`` (restart children that die on their own; default on), ``restart_policy``,
    ``say`` (where the one-line supervision notices go, and what a node that is starting is doing;
    default the log, at WARNING and at INFO), ``node_start_timeout_s`` (how long a node may take to
    be ready; default None: as long as its process runs), ``start_progress_interval_s`` (how often
    a starting node's progress is said), ``node_stop_timeout_s`` (SIGTERM grace before SIGKILL),
    ``node_drain_timeout_ms`` (what a stopping node gives in-flight requests),
    ``service_stop_timeout_s`` (the same for the embedded servers).

    ``start()`` raises :class:`LauncherError` when a node or service does not start (a busy
    port included) and :class:`~topology.errors.DataDirError` when the data dir is unusable or
    in use; the caller then calls :meth:`aclose` (``async with`` does).
    """

    def __init__(self, topology: Topology, *, secret: bytes, any_port: bool = False, run_dir: Path | None = None,
                 data_dir: Path | None = None, log_level: str = "INFO", log_format: str = "text",
                 supervise: bool = True,
                 restart_policy: RestartPolicy | None = None, say: Callable[[str], None] | None = None,
                 node_start_timeout_s: float | None = None,
                 start_progress_interval_s: float = DEFAULT_START_PROGRESS_INTERVAL_S,
                 node_stop_timeout_s: float = DEFAULT_NODE_STOP_TIMEOUT_S,
                 node_drain_timeout_ms: int = DEFAULT_NODE_DRAIN_TIMEOUT_MS,
                 service_stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        for name, value in (("node_start_timeout_s", node_start_timeout_s),
                            ("start_progress_interval_s", start_progress_interval_s),
                            ("node_stop_timeout_s", node_stop_timeout_s),
                            ("service_stop_timeout_s", service_stop_timeout_s)):
            if value is not None and not value > 0:
                raise ValueError(f"LocalCluster {name} must be positive, got {value!r}")
        if node_drain_timeout_ms < 0:
            raise ValueError(f"LocalCluster node_drain_timeout_ms must be >= 0, got {node_drain_timeout_ms!r}")
        self.topology = topology
        self.secret = secret
        self.any_port = any_port
        self.log_level = log_level
        self.log_format = log_format
        self.supervise = supervise
        self.node_start_timeout_s = node_start_timeout_s
        self.start_progress_interval_s = start_progress_interval_s
        self.node_stop_timeout_s = node_stop_timeout_s
        self.node_drain_timeout_ms = node_drain_timeout_ms
        self.service_stop_timeout_s = service_stop_timeout_s
        self._own_run_dir = run_dir is None
        self.run_dir = run_dir or Path(tempfile.mkdtemp(prefix="agent-reach-up-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = data_dir
        self._ephemeral_data_dir: Path | None = None
        self._data_lock: DataDirLock | None = None
        self.resolved: Topology = topology
        self.topology_file = self.run_dir / "topology.json"
        self.redis: dict[str, EmbeddedRedis] = {}
        self.kafka: EmbeddedKafka | None = None
        self.nodes: dict[str, NodeProcess] = {}
        self.state = ClusterState.NEW
        self.supervisor = Supervisor(policy=restart_policy, say=say)
        self._say_progress = say or log.info
        self._node_watchers: dict[str, asyncio.Task[None]] = {}

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
        """Start embedded services, write the resolved topology, start every node and wait for them.

        Cancelling it leaves what was started for :meth:`aclose` to stop.
        """
        if self.state is not ClusterState.NEW:
            raise LauncherError(f"this cluster was already started (state {self.state.value}); create a new one")
        self.state = ClusterState.STARTING
        if not self.any_port:
            _check_ports_free(self.topology)
        data_root = self._data_root()
        regions = []
        for region in self.topology.regions:
            update: dict[str, object] = {}
            if region.redis_url is None:
                server = EmbeddedRedis(data_dir=data_root / region.name / "redis",
                                       stop_timeout_s=self.service_stop_timeout_s)
                self.redis[region.name] = server
                await self._start_service(server, f"the Redis of region {region.name}")
                update["redis_url"] = server.url
            if self.any_port:
                update["node_urls"] = [_with_port(region.node_urls[0], _free_port()), *region.node_urls[1:]]
            regions.append(region.model_copy(update=update))
        kafka = self.topology.kafka
        if kafka.bootstrap_servers is None:
            self.kafka = EmbeddedKafka(stop_timeout_s=self.service_stop_timeout_s)
            await self._start_service(self.kafka, "the Kafka broker")
            kafka = kafka.model_copy(update={"bootstrap_servers": self.kafka.bootstrap_servers})
        self.resolved = self.topology.model_copy(update={"regions": regions, "kafka": kafka})
        self.topology_file.write_text(self.resolved.model_dump_json(indent=2))
        for region in self.resolved.regions:
            self.nodes[region.name] = NodeProcess(region.name, region.node_urls[0].rstrip("/"),
                                                  self.run_dir / f"{region.name}.log")
        await _all_or_none([self.start_node(name) for name in self.nodes])
        self.state = ClusterState.RUNNING

    async def aclose(self) -> None:
        """Stop supervising, then stop every node, then the broker and Redis; idempotent."""
        if self.state is ClusterState.CLOSED:
            return
        self.state = ClusterState.CLOSED
        # First: nothing may be restarted while it is being stopped.
        await self.supervisor.aclose()
        await asyncio.gather(*(self.stop_node(name) for name in self.nodes), return_exceptions=True)
        services = [*([self.kafka] if self.kafka is not None else []), *self.redis.values()]
        await asyncio.gather(*(service.aclose() for service in services), return_exceptions=True)
        if self._data_lock is not None:
            self._data_lock.release()
        if self._ephemeral_data_dir is not None:
            shutil.rmtree(self._ephemeral_data_dir, ignore_errors=True)
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    async def start_node(self, region: str) -> NodeProcess:
        """Start (or restart) the node of ``region``, wait until it answers ``/readyz`` and supervise it.

        Raises :class:`LauncherError` if it exits while starting, or is not ready within the start
        timeout when one is set (the process is killed then).
        """
        node = self.nodes[region]
        node.keep_running = True
        await self._launch(node)
        if self.supervise and self.state is not ClusterState.CLOSED:
            watcher = self._node_watchers.get(region)
            if watcher is None or watcher.done():
                self._node_watchers[region] = self.supervisor.watch(_NodeChild(self, node))
        return node

    async def stop_node(self, region: str, *, kill: bool = False) -> None:
        """Stop the node of ``region`` for good: SIGTERM (SIGKILL with ``kill`` or after the stop timeout).

        It is not restarted until :meth:`start_node` is called again.
        """
        node = self.nodes[region]
        node.keep_running = False
        await self.supervisor.stop_watching(self._node_watchers.pop(region, None))
        async with node.lock:
            process = node.process
            if process is None or process.returncode is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout=self.node_stop_timeout_s)
            except TimeoutError:
                log.warning("node of region %s did not stop within %.1f s; killing it", region,
                            self.node_stop_timeout_s)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()

    async def wait_any_exit(self) -> NodeProcess:
        """Return the first node process that exits (deliberately or not)."""
        waits = {asyncio.ensure_future(node.process.wait()): node
                 for node in self.nodes.values() if node.process is not None}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            return waits[next(iter(done))]
        finally:
            for future in waits:
                future.cancel()

    # -- information -------------------------------------------------------------------------

    def admin_token(self, *, ttl_s: int = DEFAULT_TOKEN_TTL_S) -> str:
        return Signer(self.secret).issue("admin", TokenRole.ADMIN, ttl_s=ttl_s)

    def url(self, region: str) -> str:
        return self.nodes[region].url

    def ssl_context(self, region: str) -> ssl.SSLContext | bool:
        """What ``region``'s node is checked against over https: its ``ca_file`` and client
        certificate (the topology's, else ``$AGENT_REACH_CA_FILE`` …), as its peers check it."""
        return self.resolved.node_config(region).with_environment().client_ssl_context()

    def summary(self) -> str:
        """What runs where, one line per service; passwords in URLs are masked."""
        lines = []
        kafka = self.resolved.kafka.bootstrap_servers
        prefix = self.resolved.kafka.topic_prefix
        lines.append(f"  kafka {mask_url(kafka)}{' (embedded)' if self.kafka else ''}  topics "
                     f"{prefix}.{{{','.join(TOPIC_KINDS)}}}.<region>")
        for region in self.resolved.regions:
            node = self.nodes[region.name]
            server = self.redis.get(region.name)
            embedded = f" (embedded, data {server.data_dir})" if server is not None else ""
            lines.append(f"  region {region.name}  url {node.url}  redis {mask_url(region.redis_url)}{embedded}  "
                         f"log {node.log_path}")
        return "\n".join(lines)

    def log_tail(self, region: str) -> str:
        return log_tail(self.nodes[region].log_path)

    # -- internals ---------------------------------------------------------------------------

    def _data_root(self) -> Path:
        if self.data_dir is None or all(region.redis_url is not None for region in self.topology.regions):
            self._ephemeral_data_dir = Path(tempfile.mkdtemp(prefix="agent-reach-data-"))
            return self._ephemeral_data_dir
        root = prepare_data_dir(self.data_dir)
        self._data_lock = DataDirLock(root)
        self._data_lock.acquire()
        return root

    async def _start_service(self, service: EmbeddedRedis | EmbeddedKafka, name: str) -> None:
        try:
            await service.start()
        except EmbeddedServiceError as exc:
            raise LauncherError(f"cannot start an embedded server for {name}: {exc}") from exc
        if self.supervise:
            self.supervisor.watch(ServiceChild(service, name))

    async def _launch(self, node: NodeProcess) -> int:
        """Spawn the node unless it runs and wait until it is ready; kill it if that fails."""
        async with node.lock:
            if node.running and node.process is not None:
                return node.process.pid
            env = {**without_per_node_settings(os.environ), SECRET_ENV: self.secret.decode()}
            command = [sys.executable, "-m", "topology.cli", "--log-level", self.log_level,
                       "--log-format", self.log_format, "node",
                       "--topology", str(self.topology_file), "--region", node.region,
                       "--drain-grace-ms", "0", "--drain-timeout-ms", str(self.node_drain_timeout_ms),
                       "--say-start-phases"]
            with open(node.log_path, "ab") as log_file:
                log_offset = log_file.tell()
                process = await asyncio.create_subprocess_exec(
                    *command, stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=env,
                    start_new_session=True, preexec_fn=die_with_parent_preexec())
            node.process = process
            try:
                await wait_until_ready(NodeLaunch(region=node.region, url=node.url, process=process,
                                                  log_path=node.log_path, log_offset=log_offset),
                                       timeout_s=self.node_start_timeout_s,
                                       progress_interval_s=self.start_progress_interval_s, say=self._say_progress,
                                       log_kept=not self._own_run_dir, ssl_context=self.ssl_context(node.region))
            except BaseException:
                # A half-started node has nothing to drain; it must not linger as a second copy.
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
                raise
            return process.pid


class _NodeChild:
    """A region's node process as a supervised child of its cluster."""

    def __init__(self, cluster: LocalCluster, node: NodeProcess) -> None:
        self._cluster = cluster
        self._node = node

    @property
    def name(self) -> str:
        return f"the node of region {self._node.region}"

    async def wait_for_death(self) -> ChildExit | None:
        process = self._node.process
        if process is None:
            return None
        returncode = await process.wait()
        if not self._node.keep_running or self._cluster.state is ClusterState.CLOSED:
            return None
        return ChildExit(pid=process.pid, returncode=returncode)

    def needs_restart(self) -> bool:
        return self._node.keep_running and not self._node.running and self._cluster.state is not ClusterState.CLOSED

    async def restart(self) -> int:
        pid = await self._cluster._launch(self._node)
        self._node.restarts += 1
        return pid


async def _all_or_none(starts: list[Coroutine[Any, Any, object]]) -> None:
    """Run ``starts`` concurrently; when one fails, cancel the others (their cleanup runs) and raise
    its error — the first one's, not an ExceptionGroup, so callers see the LauncherError."""
    tasks = [asyncio.ensure_future(start) for start in starts]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error


def busy_node_port(topology: Topology) -> str | None:
    """The first region whose node port is taken, in words (``port 7101 of region us-east
    (http://127.0.0.1:7101) is in use``); None when every node can listen where its URL says."""
    for region in topology.regions:
        parts = urlsplit(region.node_urls[0])
        host, port = parts.hostname or "127.0.0.1", parts.port
        if port is None:
            continue
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return f"port {port} of region {region.name} ({region.node_urls[0]}) is in use"
                # Any other problem (an address not on this machine …) is the node's to report.
    return None


def _check_ports_free(topology: Topology) -> None:
    """Fail early, in one line, when a region's node port is taken (rather than in a node's log)."""
    busy = busy_node_port(topology)
    if busy is not None:
        raise LauncherError(f"{busy}; stop what listens there, or run 'agent-reach up --any-port'")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:{port}"))
