"""``agent-reach node --workers N``: N node processes of one region on one port.

Python runs one request at a time per process; a server with more cores runs more processes.
The parent starts N children, each a whole node (``agent-reach node`` with the same arguments
and ``--workers 1``) listening on the same address with SO_REUSEPORT, so the kernel spreads new
connections over them. They share what a region's replicas always share: the region's Redis
(records, leases, the change stream, the leader lease — one of them runs the sweeper and the
prober), the token deny list and the published signing keys; each keeps its own cache, tails
the stream and answers on its own. So workers need the region's Redis by URL (``--redis`` or
the topology's) and a fixed port.

The parent forwards SIGINT/SIGTERM to every child (each drains as a single node does) and
exits when they have; a child that exits while no stop was asked for is started again after
:data:`RESTART_DELAY_S` (its log says why it stopped). Exit status: that of the first child
that failed during a stop, else 0.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from types import FrameType

from . import console

__all__ = ["RESTART_DELAY_S", "child_argv", "run_workers", "workers_problem"]

log = logging.getLogger(__name__)

RESTART_DELAY_S = 1.0
_POLL_S = 0.2


def workers_problem(*, workers: int, redis_url: str | None, port: int | None) -> str | None:
    """Why ``--workers`` cannot run with these settings, or None."""
    if workers < 1:
        return "--workers must be at least 1"
    if workers == 1:
        return None
    if redis_url is None:
        return ("--workers needs the region's Redis by URL (--redis URL or the topology's redis): an embedded "
                "Redis belongs to one process")
    if port == 0:
        return "--workers needs a fixed port (the workers share it); drop --port 0"
    return None


def child_argv(argv: list[str]) -> list[str]:
    """The parent's ``node`` arguments with ``--workers N`` replaced by one worker on a shared port."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--workers":
            skip = True
            continue
        if arg.startswith("--workers="):
            continue
        out.append(arg)
    return [*out, "--workers", "1", "--reuse-port"]


def run_workers(workers: int, argv: list[str]) -> int:
    """Run ``workers`` children of ``agent-reach`` with ``argv`` (the parent's arguments) until a signal."""
    command = [sys.executable, "-m", "topology.cli", *child_argv(argv)]
    children: list[subprocess.Popen[bytes]] = [subprocess.Popen(command) for _ in range(workers)]
    stopping: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    console.say(f"agent-reach node: {workers} workers (pids {', '.join(str(c.pid) for c in children)})")
    try:
        while True:
            if stopping:
                status = 0
                for child in children:
                    code = child.wait()
                    if code not in (0, -signal.SIGTERM, -signal.SIGINT) and status == 0:
                        status = code if code > 0 else 1
                return status
            for position, child in enumerate(children):
                code = child.poll()
                if code is not None and not stopping:
                    console.error(f"worker {child.pid} exited with status {code}; starting another in "
                                  f"{RESTART_DELAY_S:g} s")
                    time.sleep(RESTART_DELAY_S)
                    if not stopping:
                        children[position] = subprocess.Popen(command)
            time.sleep(_POLL_S)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
