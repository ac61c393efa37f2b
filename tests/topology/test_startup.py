"""``agent-reach up`` is patient: a node that is slow to start is waited for, with a line every few
seconds saying what it is doing, for as long as its process runs; ``--start-timeout-s`` (LocalCluster
``node_start_timeout_s``) sets a deadline for those who want one: one line, exit 1, nothing left.

The slowness has a real cause, written here: a Redis that answers late (a TCP proxy in front of the
session's redis-server that passes no byte until the test releases it), so the node waits in its
first command, as one does behind a slow network or an overloaded Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest

from topology import Topology
from topology.launcher import LauncherError, LocalCluster, phase_line
from topology.launcher.startup import NodeLaunch

from ..helpers import alive, wait_for
from .test_up import UpRun, cmdline

pytestmark = pytest.mark.timeout(180)

SECRET = b"startup-test-secret-0123456789"
PROGRESS = re.compile(r"^waiting for region (\S+) \((http://\S+)\): (.+) (\d+) s$")
EXIT_DEADLINE_S = 60.0


class LateRedis:
    """A Redis that answers late: a TCP proxy in front of a real one that passes no byte either way
    until :meth:`release`. ``async with`` listens on a free port of 127.0.0.1."""

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self._released = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.accepted = 0

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("LateRedis is not listening; use it as 'async with'")
        return f"redis://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/0"

    def release(self) -> None:
        self._released.set()

    async def __aenter__(self) -> LateRedis:
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        self.accepted += 1
        # Ended by __aexit__'s cancel: returning normally, since Python 3.11's start_server logs
        # a handler that ends cancelled as an error.
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
            await self._released.wait()
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._upstream)
            try:
                await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
            finally:
                upstream_writer.close()
        writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


@pytest.fixture
async def late_redis(redis_url: str) -> LateRedis:
    async with LateRedis(redis_url) as server:
        yield server  # type: ignore[misc]


def one_region(name: str, redis_url: str) -> Topology:
    return Topology.model_validate({
        "name": f"startup-{name}", "node": {"semantic_enabled": False},
        "regions": [{"name": name, "node_urls": ["http://127.0.0.1:1"], "redis_url": redis_url}],
    })


def progress(said: list[str], region: str) -> list[tuple[str, int]]:
    """The progress lines said for ``region``: (what it was doing, seconds since its start)."""
    return [(match.group(3), int(match.group(4))) for line in said
            if (match := PROGRESS.match(line)) and match.group(1) == region]


async def test_a_node_slow_to_start_is_waited_for_and_said_to_be_waiting(late_redis: LateRedis,
                                                                         region: str) -> None:
    said: list[str] = []
    cluster = LocalCluster(one_region(region, late_redis.url), secret=SECRET, any_port=True, log_level="WARNING",
                           say=said.append, start_progress_interval_s=0.3)
    starting = asyncio.ensure_future(cluster.start())
    try:
        # Three times the deadline the next test sets, and still waited for, in the phase it is in.
        waited = await wait_for(lambda: [line for line in progress(said, region)
                                         if "from Redis" in line[0] and line[1] >= 3],
                                timeout_s=EXIT_DEADLINE_S, interval_s=0.05, message="a progress line after 3 s")
        node = cluster.nodes[region]
        assert not starting.done() and node.running, said
        assert late_redis.accepted >= 1  # it is waiting on the late Redis, not on anything else
        lines = progress(said, region)
        seconds = [elapsed for _, elapsed in lines]
        assert seconds == sorted(seconds) and len(lines) >= 3, said
        assert waited[0][0] == f"loading the region's agents from Redis ({late_redis.url})…", waited
        assert lines[0][0] in ("starting the process…", waited[0][0]), lines
        released = time.monotonic()
        late_redis.release()
        await asyncio.wait_for(starting, timeout=EXIT_DEADLINE_S)
        print(f"\nwaited {seconds[-1]} s and more for a late Redis; ready {time.monotonic() - released:.2f} s after "
              f"its release; said:\n  " + "\n  ".join(said))
        async with aiohttp.ClientSession() as session, session.get(cluster.url(region) + "/readyz") as response:
            assert response.status == 200
    finally:
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, LauncherError):
            await starting
        await cluster.aclose()


async def test_a_start_timeout_stops_a_node_that_is_not_ready_by_then(late_redis: LateRedis, region: str) -> None:
    said: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        cluster = LocalCluster(one_region(region, late_redis.url), secret=SECRET, any_port=True,
                               log_level="WARNING", say=said.append, node_start_timeout_s=1.0,
                               start_progress_interval_s=0.3)
        stack.push_async_callback(cluster.aclose)
        started = time.monotonic()
        with pytest.raises(LauncherError) as raised:
            await cluster.start()
        took = time.monotonic() - started
        message = str(raised.value)
        print(f"\ngave up after {took:.2f} s: {message}")
        assert "\n" not in message, message
        assert message.startswith(f"the node of region {region} was not ready at http://127.0.0.1:"), message
        assert " within 1 s (last seen: " in message and "--start-timeout-s" in message, message
        node = cluster.nodes[region]
        assert node.process is not None and node.process.returncode is not None  # killed, and reaped


async def test_up_start_timeout_is_one_line_exit_1_and_nothing_left_running(tmp_path: Path, late_redis: LateRedis,
                                                                             region: str) -> None:
    topology = tmp_path / "late.toml"
    topology.write_text(f'name = "startup-cli"\n[node]\nsemantic_enabled = false\n'
                        f'[[regions]]\nname = "{region}"\nnode_urls = ["http://127.0.0.1:1"]\n'
                        f'redis_url = "{late_redis.url}"\n')
    run = await UpRun.spawn(tmp_path, "--start-timeout-s", "1", str(topology))
    try:
        deadline = time.monotonic() + EXIT_DEADLINE_S
        saw_node = False
        while run.process.returncode is None:
            assert time.monotonic() < deadline, f"up did not give up:\n{run.output}"
            saw_node = run.has_child(" node --topology ") or saw_node  # tracked until it is killed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.process.wait(), timeout=0.01)
        await asyncio.wait_for(run._reader, timeout=10)
        assert run.process.returncode == 1, run.output
        assert saw_node, f"no node process was seen under up:\n{run.output}"
        errors = [index for index, line in enumerate(run.lines) if line.startswith("error: ")]
        assert len(errors) == 1, run.output
        error = run.lines[errors[0]]
        assert error.startswith(f"error: the node of region {region} was not ready at http://127.0.0.1:"), run.output
        assert " within 1 s (last seen: " in error, run.output
        after = run.lines[errors[0] + 1:]
        assert after == ["agent-reach up: stopped\n"], run.output  # no log tail, no traceback
        survivors = [f"{pid} {cmdline(pid)}" for pid in run.tree if alive(pid)]
        assert not survivors, f"left behind: {survivors}\n{run.output}"
    finally:
        await run.kill()


@pytest.mark.unit
def test_a_launch_reads_only_its_own_phases_from_an_appended_log(tmp_path: Path) -> None:
    log = tmp_path / "region.log"
    log.write_text(f"{phase_line('loading the model')}\nthe last run's output\n")
    offset = log.stat().st_size
    launch = NodeLaunch(region="r", url="http://127.0.0.1:1", process=None, log_path=log,  # type: ignore[arg-type]
                        log_offset=offset)
    assert launch.last_phase() is None  # this launch said nothing yet: not the last run's phase
    lines = [phase_line("loading the region's agents from Redis (redis://127.0.0.1:1/0)"),
             "2026-01-01 00:00:00,000 INFO a log line", phase_line("loading the model"),
             "2026-01-01 00:00:01,000 INFO another"]
    with log.open("a") as output:
        output.write("".join(f"{line}\n" for line in lines))
    assert launch.last_phase() == "loading the model"
