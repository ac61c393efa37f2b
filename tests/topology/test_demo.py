"""The demo agents (topology/demo/) and ``agent-reach up --demo``: a local and a cross-region call."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from node.client import ReachClient
from node.client.host import AgentHost
from node.core import Envelope
from node.core.models import Capability

from ..helpers import RunningNode, alive, descendants

REPO = Path(__file__).resolve().parents[2]
STARTUP_DEADLINE_S = 90.0


async def test_an_sdk_agent_answers_a_repeated_message_id_without_running_twice(node: RunningNode) -> None:
    runs: list[str] = []

    async def handler(envelope: Envelope) -> dict[str, str]:
        runs.append(envelope.id)
        return {"charged": envelope.payload["amount"]}

    registration = {"agent_id": "demo.pay.charger", "display_name": "Charger", "description": "Charges a card.",
                    "capabilities": [Capability(name="pay.charge")]}
    async with AgentHost(registration, handler, node_url=node.url, token=node.token("demo.pay.charger")) as host:
        status, record = await node.call("GET", "/v1/agents/demo.pay.charger")
        assert status == 200 and record["endpoints"]["primary"] == host.url + "/invoke"
        async with ReachClient(node.url, token=node.admin_token) as caller:
            message = Envelope(operation="pay.charge", payload={"amount": "12.50"}, idempotent=True)
            first = await caller.call("pay.charge", envelope=message)
            again = await caller.call("pay.charge", envelope=message)  # a retry of the same message
        assert first.payload == again.payload == {"charged": "12.50"}
        assert first.envelope is not None and first.envelope.reply_to_id == message.id
        assert runs == [message.id]  # executed once
    status, _ = await node.call("GET", "/v1/agents/demo.pay.charger")
    assert status == 404  # deregistered on exit


@pytest.mark.timeout(150)
async def test_up_demo_shows_a_local_and_a_cross_region_call(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "AGENT_REACH_SECRET": "demo-test-secret-0123456789abcdef"}
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "topology.cli", "--log-level", "WARNING", "up", "--any-port", "--demo", cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env)
    assert process.stdout is not None
    output: list[str] = []
    try:
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while True:
            line = await asyncio.wait_for(process.stdout.readline(), timeout=max(0.1, deadline - time.monotonic()))
            if not line:
                raise AssertionError("agent-reach up --demo exited while starting:\n" + "".join(output))
            output.append(line.decode())
            if output[-1].startswith("Ctrl-C stops everything"):
                break
        print(f"\nagent-reach up --demo: ready in {time.perf_counter() - started:.1f} s")
        print("".join(line for line in output if line.startswith("demo:")))
        text = "".join(output)
        local = next(line for line in output if line.startswith("demo: local call"))
        cross = next(line for line in output if line.startswith("demo: cross-region call"))
        assert "from us-east: translate.text -> demo.translate.phrasebook in region us-east (local)" in local, text
        assert "'refund note'" in local
        assert "from us-east: ocr.image -> demo.ocr.scanner in region us-west (remote)" in cross, text
        assert "Invoice 2024-117" in cross
        semantic = next((line for line in output if line.startswith("demo: semantic call")), "")
        assert "-> demo.images.catalog in region eu-west" in semantic, text
        tree = descendants(process.pid)

        process.send_signal(signal.SIGINT)
        rest, _ = await asyncio.wait_for(process.communicate(), timeout=45)
        output.append(rest.decode())
        assert process.returncode == 0, "".join(output)
        assert not [pid for pid in tree if alive(pid)], "processes left behind"
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
