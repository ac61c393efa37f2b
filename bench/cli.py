"""How fast the command line starts: ``agent-reach --version`` and ``agent-reach agents list``
against a dead node, next to a bare ``python -c pass`` of the same interpreter, run alternately.

Targets (issue 27): ``--version`` within 4 × the bare interpreter + 60 ms, ``agents list``
against a node that refuses the connection within 4 × + 250 ms. Each figure is the median wall
time of ``--runs`` fresh processes; the three commands take turns so that a busy moment of the
shared machine falls on all of them.

    python -m bench.cli [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

VERSION_TARGET = (4.0, 0.060)  # × bare, + seconds
LIST_TARGET = (4.0, 0.250)


def _command_line() -> list[str]:
    """The installed ``agent-reach`` beside this interpreter, else ``python -m topology.cli``."""
    script = Path(sys.executable).with_name("agent-reach")
    return [str(script)] if script.exists() else [sys.executable, "-m", "topology.cli"]


def _seconds(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)
    return time.perf_counter() - started


def measure(runs: int) -> dict[str, float]:
    """The median seconds of each command over ``runs`` alternated runs."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("AGENT_REACH_")}
    with socket.socket() as dead:  # bound, never listening: a connection is refused at once
        dead.bind(("127.0.0.1", 0))
        node = f"http://127.0.0.1:{dead.getsockname()[1]}"
        cli = _command_line()
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "agent-reach --version": [*cli, "--version"],
            "agent-reach agents list (dead node)": [*cli, "agents", "list", "--node", node, "--token", "x"],
        }
        for argv in commands.values():  # warm the file cache once
            _seconds(argv, env)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(runs):
            for name, argv in commands.items():
                times[name].append(_seconds(argv, env))
    return {name: statistics.median(values) for name, values in times.items()}


def report(medians: dict[str, float], runs: int) -> str:
    bare, version, listing = medians.values()
    lines = [f"medians of {runs} alternated runs ({sys.executable})"]
    for (name, seconds), target in zip(medians.items(), (None, VERSION_TARGET, LIST_TARGET)):
        line = f"  {name:<38} {seconds * 1000:7.1f} ms  {seconds / bare:5.2f} × bare"
        if target is not None:
            limit = target[0] * bare + target[1]
            verdict = "meets" if seconds <= limit else "MISSES"
            line += f"   target {target[0]:g} × bare + {target[1] * 1000:.0f} ms = {limit * 1000:.1f} ms: {verdict}"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each command (default 15)")
    args = parser.parse_args()
    print(report(measure(args.runs), args.runs))


if __name__ == "__main__":
    main()
