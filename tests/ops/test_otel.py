"""OpenTelemetry: one call SDK → node → agent is one trace of three spans in an OTLP/HTTP receiver
started here (it decodes the protobuf ``ExportTraceServiceRequest`` it is sent), parented caller →
node → agent, its trace id the envelope's ``trace_id``; the node's resolve and probe spans join
it too. Without ``otel_traces_endpoint`` the node records nothing and passes the caller's W3C
``traceparent`` on to the agent as it came.

The caller and the agent are programs of their own, each with its OpenTelemetry set up as an
application does (a global ``TracerProvider`` exporting to the receiver): the SDK and the agent
host record with the program's tracer; the node with its own, from its settings.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from node.config import NodeConfig
from node.core import TRACEPARENT, Envelope, TraceParent
from node.core.models import TokenRole
from topology import build_node

from ..conftest import TEST_SECRET
from ..helpers import RunningNode, registration, start_node, wait_for

AGENT_ID = "demo.echo.otel_01"
OPERATION = "text.echo"
SERVER, CLIENT = 2, 3  # the protobuf's Span.SpanKind

TRACED_PROGRAM = """
import asyncio, os, sys
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

provider = TracerProvider(resource=Resource.create({"service.name": sys.argv[1]}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=os.environ["OTLP_ENDPOINT"])))
trace.set_tracer_provider(provider)
"""

AGENT_PROGRAM = TRACED_PROGRAM + f"""
from node.client.host import AgentHost

async def echo(envelope):
    return {{"echo": envelope.payload}}

async def main():
    registration = {{"agent_id": "{AGENT_ID}", "display_name": "Echo", "description": "Echoes",
                     "capabilities": [{{"name": "{OPERATION}", "version": "1", "description": "echo"}}]}}
    async with AgentHost(registration, echo, node_url=os.environ["NODE_URL"], token=os.environ["AGENT_TOKEN"]):
        print("serving", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes stdin

asyncio.run(main())
provider.shutdown()
"""

CALLER_PROGRAM = TRACED_PROGRAM + f"""
from node.client import Envelope, ReachClient

async def main():
    async with ReachClient(os.environ["NODE_URL"], token=os.environ["CALLER_TOKEN"]) as reach:
        result = await reach.send(Envelope(operation="{OPERATION}", payload={{"text": "hello"}}))
        assert result.status == 200 and result.envelope is not None, (result.status, result.body)
        print(result.envelope.trace_id, result.envelope.payload, flush=True)
        called = await reach.call("{OPERATION}", {{"text": "direct"}})  # resolve, then straight to the agent
        print(called.trace_id, called.payload, flush=True)

asyncio.run(main())
provider.shutdown()
"""


@dataclass
class ReceivedSpan:
    service: str
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    events: list[str]


@dataclass
class Receiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1 (``url``), keeping every span it decodes."""

    url: str = ""
    spans: list[ReceivedSpan] = field(default_factory=list)
    healthz: int = 0  # probes of its /healthz (a probe target for the node)

    def of(self, trace_id: str) -> list[ReceivedSpan]:
        return [span for span in self.spans if span.trace_id == trace_id]

    async def export(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf", request.content_type
        decoded = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in decoded.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(ReceivedSpan(
                        service=resource.get("service.name", ""), trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(), parent_span_id=span.parent_span_id.hex(), name=span.name,
                        kind=span.kind, attributes={a.key: _value(a.value) for a in span.attributes},
                        events=[event.name for event in span.events]))
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def health(self, request: web.Request) -> web.Response:
        self.healthz += 1
        return web.json_response({"ok": True})


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    received = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", received.export)
    app.router.add_get("/healthz", received.health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    received.url = f"http://127.0.0.1:{port}"
    yield received
    await runner.cleanup()


async def _node(redis_url: str, region: str, **settings: Any) -> RunningNode:
    config = NodeConfig(region=region, redis_url=redis_url, port=0, semantic_enabled=False, sweep_interval_ms=100,
                        lease_sync_interval_ms=100, egress={"allow": ["loopback"]}, **settings)
    return await start_node(build_node(config, secret=TEST_SECRET))


async def _program(tmp_path: Path, name: str, source: str, **env: str) -> asyncio.subprocess.Process:
    (tmp_path / f"{name}.py").write_text(source)
    return await asyncio.create_subprocess_exec(
        sys.executable, f"{name}.py", name, cwd=tmp_path, env={**os.environ, **env}, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


@pytest.mark.timeout(180)
async def test_one_call_through_sdk_node_and_agent_is_one_trace_of_three_spans(
        redis_url: str, region: str, receiver: Receiver, tmp_path: Path) -> None:
    node = await _node(redis_url, region, otel_traces_endpoint=f"{receiver.url}/v1/traces")
    endpoint = {"OTLP_ENDPOINT": f"{receiver.url}/v1/traces", "NODE_URL": node.url}
    agent = await _program(tmp_path, "agent", AGENT_PROGRAM, AGENT_TOKEN=node.token(AGENT_ID), **endpoint)
    try:
        assert agent.stdout is not None
        line = await asyncio.wait_for(agent.stdout.readline(), 60)
        assert line == b"serving\n", line + (await agent.stderr.read() if agent.stderr else b"")
        caller = await _program(tmp_path, "caller", CALLER_PROGRAM,
                                CALLER_TOKEN=node.token("demo.report.otel", TokenRole.CALLER), **endpoint)
        out, err = await asyncio.wait_for(caller.communicate(), 60)
        assert caller.returncode == 0, err.decode()
        lines = out.decode().splitlines()
        (trace_id, answer), (direct_trace_id, direct_answer) = (line.split(" ", 1) for line in lines)
        assert len(trace_id) == 32 and int(trace_id, 16) and "'echo': {'text': 'hello'}" in answer
        assert direct_trace_id != trace_id and "'echo': {'text': 'direct'}" in direct_answer

        spans = await wait_for(lambda: len(receiver.of(trace_id)) >= 3 and receiver.of(trace_id), timeout_s=30,
                               message="three spans of the call's trace")
        assert len(spans) == 3, spans
        by_service = {span.service: span for span in spans}
        calling, routing, serving = by_service["caller"], by_service["agent-reach-node"], by_service["agent"]
        assert (calling.parent_span_id, routing.parent_span_id, serving.parent_span_id) == (
            "", calling.span_id, routing.span_id)
        assert (calling.kind, routing.kind, serving.kind) == (CLIENT, SERVER, SERVER)
        assert (calling.name, routing.name, serving.name) == (
            f"invoke_agent {OPERATION}", f"invoke_agent {OPERATION}", f"invoke_agent {AGENT_ID}")
        for span in spans:
            assert span.attributes["gen_ai.operation.name"] == "invoke_agent", span
            assert "agent_reach.trace_id" not in span.attributes, span  # the trace id is the envelope's itself
        assert routing.attributes["gen_ai.agent.id"] == serving.attributes["gen_ai.agent.id"] == AGENT_ID
        assert calling.attributes["gen_ai.agent.id"] == AGENT_ID  # learnt from the node's answer
        assert routing.attributes["agent_reach.caller"] == "demo.report.otel" and routing.events == ["delivery"]
        assert routing.attributes["agent_reach.region"] == region

        # A direct call: the caller's span is the parent of the node's resolve and of the agent's span.
        direct = await wait_for(lambda: len(receiver.of(direct_trace_id)) >= 3 and receiver.of(direct_trace_id),
                                timeout_s=30, message="three spans of the direct call's trace")
        assert len(direct) == 3, direct
        by_service = {span.service: span for span in direct}
        calling, resolving, serving = by_service["caller"], by_service["agent-reach-node"], by_service["agent"]
        assert (calling.name, resolving.name, serving.name) == (
            f"invoke_agent {OPERATION}", f"resolve {OPERATION}", f"invoke_agent {AGENT_ID}")
        assert (calling.parent_span_id, resolving.parent_span_id, serving.parent_span_id) == (
            "", calling.span_id, calling.span_id)
        assert calling.attributes["gen_ai.agent.id"] == AGENT_ID

        # The node's resolve joins the trace the request's traceparent names, under its span.
        parent = TraceParent(trace_id, "00f067aa0ba902b7")
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{node.url}/v1/resolve", json={"capability": OPERATION},
                                    headers={**node.headers(), TRACEPARENT: parent.header()}) as response:
                assert response.status == 200 and (await response.json())["trace_id"] == trace_id
        resolved = await wait_for(lambda: [s for s in receiver.of(trace_id) if s.name.startswith("resolve")],
                                  timeout_s=30, message="the resolve span")
        assert [(s.name, s.parent_span_id, s.attributes["gen_ai.agent.id"]) for s in resolved] == [
            (f"resolve {OPERATION}", parent.span_id, AGENT_ID)]

        # Probes: a span each, against what the agent registered to be probed at.
        await node.register(registration("demo.probed.otel_01", endpoint=f"{receiver.url}/invoke",
                                         liveness_probe={"url": f"{receiver.url}/healthz", "interval_ms": 200}))
        probed = await wait_for(lambda: [s for s in receiver.spans if s.name == "probe liveness"], timeout_s=30,
                                message="a probe span")
        assert probed[0].attributes["gen_ai.agent.id"] == "demo.probed.otel_01" and probed[0].kind == CLIENT
    finally:
        if agent.stdin is not None:
            agent.stdin.close()
        try:
            await asyncio.wait_for(agent.wait(), 30)
        except TimeoutError:
            agent.kill()
            await agent.wait()
        await node.aclose()


async def test_without_an_endpoint_the_node_records_nothing_and_passes_the_callers_context_on(
        redis_url: str, region: str, receiver: Receiver) -> None:
    seen: list[tuple[str | None, Envelope]] = []

    async def agent(request: web.Request) -> web.Response:
        envelope = Envelope.model_validate_json(await request.read())
        seen.append((request.headers.get(TRACEPARENT), envelope))
        return web.Response(body=envelope.reply({"ok": True}).to_json(), content_type="application/json")

    app = web.Application()
    app.router.add_post("/invoke", agent)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    node = await _node(redis_url, region)
    try:
        assert not node.node.tracing.spans.recording
        await node.register(registration(AGENT_ID, capability=OPERATION,
                                         endpoint=f"http://127.0.0.1:{runner.addresses[0][1]}/invoke"))
        context = TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
        async with aiohttp.ClientSession() as session:  # an envelope naming no trace_id: it takes the caller's
            async with session.post(f"{node.url}/v1/send", json={"operation": OPERATION, "payload": {}},
                                    headers={**node.headers(), TRACEPARENT: context.header()}) as response:
                assert response.status == 200, await response.text()
                assert response.headers["X-Reach-Trace-Id"] == context.trace_id
        [(header, delivered)] = seen
        assert header == delivered.extensions[TRACEPARENT] == context.header()
        assert delivered.trace_id == context.trace_id
        assert receiver.spans == []
    finally:
        await node.aclose()
        await runner.cleanup()


@pytest.mark.unit
def test_an_endpoint_without_the_exporter_installed_is_refused_naming_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from node.ops import TelemetrySettings, otel

    assert TelemetrySettings(otel_traces_endpoint="http://127.0.0.1:4318/v1/traces").otel_traces_endpoint
    monkeypatch.setattr(otel, "_NEEDED", ("opentelemetry.no_such_exporter",))
    with pytest.raises(ValidationError, match=r"agent-reach\[otel\]"):
        TelemetrySettings(otel_traces_endpoint="http://127.0.0.1:4318/v1/traces")
    assert TelemetrySettings().otel_traces_endpoint is None  # off by default, nothing needed
