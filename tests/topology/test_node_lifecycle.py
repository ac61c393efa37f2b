"""``agent-reach node`` as a process: SIGTERM drains (readiness 503, in-flight requests finish,
exit 0), registrations survive a restart on the same data dir, one node per data dir."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from node.core.models import TokenRole
from node.trust import Signer
from topology.embedded import DataDirLock

from ..helpers import registration, wait_for

pytestmark = pytest.mark.timeout(120)

SECRET = "lifecycle-test-secret-0123456789"
ADMIN = Signer(SECRET.encode()).issue("admin", TokenRole.ADMIN, ttl_s=3600)
HEADERS = {"Authorization": f"Bearer {ADMIN}"}
START_DEADLINE_S = 30.0
EXIT_DEADLINE_S = 20.0


# Never dialled (no probes); a documentation address, which no egress policy treats as loopback
# or private.
UNCONTACTED_ENDPOINT = "http://192.0.2.10:9"


class NodeProcess:
    """``agent-reach node`` as a subprocess; ``url`` once it printed its start line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.url = ""
        self.lines: list[str] = []

    @classmethod
    async def start(cls, *args: str, home: Path) -> NodeProcess:
        env = {**os.environ, "AGENT_REACH_SECRET": SECRET, "HOME": str(home)}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "topology.cli", "--log-level", "WARNING", "node", "--port", "0", "--no-semantic",
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
            start_new_session=True)
        node = cls(process)
        await node._read_until_started()
        return node

    async def _read_until_started(self) -> None:
        assert self.process.stdout is not None
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            line = await asyncio.wait_for(self.process.stdout.readline(), max(0.1, deadline - time.monotonic()))
            if not line:
                raise AssertionError("the node exited while starting:\n" + "".join(self.lines))
            text = line.decode()
            self.lines.append(text)
            if text.startswith("agent-reach node "):
                self.url = text.split(" url=", 1)[1].split()[0]
                return

    async def stop(self, signum: int = signal.SIGTERM) -> tuple[int, str, float]:
        """Signal it; returns its exit code, the rest of its output and the seconds it took."""
        self.process.send_signal(signum)
        sent = time.monotonic()
        rest, _ = await asyncio.wait_for(self.process.communicate(), timeout=EXIT_DEADLINE_S)
        return self.process.returncode or 0, rest.decode(), time.monotonic() - sent

    async def kill(self) -> None:
        if self.process.returncode is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            await self.process.wait()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers=HEADERS, timeout=aiohttp.ClientTimeout(total=10)) as client:
        yield client


async def readyz(session: aiohttp.ClientSession, url: str) -> int:
    try:
        async with session.get(url + "/readyz") as response:
            return response.status
    except (aiohttp.ClientError, OSError):
        return 0


async def test_sigterm_drains_a_slow_in_flight_request_completes_and_the_node_exits(
        tmp_path: Path, session: aiohttp.ClientSession) -> None:
    grace_ms = 600
    node = await NodeProcess.start("--region", "drain", "--ephemeral", "--drain-grace-ms", str(grace_ms),
                                   "--drain-timeout-ms", "10000", home=tmp_path)
    try:
        assert await readyz(session, node.url) == 200
        host, port = node.url.removeprefix("http://").split(":")
        body = json.dumps(registration("drain.slow.upload", lease_ttl_ms=60_000,
                                       endpoint=UNCONTACTED_ENDPOINT)).encode()
        reader, writer = await asyncio.open_connection(host, int(port))
        # Expect: 100-continue makes the server say it has read the head and is handling the
        # request: in flight before the signal, provably.
        writer.write((f"POST /v1/agents HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ADMIN}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                      "Expect: 100-continue\r\n\r\n").encode())
        await writer.drain()
        continue_line = await asyncio.wait_for(reader.readline(), 10)
        assert continue_line.startswith(b"HTTP/1.1 100"), continue_line
        await asyncio.wait_for(reader.readline(), 10)  # the blank line after "100 Continue"
        writer.write(body[: len(body) // 2])
        await writer.drain()

        node.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        # Readiness says 503 while the listener still takes (new) connections: the grace.
        await wait_for(lambda: _is(readyz(session, node.url), 503), timeout_s=grace_ms / 1000 + 5, interval_s=0.01,
                       message="/readyz 503 during the drain")
        saw_503_s = time.monotonic() - signalled
        # Then the listener closes, while the slow request is still in flight.
        await wait_for(lambda: _is(readyz(session, node.url), 0), timeout_s=10, interval_s=0.01,
                       message="the listener to close")
        closed_s = time.monotonic() - signalled
        assert node.process.returncode is None, "the node exited with a request in flight"
        writer.write(body[len(body) // 2:])
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        completed_s = time.monotonic() - signalled
        writer.close()
        assert status_line.startswith(b"HTTP/1.1 201"), status_line
        code, rest = await _wait_exit(node)  # already signalled
        exited_s = time.monotonic() - signalled
        print(f"\nSIGTERM -> /readyz 503 after {saw_503_s * 1000:.0f} ms, listener closed after "
              f"{closed_s * 1000:.0f} ms "
              f"(grace {grace_ms} ms), slow request completed (201) after {completed_s * 1000:.0f} ms, "
              f"exit {code} after {exited_s * 1000:.0f} ms")
        assert code == 0, rest
        assert closed_s >= grace_ms / 1000 * 0.9, "the listener closed before the grace was over"
        assert "Traceback" not in rest
    finally:
        await node.kill()


async def _is(status: Any, expected: int) -> bool:
    return await status == expected


async def _wait_exit(node: NodeProcess) -> tuple[int, str]:
    rest, _ = await asyncio.wait_for(node.process.communicate(), timeout=EXIT_DEADLINE_S)
    return node.process.returncode or 0, rest.decode()


async def test_a_request_that_never_finishes_is_cut_at_the_drain_timeout(tmp_path: Path) -> None:
    node = await NodeProcess.start("--region", "drainto", "--ephemeral", "--drain-grace-ms", "0",
                                   "--drain-timeout-ms", "300", home=tmp_path)
    try:
        host, port = node.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write((f"POST /v1/agents HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ADMIN}\r\n"
                      "Content-Type: application/json\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n")
                     .encode())
        await writer.drain()
        assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"HTTP/1.1 100")
        code, rest, took_s = await node.stop(signal.SIGTERM)  # the body never comes
        writer.close()
        print(f"\nSIGTERM with a request stuck in flight -> exit {code} after {took_s * 1000:.0f} ms "
              "(drain timeout 300 ms)")
        assert code == 0, rest
        assert took_s < 5, "the drain timeout did not bound the stop"
    finally:
        await node.kill()


async def test_registrations_survive_a_restart_on_the_same_data_dir(tmp_path: Path,
                                                                    session: aiohttp.ClientSession) -> None:
    data_dir = tmp_path / "node-data"
    agents = [f"persist.kept.a{n:03d}" for n in range(200)]
    node = await NodeProcess.start("--region", "persist", "--data-dir", str(data_dir), home=tmp_path)
    try:
        assert f"data={data_dir}" in node.lines[-1]
        semaphore = asyncio.Semaphore(16)

        async def register(agent_id: str) -> None:
            async with semaphore:
                body = registration(agent_id, capability="persist.kept", lease_ttl_ms=120_000,
                                    endpoint=UNCONTACTED_ENDPOINT)
                async with session.post(node.url + "/v1/agents", json=body) as response:
                    assert response.status == 201, await response.text()

        started = time.perf_counter()
        await asyncio.gather(*(register(agent_id) for agent_id in agents))
        registered_s = time.perf_counter() - started
        before = await _records(session, node.url)
        assert set(before) == set(agents)
        code, rest, stop_s = await node.stop(signal.SIGTERM)
        assert code == 0, rest
    finally:
        await node.kill()
    assert (data_dir / "redis" / "appendonly.aof").stat().st_size > 0

    restarted = time.perf_counter()
    node = await NodeProcess.start("--region", "persist", "--data-dir", str(data_dir), home=tmp_path)
    try:
        up_s = time.perf_counter() - restarted
        after = await _records(session, node.url)
        assert after == before, "a registration changed or went missing across the restart"
        for agent_id in agents:
            async with session.post(node.url + "/v1/resolve", json={"agent_id": agent_id}) as response:
                ticket = await response.json()
                assert response.status == 200, ticket
                assert ticket["target"]["agent_id"] == agent_id
        print(f"\n200 agents registered in {registered_s:.2f} s, node stopped in {stop_s:.2f} s, "
              f"restarted on the same data dir in {up_s:.2f} s: all 200 resolvable, versions and "
              "registered_at_ms unchanged")
        code, rest, _ = await node.stop(signal.SIGINT)
        assert code == 0, rest
    finally:
        await node.kill()


async def _records(session: aiohttp.ClientSession, url: str) -> dict[str, tuple[int, int]]:
    async with session.get(url + "/v1/agents", params={"capability": "persist.kept"}) as response:
        assert response.status == 200
        reply = await response.json()
    return {agent["agent_id"]: (agent["version"], agent["registered_at_ms"]) for agent in reply["agents"]}


def test_a_data_dir_in_use_is_refused_in_one_line(tmp_path: Path) -> None:
    data_dir = tmp_path / "taken"
    data_dir.mkdir()
    env = {**os.environ, "AGENT_REACH_SECRET": SECRET, "HOME": str(tmp_path)}
    with DataDirLock(data_dir):  # as a running node holds it
        out = subprocess.run([sys.executable, "-m", "topology.cli", "node", "--region", "taken", "--port", "0",
                              "--no-semantic", "--data-dir", str(data_dir)], env=env, capture_output=True,
                             text=True, timeout=60)
    assert out.returncode != 0
    assert out.stderr.startswith("error: ") and "in use by another agent-reach process" in out.stderr, out.stderr
    assert f"pid {os.getpid()}" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_admin_token_is_printed_only_when_asked(tmp_path: Path) -> None:
    env = {**os.environ, "AGENT_REACH_SECRET": SECRET, "HOME": str(tmp_path)}

    def first_lines(*extra: str) -> str:
        process = subprocess.Popen([sys.executable, "-m", "topology.cli", "--log-level", "WARNING", "node",
                                    "--region", "tok", "--port", "0", "--no-semantic", "--ephemeral", *extra],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                   start_new_session=True)
        try:
            lines = []
            assert process.stdout is not None
            while not (lines and lines[-1].startswith("secret: ")):
                line = process.stdout.readline()
                assert line, "the node exited while starting"
                lines.append(line)
            if extra:
                lines.append(process.stdout.readline())
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=EXIT_DEADLINE_S) == 0
            return "".join(lines) + (process.stdout.read() or "")
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    assert "admin token" not in first_lines()
    printed = first_lines("--print-admin-token")
    token = printed.split("admin token (valid 30 days): ", 1)[1].split()[0]
    assert Signer(SECRET.encode()).verify(token).role is TokenRole.ADMIN


async def test_a_killed_embedded_redis_comes_back_with_its_data(tmp_path: Path,
                                                               session: aiohttp.ClientSession) -> None:
    from ..helpers import descendants

    node = await NodeProcess.start("--region", "revive", "--data-dir", str(tmp_path / "data"), home=tmp_path)
    try:
        body = registration("revive.kept.one", capability="revive.kept", lease_ttl_ms=120_000,
                            endpoint=UNCONTACTED_ENDPOINT)
        async with session.post(node.url + "/v1/agents", json=body) as response:
            assert response.status == 201
        redis_pids = [pid for pid in descendants(node.process.pid)
                      if b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(redis_pids) == 1
        os.kill(redis_pids[0], signal.SIGKILL)
        killed = time.monotonic()
        seen: list[int] = []

        async def back() -> bool:
            status = await readyz(session, node.url)
            if not seen or seen[-1] != status:
                seen.append(status)
            return 503 in seen and status == 200

        await wait_for(back, timeout_s=30, interval_s=0.02, message="/readyz 503, then 200 again")
        print(f"\nembedded redis-server of a node killed -> /readyz {' -> '.join(map(str, seen))} "
              f"after {time.monotonic() - killed:.2f} s")
        assert not Path(f"/proc/{redis_pids[0]}").exists(), "the killed redis-server was left a zombie"
        async with session.get(node.url + "/v1/agents", params={"capability": "revive.kept"}) as response:
            assert [agent["agent_id"] for agent in (await response.json())["agents"]] == ["revive.kept.one"]
        code, rest, _ = await node.stop()
        assert code == 0, rest
        assert f"the embedded Redis of region revive: pid {redis_pids[0]} was killed by SIGKILL" in rest, rest
    finally:
        await node.kill()
