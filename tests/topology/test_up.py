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

from ..helpers import alive, descendants, registration, wait_for

pytestmark = pytest.mark.timeout(120)

STARTUP_DEADLINE_S = 60.0
STOP_DEADLINE_S = 30.0
REGION_LINE = re.compile(r"^\s+region (\S+)\s+url (\S+)")
TOKEN_LINE = re.compile(r"^admin token \(valid 30 days\): (\S+)")
CONSOLE_LINE = re.compile(r"^  console (\S+)  (\S+)$")


async def test_up_runs_three_regions_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "AGENT_REACH_SECRET": "up-test-secret-0123456789abcdef"}
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "topology.cli", "--log-level", "WARNING", "up", "--any-port",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
    assert process.stdout is not None
    urls: dict[str, str] = {}
    token = None
    consoles: dict[str, str] = {}
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
            if match := CONSOLE_LINE.match(text):
                consoles[match.group(1)] = match.group(2)
            if text.startswith("Ctrl-C stops everything"):
                break
        print(f"\nagent-reach up: {len(urls)} regions ready in {time.perf_counter() - started:.1f} s")
        assert set(urls) == {"us-east", "us-west", "eu-west"}
        assert token is not None
        # A signed-in console link per node: the admin token in the fragment.
        assert consoles == {region: f"{url}/ui/#token={token}" for region, url in urls.items()}
        tree = descendants(process.pid)
        assert len(tree) >= 7, f"expected 3 nodes, 3 redis-servers and a broker under up, found {len(tree)}"

        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as session:
            async with session.get(consoles["eu-west"].partition("#")[0]) as response:
                assert response.status == 200 and response.content_type == "text/html"
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
            await run.until(lambda: run.has_child("topology.demo."), "a demo agent process")
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


# -- kill -9 of any child ----------------------------------------------------------------------

KILL_TOPOLOGY = """
name = "kill-test"
[federation]
beacon_interval_ms = 200
stale_after_ms = 1500
[node]
semantic_enabled = false
sweep_interval_ms = 200
leader_ttl_ms = 1000
[[regions]]
name = "ka"
node_urls = ["http://127.0.0.1:1"]
policy = { egress = { allow = ["loopback"] } }
[[regions]]
name = "kb"
node_urls = ["http://127.0.0.1:2"]
policy = { egress = { allow = ["loopback"] } }
[[regions]]
name = "kc"
node_urls = ["http://127.0.0.1:3"]
policy = { egress = { allow = ["loopback"] } }
"""
KILL_DEADLINE_S = 45.0


def _children(run: UpRun, fragment: str) -> list[int]:
    return sorted(pid for pid in descendants(run.process.pid) if fragment in cmdline(pid) and alive(pid))


async def test_kill_9_of_any_child_of_up_the_others_answer_and_it_comes_back(tmp_path: Path) -> None:
    topology = tmp_path / "kill.toml"
    topology.write_text(KILL_TOPOLOGY)
    run = await UpRun.spawn(tmp_path, str(topology))
    try:
        await run.until(lambda: "Ctrl-C stops everything" in run.output, "'Ctrl-C stops everything'")
        urls = {match.group(1): match.group(2) for line in run.lines if (match := REGION_LINE.match(line))}
        token = next(match.group(1) for line in run.lines if (match := TOKEN_LINE.match(line)))
        assert set(urls) == {"ka", "kb", "kc"}, run.output
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=2)) as session:

            async def status(region: str, path: str) -> int:
                try:
                    async with session.get(urls[region] + path) as response:
                        return response.status
                except (aiohttp.ClientError, TimeoutError):
                    return 0

            async def outage(victim: str, fragment: str, *, others: list[str], back: Any) -> float:
                """kill -9 one child; poll the other regions throughout; seconds until it is back."""
                before = _children(run, fragment)
                pid = next(pid for pid in before if victim in cmdline(pid))
                os.kill(pid, signal.SIGKILL)
                killed = time.monotonic()
                polls = 0
                while True:
                    assert time.monotonic() - killed < KILL_DEADLINE_S, f"{fragment} not back:\n{run.output}"
                    for region in others:
                        answered = await status(region, "/healthz")
                        assert answered == 200, f"{region} did not answer while {fragment} was down"
                    polls += 1
                    now = _children(run, fragment)
                    if pid not in now and len(now) == len(before) and await back():
                        break
                    await asyncio.sleep(0.02)
                took = time.monotonic() - killed
                print(f"\nkill -9 {fragment} ({victim or 'any'}): back after {took:.2f} s, {polls} polls of {others}")
                return took

            async def all_ready() -> bool:
                return all([await status(region, "/readyz") == 200 for region in urls])

            # One region's node: the other two answer throughout; it is ready again.
            await outage("--region ka", " node --topology ", others=["kb", "kc"], back=all_ready)
            # A redis-server (whichever region's): every node still answers; all ready again.
            await outage("", "redis-server", others=["ka", "kb", "kc"], back=all_ready)
            # The broker: every node answers; federation carries a new registration again.
            body = registration("kill.test.after", capability="kill.cap", lease_ttl_ms=600_000)

            async def federates() -> bool:
                async with session.post(urls["ka"] + "/v1/agents", json=body) as response:
                    if response.status not in (200, 201):
                        return False
                async with session.post(urls["kc"] + "/v1/resolve", json={"capability": "kill.cap"}) as reply:
                    return reply.status == 200

            await outage("", "tansu", others=["ka", "kb", "kc"], back=federates)
        took = await run.ctrl_c()
        assert run.process.returncode == 0 and took < CTRL_C_DEADLINE_S, run.output
        survivors = [f"{pid} {cmdline(pid)}" for pid in run.tree if alive(pid)]
        assert not survivors, f"left behind: {survivors}"
    finally:
        await run.kill()
