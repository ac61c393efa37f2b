"""The sidecar and preflight commands, run as real processes against a real node and agent."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
from aiohttp import web

from node.client import ReachClient, load_agent_config
from node.core.models import TokenRole
from node.trust import Signer
from topology.cli.preflight import run_preflight

from ..helpers import AgentServer, RunningNode, free_port, registration, wait_for

REPO = Path(__file__).resolve().parents[2]
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


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


class HeadersAgent(AgentServer):
    """A plain HTTP agent that answers what it was told about the caller."""

    async def _invoke(self, request: web.Request) -> web.Response:
        self.calls += 1
        envelope = await request.json()
        reply = {"id": f"re-{envelope['id']}", "type": "response", "trace_id": envelope["trace_id"],
                 "reply_to_id": envelope["id"], "payload": {
                     "caller": request.headers.get("X-Reach-Caller"), "role": request.headers.get("X-Reach-Caller-Role"),
                     "credential_passed_on": "Authorization" in request.headers}}
        return web.json_response(reply)


async def test_the_sidecar_verifies_calls_before_they_reach_the_agent(node: RunningNode, tmp_path: Path) -> None:
    agent = await HeadersAgent("behind-sidecar").start()
    agent_id = "vision.ocr.guarded"
    gateway = f"http://127.0.0.1:{free_port()}"
    config = write_config(tmp_path / "agent.toml", node_url=node.url, token=node.token(agent_id), agent_id=agent_id,
                          endpoint=f"{gateway}/invoke")
    config.write_text(config.read_text().replace("[sidecar]\n", f'[sidecar]\nupstream = "{agent.url}"\n'))
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "topology.cli", "--log-level", "WARNING",
                                                   "sidecar", "--config", str(config), cwd=REPO,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        await wait_for(lambda: node.node.cache.index.get(agent_id), timeout_s=20, message="the sidecar to register")
        async with ReachClient(node.url, token=node.token("billing.front.web", TokenRole.CALLER)) as caller:
            result = await caller.call("ocr.image", {"image": "scan.png"})
        assert result.payload == {"caller": "billing.front.web", "role": "caller", "credential_passed_on": False}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{gateway}/invoke", json={"forged": True},
                                    headers={"X-Reach-Caller": "admin"}) as refused:
                assert refused.status == 401 and (await refused.json())["error"] == "credential_missing"
            async with session.get(f"{gateway}/readyz") as ready:  # the sidecar's own view, for probes
                assert ready.status == 200
        assert agent.calls == 1  # the refused call never reached the agent
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), 15)
        assert process.returncode == 0 and "verifying calls on 127.0.0.1:" in output.decode(), output.decode()
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


async def test_preflight_takes_the_node_from_the_environment(node: RunningNode, tmp_path: Path) -> None:
    config = write_config(tmp_path / "agent.toml", node_url=node.url, token=node.token("vision.ocr.env"),
                          agent_id="vision.ocr.env", endpoint="http://127.0.0.1:9/invoke")
    config.write_text(config.read_text().replace(f'url = "{node.url}"\n', ""))
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "topology.cli", "preflight", "--config",
                                                   str(config), cwd=REPO, env={**os.environ, "AGENT_REACH_URL": node.url},
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0 and f"{node.url} answers" in output.decode(), output.decode()


async def test_the_gateway_reads_header_names_in_any_case(node: RunningNode) -> None:
    # Header names were compared as spelt: a client sending lower-case names (as HTTP/2 and many
    # clients do) lost its Content-Type and X-Reach-* headers on the way to the agent. The W3C
    # trace context was dropped too: the agent's span started a trace of its own.
    from node.client import CallVerifier
    from topology.cli.gateway import Gateway

    seen: list[dict[str, str]] = []

    async def upstream(request: web.Request) -> web.Response:
        seen.append({name.lower(): value for name, value in request.headers.items()})
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/invoke", upstream)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    upstream_port = free_port()
    await web.TCPSite(runner, "127.0.0.1", upstream_port).start()
    agent_id, port = "vision.ocr.cased", free_port()
    await node.register(registration(agent_id, capability="ocr.image", endpoint=f"http://127.0.0.1:{port}/invoke"))
    status, ticket = await node.resolve(node.token("billing.front.web", TokenRole.CALLER), agent_id=agent_id)
    assert status == 200, ticket
    gateway = Gateway(verifier=CallVerifier(node.url, agent_id=agent_id), upstream=f"http://127.0.0.1:{upstream_port}",
                      listen=("127.0.0.1", port), max_body_bytes=65_536, timeout_s=5, status=lambda: (True, True))
    await gateway.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{port}/invoke", data=b'{"image": "scan.png"}', headers={
                    "authorization": f"Bearer {ticket['target']['credential']}", "content-type": "application/json",
                    "x-reach-trace-id": "trace-cased", "x-reach-caller": "admin", "X-REACH-CALLER-ROLE": "admin",
                    "Traceparent": TRACEPARENT, "tracestate": "vendor=1"}) as answer:
                assert answer.status == 200, await answer.text()
        (headers,) = seen
        assert headers["content-type"] == "application/json" and headers["x-reach-trace-id"] == "trace-cased"
        assert (headers["traceparent"], headers["tracestate"]) == (TRACEPARENT, "vendor=1")  # the caller's trace
        # what the caller claimed about itself, in whatever case, never passes: the gateway says who it is
        assert (headers["x-reach-caller"], headers["x-reach-caller-role"]) == ("billing.front.web", "caller")
    finally:
        await gateway.aclose()
        await runner.cleanup()
