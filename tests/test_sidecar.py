"""The sidecar and preflight commands, run as real processes against a real node and agent."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from aiohttp import web

from node.client import load_agent_config
from node.models import TokenRole
from node.security import Signer
from topology.cli.preflight import run_preflight

from .helpers import AgentServer, RunningNode, wait_for

REPO = Path(__file__).resolve().parent.parent


class LoadedAgent(AgentServer):
    """A plain HTTP agent (no SDK) whose /readyz also reports its load."""

    async def _readyz(self, request: web.Request) -> web.Response:
        self.probes["readyz"] += 1
        return web.json_response({"ready": self.ready, "inflight": 3, "queued": 1},
                                 status=200 if self.ready else 503)


def write_config(path: Path, *, node_url: str, token: str, agent_id: str, endpoint: str,
                 transport: str = "http+token") -> Path:
    path.write_text(f"""
[node]
url = "{node_url}"
token = "{token}"

[agent]
agent_id = "{agent_id}"
description = "A legacy OCR service that reads text from scanned images."
transport = "{transport}"
endpoints = {{ primary = "{endpoint}" }}
lease_ttl_ms = 3000
[[agent.capabilities]]
name = "ocr.image"

[sidecar]
probe_interval_ms = 100
failure_threshold = 2
success_threshold = 1
""")
    return path


async def run_cli(*args: str, timeout_s: float = 30) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "topology.cli", "--log-level", "WARNING",
                                                   *args, cwd=REPO, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    return process.returncode or 0, output.decode()


async def test_sidecar_registers_a_plain_agent_removes_it_when_unready_and_deregisters_on_exit(
        node: RunningNode, tmp_path: Path) -> None:
    agent = await LoadedAgent("legacy-ocr").start()
    agent_id = "vision.ocr.legacy"
    config = write_config(tmp_path / "agent.toml", node_url=node.url, token=node.token(agent_id), agent_id=agent_id,
                          endpoint=agent.url + "/invoke")
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "topology.cli", "--log-level", "WARNING",
                                                   "sidecar", "--config", str(config), cwd=REPO,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        record = await wait_for(lambda: node.node.cache.index.get(agent_id), timeout_s=20,
                                message="the sidecar to register the agent")
        assert record.endpoints["primary"] == agent.url + "/invoke" and record.status.value == "ready"
        await wait_for(lambda: node.node.cache.index.get(agent_id).load.inflight == 3, timeout_s=5,
                       message="the load from /readyz in a heartbeat")
        status, ticket = await node.resolve(capability="ocr.image")
        assert status == 200 and ticket["target"]["agent_id"] == agent_id

        agent.ready = False  # readiness fails: out of routing within 2 probes + one pushed heartbeat
        async def unroutable() -> bool:
            status, body = await node.resolve(capability="ocr.image")
            return status == 404 and "unready" in str(body["details"])
        await wait_for(unroutable, timeout_s=5, message="the unready agent to leave routing")
        assert node.node.cache.index.get(agent_id).status.value == "unready"

        agent.ready = True
        async def routable() -> bool:
            return (await node.resolve(capability="ocr.image"))[0] == 200
        await wait_for(routable, timeout_s=5, message="the agent to come back")

        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), 15)
        assert process.returncode == 0, output.decode()
        assert f"registered {agent_id}" in output.decode()
        status, body = await node.call("GET", f"/v1/agents/{agent_id}")
        assert status == 404 and body["error"] == "unknown_agent"  # deregistered on exit
        assert agent.probes["healthz"] > 0 and agent.probes["readyz"] > 0
    except AssertionError:
        if process.returncode is None:
            process.kill()
        output, _ = await process.communicate()
        raise AssertionError(f"sidecar output:\n{output.decode()}") from None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await agent.aclose()


async def test_preflight_passes_a_good_config(node: RunningNode, tmp_path: Path) -> None:
    config = write_config(tmp_path / "agent.toml", node_url=node.url, token=node.token("vision.ocr.ok"),
                          agent_id="vision.ocr.ok", endpoint="http://127.0.0.1:9/invoke")
    code, output = await run_cli("preflight", "--config", str(config))
    assert code == 0, output
    assert "preflight passed" in output and "FAIL" not in output


async def test_preflight_fails_on_a_wrong_token(node: RunningNode, tmp_path: Path) -> None:
    foreign = Signer(b"another-cluster-secret-0123456789").issue("vision.ocr.bad", TokenRole.AGENT)
    config = write_config(tmp_path / "agent.toml", node_url=node.url, token=foreign, agent_id="vision.ocr.bad",
                          endpoint="http://127.0.0.1:9/invoke")
    code, output = await run_cli("preflight", "--config", str(config))
    assert code == 1, output
    assert "FAIL  auth" in output and "rejects the token (invalid_token)" in output
    status, _ = await node.call("GET", "/v1/agents/vision.ocr.bad")
    assert status == 404  # nothing was registered


async def test_preflight_fails_on_a_transport_the_region_forbids(node_factory, tmp_path: Path) -> None:
    node = await node_factory(allowed_transports=["https+token", "grpc+mtls"])
    config = write_config(tmp_path / "agent.toml", node_url=node.url, token=node.token("vision.ocr.plain"),
                          agent_id="vision.ocr.plain", endpoint="http://127.0.0.1:9/invoke")
    code, output = await run_cli("preflight", "--config", str(config))
    assert code == 1, output
    assert (f"FAIL  transport  region {node.node.region} forbids transport 'http+token'; "
            "allowed: https+token, grpc+mtls") in output
    # and the sidecar refuses to start half-working with the same reason
    code, output = await run_cli("sidecar", "--config", str(config))
    assert code == 1 and "not starting: transport" in output, output


async def test_preflight_reasons_for_identity_unreachable_node_and_bad_config(node: RunningNode,
                                                                             tmp_path: Path) -> None:
    other = write_config(tmp_path / "other.toml", node_url=node.url, token=node.token("vision.ocr.someone"),
                         agent_id="vision.ocr.me", endpoint="http://127.0.0.1:9/invoke")
    checks = await run_preflight(load_agent_config(other))
    assert not checks[-1].ok and checks[-1].name == "identity" and "vision.ocr.someone" in checks[-1].detail

    gone = write_config(tmp_path / "gone.toml", node_url="http://127.0.0.1:9", token="x",
                        agent_id="vision.ocr.me", endpoint="http://127.0.0.1:9/invoke")
    checks = await run_preflight(load_agent_config(gone))
    assert not checks[-1].ok and checks[-1].name == "node" and "is the node running" in checks[-1].detail

    broken = tmp_path / "broken.toml"
    broken.write_text(other.read_text().replace('agent_id = "vision.ocr.me"', 'agent_id = "Not An Id"'))
    code, output = await run_cli("preflight", "--config", str(broken))
    assert code == 2 and "agent.agent_id" in output, output
