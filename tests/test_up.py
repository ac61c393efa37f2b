"""``agent-reach up`` (what ``make up`` runs): the packaged three-region topology from nothing,
resolvable across regions, and stopped by Ctrl-C (SIGINT) with no process left behind."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from pathlib import Path

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
