"""The README's first hour, run as written: its agent and caller programs, unchanged, against a
real node (with search attached, lexical), and its agent TOML through the config parser.

The blocks are the fenced ones after a ``<!-- readme-test: NAME -->`` line; the agent reads its
node, token and port from the environment, as the README's commands give them.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

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
