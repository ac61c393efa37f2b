"""The README's first hour, run as written: its agent and caller programs, unchanged, against a
real node (with search attached, lexical), and its agent TOML through the config parser; and the
whole first hour — agent, caller, the HTTP examples and the operator commands — after a plain
``up`` on a machine whose packaged ports 7101–7103 are taken, with no ``$AGENT_REACH_URL``.

The blocks are the fenced ones after a ``<!-- readme-test: NAME -->`` line; the agent reads its
node, token and port from the environment, as the README's commands give them.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest

from node.client import parse_agent_config
from node.config import NodeConfig
from node.core.models import TokenRole
from topology import build_node

from .conftest import TEST_SECRET
from .helpers import RunningNode, free_port, start_node, wait_for

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"<!-- readme-test: (?P<name>\S+) -->\n```(?P<lang>\w+)\n(?P<body>.*?)\n```\n", re.S)
AGENT_ID = "demo.summarize.en_01"


def readme_blocks() -> dict[str, str]:
    return {match["name"]: match["body"] + "\n" for match in _BLOCK.finditer(README.read_text())}


@pytest.fixture
async def node(redis_url: str, region: str) -> AsyncIterator[RunningNode]:
    config = NodeConfig(region=region, redis_url=redis_url, port=0, semantic_enabled=False,
                        sweep_interval_ms=100, lease_sync_interval_ms=100, egress={"allow": ["loopback"]})
    running = await start_node(build_node(config, secret=TEST_SECRET))
    try:
        yield running
    finally:
        await running.aclose()


@pytest.mark.unit
def test_the_readme_marks_its_examples_and_calls_one_way() -> None:
    blocks = readme_blocks()
    assert {"agent.py", "caller.py", "agent.toml"} <= set(blocks), sorted(blocks)
    text = README.read_text()
    calls = re.findall(r"reach\.call\(([^)\n]*)", text)
    assert calls and all(re.match(r'("|envelope=|capability, payload)', call) for call in calls), calls
    assert "7070" not in text and "24 h" not in text


@pytest.mark.unit
def test_the_readme_agent_toml_is_a_valid_config() -> None:
    config = parse_agent_config(tomllib.loads(readme_blocks()["agent.toml"]), source="README.md")
    assert config.agent is not None and config.agent.agent_id == "legacy.ocr.scanner_01"
    assert config.sidecar.upstream == "http://127.0.0.1:8701" and config.node.url == "http://127.0.0.1:7101"
    assert config.sidecar_urls() == ("http://127.0.0.1:8701/healthz", "http://127.0.0.1:8701/readyz")


@pytest.mark.timeout(120)
async def test_the_readme_agent_and_caller_run_as_written(node: RunningNode, tmp_path: Path) -> None:
    blocks = readme_blocks()
    for name in ("agent.py", "caller.py"):
        (tmp_path / name).write_text(blocks[name])
    port = free_port()
    env = {**os.environ, "AGENT_REACH_URL": node.url}
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "agent.py", cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**env, "AGENT_PORT": str(port), "AGENT_REACH_TOKEN": node.token(AGENT_ID)})
    try:
        assert agent.stdout is not None
        line = (await asyncio.wait_for(agent.stdout.readline(), 60)).decode()
        assert line.startswith(f"{AGENT_ID} serves http://127.0.0.1:{port}/invoke"), line
        await node.node.searcher.settled(timeout_s=30)

        caller = await asyncio.create_subprocess_exec(
            sys.executable, "caller.py", cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**env, "AGENT_REACH_TOKEN": node.token("demo.report.cli", TokenRole.CALLER)})
        output, _ = await asyncio.wait_for(caller.communicate(), 60)
        printed = output.decode()
        assert caller.returncode == 0, printed
        region = node.node.region
        assert (f"answered by {AGENT_ID} in {region} (exact match): "
                "{'summary': 'Agent-Reach routes calls.', 'caller': 'demo.report.cli'}") in printed, printed
        assert f"found {AGENT_ID} (" in printed, printed

        # The README's agent really checks who calls: straight to its endpoint, no credential, 401.
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{port}/invoke", json={"payload": {"text": "x"}}) as answer:
                assert answer.status == 401 and (await answer.json())["error"] == "credential_missing"

        agent.send_signal(signal.SIGINT)  # Ctrl-C: it deregisters and exits
        await asyncio.wait_for(agent.wait(), 15)
        assert agent.returncode == 0
        await wait_for(lambda: node.node.cache.index.get(AGENT_ID) is None, message="the agent deregistered")
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()


# -- The first hour on a machine whose packaged ports are taken --------------------------------

PACKAGED_PORTS = (7101, 7102, 7103)
UP_READY_DEADLINE_S = 240.0  # three nodes loading the model on a loaded two-core machine
STEP_DEADLINE_S = 90.0


def test_make_up_passes_args_to_up() -> None:
    repository = README.parent
    dry_run = subprocess.run(["make", "-n", "--no-print-directory", "up", "ARGS=--any-port --demo"], cwd=repository,
                             capture_output=True, text=True, timeout=30, check=True)
    assert dry_run.stdout.rstrip().splitlines()[-1].split() == [".venv/bin/agent-reach", "up", "--any-port", "--demo"]


class _FirstHour:
    """A newcomer's machine: a fresh ``$HOME`` (no secret yet), ``.venv`` where the README's
    commands look, no ``$AGENT_REACH_URL`` and the programs saved beside it, as the README says."""

    def __init__(self, home: Path) -> None:
        self.home = home
        (home / ".venv").symlink_to(Path(sys.executable).parent.parent)
        for name, body in readme_blocks().items():
            (home / name).write_text(body)
        names = ("AGENT_REACH_URL", "AGENT_REACH_TOKEN", "AGENT_REACH_SECRET", "AGENT_REACH_SECRET_FILE")
        self.env = {**{k: v for k, v in os.environ.items() if k not in names}, "HOME": str(home)}

    async def start(self, *argv: str, stderr: int = asyncio.subprocess.STDOUT, **env: str,
                    ) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(*argv, cwd=self.home, env={**self.env, **env},
                                                    stdout=asyncio.subprocess.PIPE, stderr=stderr)

    async def run(self, *argv: str, **env: str) -> str:
        """Its stdout and stderr together; it must exit 0."""
        process = await self.start(*argv, **env)
        output, _ = await asyncio.wait_for(process.communicate(), STEP_DEADLINE_S)
        assert process.returncode == 0, (argv, output.decode())
        return output.decode()

    async def token(self, *how: str) -> str:
        """``agent-reach token issue HOW``'s token (its stdout; what it says about it goes to stderr)."""
        process = await self.start(".venv/bin/agent-reach", "token", "issue", *how, stderr=asyncio.subprocess.PIPE)
        token, said = await asyncio.wait_for(process.communicate(), STEP_DEADLINE_S)
        assert process.returncode == 0, said.decode()
        return token.decode().strip()


async def _stop(process: asyncio.subprocess.Process, deadline_s: float = 30) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(process.wait(), deadline_s)
        except TimeoutError:
            process.kill()
            await process.wait()


async def _ready(up: asyncio.subprocess.Process) -> str:
    """What ``up`` printed until it was ready (raises with its output when it exited first)."""
    assert up.stdout is not None
    printed: list[str] = []
    deadline = time.monotonic() + UP_READY_DEADLINE_S
    while not printed or not printed[-1].startswith("Ctrl-C stops everything"):
        line = await asyncio.wait_for(up.stdout.readline(), max(0.1, deadline - time.monotonic()))
        if not line:
            raise AssertionError("agent-reach up exited while starting:\n" + "".join(printed))
        printed.append(line.decode())
    return "".join(printed)


@pytest.mark.timeout(600)
async def test_the_first_hour_runs_unchanged_after_a_plain_up_with_7101_to_7103_taken(tmp_path: Path) -> None:
    taken = []
    for port in PACKAGED_PORTS:
        holder = socket.socket()
        try:
            holder.bind(("127.0.0.1", port))
            holder.listen()
        except OSError as exc:  # another program of this machine holds it already: taken all the same
            assert exc.errno == errno.EADDRINUSE, exc
        taken.append(holder)
    machine = _FirstHour(tmp_path)
    up = await machine.start(".venv/bin/agent-reach", "--log-level", "WARNING", "up")  # what `make up` runs
    agent = None
    try:
        printed = await _ready(up)
        assert "listening on free ports instead" in printed, printed
        nodes = json.loads((tmp_path / ".agent-reach" / "local.json").read_text())["nodes"]
        assert list(nodes) == ["us-east", "us-west", "eu-west"]
        assert not {urlsplit(url).port for url in nodes.values()} & set(PACKAGED_PORTS), nodes

        # Step 3 and 4: the agent and the caller as written, their tokens as the README issues them.
        agent = await machine.start(".venv/bin/python", "agent.py", AGENT_PORT=str(free_port()),
                                    AGENT_REACH_TOKEN=await machine.token("--agent", AGENT_ID))
        assert agent.stdout is not None
        line = (await asyncio.wait_for(agent.stdout.readline(), STEP_DEADLINE_S)).decode()
        assert line.startswith(f"{AGENT_ID} serves "), line
        admin = await machine.token("--admin")
        await wait_for(lambda: _searchable(machine, admin), timeout_s=STEP_DEADLINE_S, interval_s=0.5,
                       message="the agent indexed")
        printed = await machine.run(".venv/bin/python", "caller.py",
                                    AGENT_REACH_TOKEN=await machine.token("--caller", "demo.report.cli"))
        assert (f"answered by {AGENT_ID} in us-east (exact match): "
                "{'summary': 'Agent-Reach routes calls.', 'caller': 'demo.report.cli'}") in printed, printed
        assert f"found {AGENT_ID} (" in printed, printed

        # Step 6 on the ports up chose (the README says where to read them), /v1/send included.
        http = readme_blocks()["http.sh"]
        for number, url in zip(PACKAGED_PORTS, nodes.values()):
            http = http.replace(f"localhost:{number}", url)
        printed = await machine.run("bash", "-ec", http)
        assert '"payload":{"summary":"The node calls the agent."' in printed, printed

        # The operator commands, unchanged: they find the node through up's file.
        printed = await machine.run("bash", "-ec", "set -o pipefail\n" + readme_blocks()["operator.sh"],
                                    LEAKED_TOKEN=await machine.token("--caller", "leaked.script"))
        assert f"\n{AGENT_ID}\n" in printed and f"deregistered {AGENT_ID}" in printed, printed
        assert "revoked in region us-east" in printed and "ticket " in printed, printed
    finally:
        for process in (agent, up):
            if process is not None:
                await _stop(process)
        for holder in taken:
            holder.close()
    assert up.returncode == 0


async def _searchable(machine: _FirstHour, admin: str) -> bool:
    process = await machine.start(".venv/bin/agent-reach", "search", "summarize a long text", "--json",
                                  AGENT_REACH_TOKEN=admin)
    output, _ = await asyncio.wait_for(process.communicate(), STEP_DEADLINE_S)
    return process.returncode == 0 and AGENT_ID in output.decode()
