"""Child processes of ``agent-reach`` (embedded servers, a cluster's nodes): how one ended, dying with us.

Shared by :mod:`topology.embedded` (the servers it spawns) and :mod:`topology.launcher` (node
processes and their supervision).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ChildExit", "die_with_parent_preexec"]


@dataclass(frozen=True, slots=True)
class ChildExit:
    """How a child process ended: its pid and its return code (negative: killed by that signal)."""

    pid: int
    returncode: int

    def describe(self) -> str:
        """``"pid 4242 was killed by SIGKILL"`` or ``"pid 4242 exited with code 1"``."""
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"pid {self.pid} was killed by {name}"
        return f"pid {self.pid} exited with code {self.returncode}"


def die_with_parent_preexec(signum: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to send ``signum`` to the child when its parent dies.

    Linux only (``PR_SET_PDEATHSIG``); None elsewhere. The kernel sends it when the *thread*
    that forked the child exits, so it is only offered on the main thread, whose end is the
    process's end.
    """
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None

    def preexec() -> None:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, int(signum))

    return preexec
