"""Waiting for a node process to start: until its ``/readyz`` answers 200, it exits, or a deadline
passes (only when one was set) — saying every few seconds what the node is doing.

No deadline by default: a node on a busy machine may take minutes to import its modules and load
the model, and giving up then stops a cluster that was about to run. A node bounds what it waits
for itself and exits when it cannot start; that exit is reported at once, with its log's last lines.

What the node is doing comes from what it can tell. Started with ``--say-start-phases`` it prints
a line as it enters each phase of its start (:func:`phase_line`: ``starting: loading the model``),
read back here from its log; once it listens, its ``/readyz`` answer (the node's state and its
store's) says why it is not ready yet. Before its first line it is still starting the process
(Python importing its modules).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from ..errors import LauncherError

__all__ = ["DEFAULT_START_PROGRESS_INTERVAL_S", "PHASE_PREFIX", "NodeLaunch", "log_tail", "phase_line",
           "wait_until_ready"]

DEFAULT_START_PROGRESS_INTERVAL_S = 5.0
PHASE_PREFIX = "starting: "
LOG_TAIL_LINES = 30
_POLL_INTERVAL_S = 0.05
_READYZ_TIMEOUT = aiohttp.ClientTimeout(total=1.0)


def phase_line(phase: str) -> str:
    """The line a starting node prints as it enters ``phase`` (``loading the model``)."""
    return f"{PHASE_PREFIX}{phase}"


def log_tail(path: Path, *, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of the log at ``path``, or ``(no output)``."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no output)"
    return "\n".join(text[-lines:]) or "(no output)"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLaunch:
    """One launch of a region's node process; its output starts at ``log_offset`` of ``log_path``
    (the log is appended to across restarts)."""

    region: str
    url: str
    process: asyncio.subprocess.Process
    log_path: Path
    log_offset: int

    def last_phase(self) -> str | None:
        """The phase this launch said last, if it said one yet."""
        try:
            with self.log_path.open("rb") as log_file:
                log_file.seek(self.log_offset)
                text = log_file.read().decode(errors="replace")
        except OSError:
            return None
        phase = None
        for line in text.splitlines():
            if line.startswith(PHASE_PREFIX):
                phase = line.removeprefix(PHASE_PREFIX).strip()
        return phase


async def wait_until_ready(launch: NodeLaunch, *, timeout_s: float | None, progress_interval_s: float,
                           say: Callable[[str], None], log_kept: bool,
                           ssl_context: ssl.SSLContext | bool = True) -> None:
    """Poll ``launch``'s ``/readyz`` until it answers 200; ``say`` a progress line every
    ``progress_interval_s`` meanwhile (none for a node ready sooner). An https node is checked
    against ``ssl_context`` (the region's ``ca_file`` and client certificate).

    Raises :class:`LauncherError` when the process exits (its exit code, its own error line and
    the last lines of its log) or, with a ``timeout_s``, when it is not ready by then (one line;
    it names the log when ``log_kept``). The caller kills the process after either.
    """
    started = time.monotonic()
    next_progress = started + progress_interval_s
    unready: tuple[int, dict[str, object]] | None = None
    async with aiohttp.ClientSession(timeout=_READYZ_TIMEOUT,
                                     connector=aiohttp.TCPConnector(ssl=ssl_context)) as session:
        while True:
            returncode = launch.process.returncode
            if returncode is not None:
                tail = log_tail(launch.log_path)
                raise LauncherError(f"the node of region {launch.region} exited with code {returncode} while "
                                    f"starting{_own_error(tail)}\nthe last lines of its log:\n{tail}")
            answer = await _readiness(session, launch.url)
            if answer is not None and answer[0] == 200:
                return
            unready = answer
            now = time.monotonic()
            if timeout_s is not None and now - started > timeout_s:
                where = f"; its log: {launch.log_path}" if log_kept else ""
                raise LauncherError(f"the node of region {launch.region} was not ready at {launch.url} within "
                                    f"{timeout_s:g} s (last seen: {_doing(launch, unready)}); give it longer "
                                    f"(--start-timeout-s), or no deadline to wait while it runs{where}")
            if now >= next_progress:
                say(f"waiting for region {launch.region} ({launch.url}): {_doing(launch, unready)} "
                    f"{now - started:.0f} s")
                next_progress = now + progress_interval_s
            await asyncio.sleep(_POLL_INTERVAL_S)


async def _readiness(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, object]] | None:
    """``/readyz``'s status and JSON body; None while nothing answers there."""
    try:
        async with session.get(f"{url}/readyz") as response:
            body: object = {}
            with contextlib.suppress(aiohttp.ContentTypeError, ValueError):
                body = await response.json(content_type=None)
            return response.status, body if isinstance(body, dict) else {}
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None


def _doing(launch: NodeLaunch, unready: tuple[int, dict[str, object]] | None) -> str:
    """What the node is doing, for a progress line: its ``/readyz`` answer once it listens, else
    the phase it said last."""
    if unready is not None:
        status, body = unready
        if body.get("store") == "disconnected":
            return "listening, but its Redis is unreachable"
        if body.get("state") == "draining":
            return "listening, but draining (it was asked to stop)"
        return f"listening, not ready yet (/readyz {status}: node {body.get('state')}, store {body.get('store')})"
    phase = launch.last_phase()
    return f"{phase}…" if phase else "starting the process…"


def _own_error(tail: str) -> str:
    """``": <the node's own error line>"`` when its log ends with one."""
    for line in reversed(tail.splitlines()):
        if line.startswith("error: "):
            return f": {line.removeprefix('error: ')}"
    return ""
