"""``agent-reach up`` (what ``make up`` runs): the packaged three-region topology from nothing,
resolvable across regions, and stopped by Ctrl-C (SIGINT) with no process left behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from .helpers import alive, descendants, registration, wait_for

pytestmark = pytest.mark.timeout(120)

STARTUP_DEADLINE_S = 60.0
STOP_DEADLINE_S = 30.0
REGION_LINE = re.compile(r"^\s+region (\S+)\s+url (\S+)")
TOKEN_LINE = re.compile(r"^admin token \(24 h\): (\S+)")


async def test_up_runs_three_regions_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "AGENT_REACH_SECRET": "up-test-secret-0123456789abcdef"}
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "topology.cli", "--log-level", "WARNING", "up", "--any-port",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
    assert process.stdout is not None
    urls: dict[str, str] = {}
    token = None
    output: list[str] = []
    try:
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while True:
            line = await asyncio.wait_for(process.stdout.readline(), timeout=max(0.1, deadline - time.monotonic()))
            if not line:
                raise AssertionError("agent-reach up exited while starting:\n" + "".join(output))
            text = line.decode()
            output.append(text)
            if match := REGION_LINE.match(text):
                urls[match.group(1)] = match.group(2)
            if match := TOKEN_LINE.match(text):
                token = match.group(1)
            if text.startswith("Ctrl-C stops everything"):
                break
        print(f"\nagent-reach up: {len(urls)} regions ready in {time.perf_counter() - started:.1f} s")
        assert set(urls) == {"us-east", "us-west", "eu-west"}
        assert token is not None
        tree = descendants(process.pid)
        assert len(tree) >= 7, f"expected 3 nodes, 3 redis-servers and a broker under up, found {len(tree)}"

        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as session:
            body = registration("demo.translate.east_01", capability="translate.text", lease_ttl_ms=60_000)
            async with session.post(urls["us-east"] + "/v1/agents", json=body) as response:
                assert response.status == 201, await response.text()
            sent = time.perf_counter()

            async def remote_ticket() -> dict | None:
                request = {"capability": "translate.text"}
                async with session.post(urls["eu-west"] + "/v1/resolve", json=request) as reply:
                    return await reply.json() if reply.status == 200 else None

            ticket = await wait_for(remote_ticket, timeout_s=10, interval_s=0.005, message="resolvable from eu-west")
            print(f"registered in us-east, resolvable from eu-west after {(time.perf_counter() - sent) * 1000:.0f} ms")
            assert ticket["locality"] == "remote" and ticket["target"]["region"] == "us-east"

        process.send_signal(signal.SIGINT)
        stopping = time.perf_counter()
        rest, _ = await asyncio.wait_for(process.communicate(), timeout=STOP_DEADLINE_S)
        output.append(rest.decode())
        print(f"SIGINT -> exited with {process.returncode} in {time.perf_counter() - stopping:.2f} s")
        assert process.returncode == 0, "".join(output)
        survivors = [pid for pid in tree if alive(pid)]
        assert not survivors, f"processes left behind: {survivors}"
        assert "agent-reach up: stopped" in "".join(output)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# -- Ctrl-C at any moment ----------------------------------------------------------------------

CTRL_C_DEADLINE_S = 5.0
MOMENT_DEADLINE_S = 90.0


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class UpRun:
    """``agent-reach up`` in its own process group, its output collected and its process tree tracked."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self.tree: set[int] = set()
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def spawn(cls, tmp_path: Path, *args: str) -> UpRun:
        env = {**os.environ, "HOME": str(tmp_path), "AGENT_REACH_SECRET": "up-test-secret-0123456789abcdef"}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "topology.cli", "--log-level", "WARNING", "up", "--any-port", "--ephemeral", *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True)
        return cls(process)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            self.lines.append(line.decode(errors="replace"))

    def track(self) -> set[int]:
        self.tree |= descendants(self.process.pid)
        return self.tree

    async def until(self, condition: Any, what: str) -> None:
        deadline = time.monotonic() + MOMENT_DEADLINE_S
        while not condition():
            self.track()
            assert self.process.returncode is None, f"up exited before {what}:\n{self.output}"
            assert time.monotonic() < deadline, f"never saw {what}:\n{self.output}"
            await asyncio.sleep(0.01)
        self.track()

    def has_child(self, fragment: str) -> bool:
        return any(fragment in cmdline(pid) for pid in self.track())

    async def ctrl_c(self) -> float:
        """SIGINT to the whole group, as a terminal's Ctrl-C; returns the seconds until up exited."""
        self.track()
        os.killpg(self.process.pid, signal.SIGINT)
        sent = time.monotonic()
        while self.process.returncode is None and time.monotonic() - sent < 30:
            self.track()  # children started while stopping count too
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.process.wait(), timeout=0.02)
        took = time.monotonic() - sent
        await asyncio.wait_for(self._reader, timeout=10)
        return took

    @property
    def output(self) -> str:
        return "".join(self.lines)

    async def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            await self.process.wait()
        for pid in self.tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._reader.cancel()


MOMENTS = [
    ("plain", "immediately"), ("plain", "nodes starting"), ("plain", "running"),
    ("demo", "immediately"), ("demo", "nodes starting"), ("demo", "demo starting"), ("demo", "running"),
]


@pytest.mark.parametrize(("mode", "moment"), MOMENTS,
                         ids=[f"{mode}-{moment.replace(' ', '-')}" for mode, moment in MOMENTS])
async def test_ctrl_c_at_any_moment_stops_everything_within_5_s(tmp_path: Path, mode: str, moment: str) -> None:
    run = await UpRun.spawn(tmp_path, *(["--demo"] if mode == "demo" else []))
    try:
        if moment == "nodes starting":
            await run.until(lambda: run.has_child(" node --topology "), "a node process")
        elif moment == "demo starting":
            await run.until(lambda: run.has_child("examples."), "a demo agent process")
        elif moment == "running":
            await run.until(lambda: "Ctrl-C stops everything" in run.output, "'Ctrl-C stops everything'")
        children = len(run.tree)
        took = await run.ctrl_c()
        print(f"\nup{' --demo' if mode == 'demo' else ''}: Ctrl-C {moment} ({children} children) -> "
              f"exit {run.process.returncode} after {took:.2f} s")
        assert took < CTRL_C_DEADLINE_S, f"up took {took:.1f} s to stop:\n{run.output}"
        survivors = [f"{pid} {cmdline(pid)}" for pid in run.tree if alive(pid)]
        assert not survivors, f"left behind: {survivors}\n{run.output}"
        if moment == "running":
            assert run.process.returncode == 0, run.output
        elif moment != "immediately":
            assert run.process.returncode == 130, run.output
            assert "Traceback" not in run.output, run.output
    finally:
        await run.kill()
