"""Data directories: where an embedded Redis keeps its append-only file, guarded by a lock file.

Layout (defaults; ``--data-dir`` chooses another place, ``--ephemeral`` a temporary one)::

    ~/.agent-reach/data/<region>/            agent-reach node --region <region>
        agent-reach.lock                     held while a node uses the directory
        redis/                               the embedded redis-server's files
            agent-reach.lock                 held while that redis-server runs
            appendonly.aof
    ~/.agent-reach/up/<topology name>/       agent-reach up
        agent-reach.lock
        <region>/redis/…                     one embedded Redis per region

A lock is an exclusive ``flock`` on the directory's ``agent-reach.lock``: the kernel drops it
when its holder dies, so a crash never leaves a stale lock behind. The holder's pid is written
into the file, for the error message of the process that finds it taken.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

from ..errors import DataDirError

__all__ = [
    "AGENT_REACH_HOME",
    "LOCK_FILE_NAME",
    "DataDirError",
    "DataDirLock",
    "default_node_data_dir",
    "default_up_data_dir",
    "prepare_data_dir",
]

AGENT_REACH_HOME = Path("~/.agent-reach")
LOCK_FILE_NAME = "agent-reach.lock"
_UNSAFE_PATH_CHARACTERS = re.compile(r"[^A-Za-z0-9._-]+")


def default_node_data_dir(region: str) -> Path:
    """``~/.agent-reach/data/<region>``: where ``agent-reach node`` keeps its embedded Redis."""
    return (AGENT_REACH_HOME / "data" / _path_part(region)).expanduser()


def default_up_data_dir(topology_name: str) -> Path:
    """``~/.agent-reach/up/<topology name>``: where ``agent-reach up`` keeps its regions' Redis."""
    return (AGENT_REACH_HOME / "up" / _path_part(topology_name)).expanduser()


def _path_part(name: str) -> str:
    part = _UNSAFE_PATH_CHARACTERS.sub("_", name).strip(".")
    return part or "default"


def prepare_data_dir(path: str | Path) -> Path:
    """Create ``path`` (mode 0700, parents too) if missing and check it can be written.

    Raises:
        DataDirError: it cannot be created, is not a directory, or is not writable.
    """
    directory = Path(path).expanduser()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise DataDirError(f"data dir {directory} exists but is not a directory; "
                           "remove it or choose another --data-dir") from exc
    except OSError as exc:
        raise DataDirError(f"cannot create the data dir {directory}: {exc.strerror or exc}; "
                           "choose a writable --data-dir (or --ephemeral)") from exc
    try:
        # A real write, not os.access: it also catches read-only mounts and full disks.
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise DataDirError(f"the data dir {directory} is not writable: {exc.strerror or exc}; "
                           "fix its permissions or choose another --data-dir (or --ephemeral)") from exc
    return directory


class DataDirLock:
    """An exclusive lock on a directory, so two servers never share one (``with DataDirLock(d):``).

    ``acquire()`` raises :class:`DataDirError` at once when another process holds it (no
    waiting). ``fileno`` is the locked file descriptor: a child given it (``pass_fds``) keeps
    the directory locked for as long as it lives, even if this process dies first.
    """

    def __init__(self, directory: str | Path, *, what: str = "data dir") -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE_NAME
        self._what = what
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    @property
    def fileno(self) -> int:
        """The locked descriptor; raises DataDirError unless the lock is held."""
        if self._fd is None:
            raise DataDirError(f"the lock on {self.directory} is not held: call acquire() first")
        return self._fd

    def acquire(self) -> None:
        """Take the lock (idempotent); raises :class:`DataDirError` if it is taken or cannot be made."""
        if self._fd is not None:
            return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise DataDirError(f"cannot create the lock file {self.path}: {exc.strerror or exc}; "
                               "fix the permissions of the data dir or choose another --data-dir") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DataDirError(
                    f"the {self._what} {self.directory} is in use by another agent-reach process"
                    f"{f' (pid {holder})' if holder else ''}; stop it, or give this one another --data-dir "
                    "(or --ephemeral)") from exc
            raise DataDirError(f"cannot lock {self.path}: {exc.strerror or exc}") from exc
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (idempotent). The file stays: removing it would race a new holder."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""
