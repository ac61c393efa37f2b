"""Calling A2A agents as A2A: a server built with a2a-sdk's server apps (uvicorn on 127.0.0.1),
registered from its card, probed at its interface, and called by the SDK (``ReachClient.call``)
in the binding its card declares — JSON-RPC ``SendMessage`` (1.0) and ``message/send`` (0.3),
HTTP+JSON ``message:send`` — with the route credential as ``Authorization: Bearer``; a JSON-RPC
error in an HTTP 200 is a failed call, reported to the node as a failure; GRPC is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from a2a.helpers.proto_helpers import get_message_text, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import a2a_pb2 as pb
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette

from node.client import CallFailed, ReachClient, UnsupportedBinding
from node.core import now_ms
from node.core.models import Outcome, TokenRole

from ..conftest import NodeFactory
from ..helpers import RunningNode, free_port, wait_for


class Echo(AgentExecutor):
    """Answers every message with one text message: ``echo: <the text or data it got>``."""

    def __init__(self) -> None:
        self.seen: list[pb.Message] = []

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        assert message is not None
        self.seen.append(message)
        text = get_message_text(message) or str(MessageToDict(message.parts[0]).get("data"))
        await event_queue.enqueue_event(new_text_message(f"echo: {text}"))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


def card(port: int, interfaces: list[tuple[str, str, str]]) -> pb.AgentCard:
    return pb.AgentCard(
        name="Echo", description="Says it back", version="1.0.0",
        supported_interfaces=[pb.AgentInterface(url=url.format(port=port), protocol_binding=binding,
                                                protocol_version=version) for url, binding, version in interfaces],
        capabilities=pb.AgentCapabilities(streaming=False), default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[pb.AgentSkill(id="Echo", name="Echo", description="Echo the text", tags=["Echo", "test"])])


class A2AServer:
    """a2a-sdk's JSON-RPC (with v0.3 compat), strict JSON-RPC (1.0 only) and REST apps on one port."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.executor = Echo()
        self.authorizations: list[str | None] = []
        agent_card = card(port, [("http://127.0.0.1:{port}/a2a/jsonrpc", "JSONRPC", "1.0")])
        handler = DefaultRequestHandler(self.executor, InMemoryTaskStore(), agent_card)
        app = Starlette(routes=[*create_agent_card_routes(agent_card),
                                *create_jsonrpc_routes(handler, rpc_url="/a2a/jsonrpc", enable_v0_3_compat=True),
                                *create_jsonrpc_routes(handler, rpc_url="/a2a/strict"),
                                *create_rest_routes(handler, path_prefix="/a2a/rest")])
        app.add_middleware(_Recorder, seen=self.authorizations)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                    lifespan="off"))
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> A2AServer:
        self.task = asyncio.create_task(self.server.serve())
        await wait_for(lambda: self.server.started, timeout_s=10, message="the A2A server listening")
        return self

    async def aclose(self) -> None:
        self.server.should_exit = True
        if self.task is not None:
            await asyncio.wait_for(self.task, timeout=10)


class _Recorder:
    """ASGI middleware keeping each request's Authorization header."""

    def __init__(self, app: Any, seen: list[str | None]) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            self.seen.append(dict(scope["headers"]).get(b"authorization", b"").decode() or None)
        await self.app(scope, receive, send)


@pytest.fixture
async def a2a_node(node_factory: NodeFactory) -> RunningNode:
    return await node_factory()


@pytest.fixture
async def a2a_server() -> AsyncIterator[A2AServer]:
    server = A2AServer(free_port())
    try:
        yield server
    finally:
        await server.aclose()


async def register(node: RunningNode, agent_id: str, port: int, interfaces: list[tuple[str, str, str]]) -> None:
    status, body = await node.call("POST", "/v1/agent-cards", json={
        "agent_id": agent_id, "card": MessageToDict(card(port, interfaces)),
        "readiness_probe": None, "lease_ttl_ms": 600_000})
    assert status == 201, body


async def ready(node: RunningNode, agent_id: str) -> bool:
    status, record = await node.call("GET", f"/v1/agents/{agent_id}")
    return status == 200 and record["ready"]


async def test_a_card_registered_agent_is_ready_only_once_its_interface_answers(
        a2a_node: RunningNode, a2a_server: A2AServer) -> None:
    await register(a2a_node, "echo.jsonrpc.one", a2a_server.port, [("http://127.0.0.1:{port}/a2a/jsonrpc",
                                                                    "JSONRPC", "1.0")])
    status, record = await a2a_node.call("GET", "/v1/agents/echo.jsonrpc.one")
    assert record["ready"] is False and record["readiness_probe"]["accept"] == "listening"
    await wait_for(lambda: a2a_node.node.prober.probes_run > 0, timeout_s=10, message="a probe")
    status, body = await a2a_node.resolve(agent_id="echo.jsonrpc.one")
    assert status == 404 and "not_ready" in str(body["details"]), body  # nothing listens yet

    await a2a_server.start()  # a GET at the JSON-RPC URL answers 405: something listens
    await wait_for(lambda: ready(a2a_node, "echo.jsonrpc.one"), timeout_s=15, message="ready once it listens")


@pytest.mark.parametrize("interface, method", [
    (("http://127.0.0.1:{port}/a2a/jsonrpc", "JSONRPC", "1.0"), "SendMessage"),
    (("http://127.0.0.1:{port}/a2a/jsonrpc", "JSONRPC", "0.3"), "message/send"),
    (("http://127.0.0.1:{port}/a2a/rest", "HTTP+JSON", "1.0"), "message:send"),
])
async def test_the_sdk_calls_an_a2a_agent_in_its_binding(a2a_node: RunningNode, a2a_server: A2AServer,
                                                         interface: tuple[str, str, str], method: str) -> None:
    await a2a_server.start()
    await register(a2a_node, "echo.a2a.one", a2a_server.port, [interface])
    await wait_for(lambda: ready(a2a_node, "echo.a2a.one"), timeout_s=15, message="ready")
    caller = a2a_node.token("shop.checkout.one", TokenRole.CALLER)
    async with ReachClient(a2a_node.url, token=caller) as reach:
        ticket = await reach.resolve(tags=["ECHO"])  # a skill tag, any case
        assert ticket.target.binding == interface[1] and ticket.target.protocol_version == interface[2]
        assert ticket.match.kind.value == "tag" and ticket.match.capability == "echo"
        text = await reach.call("echo", "EUR to USD?")
        data = await reach.call("echo", {"amount": 100})

    # 1.0 answers a SendMessageResponse ({"message": ...}); 0.3 the message itself
    answer = text.body if interface[2] == "0.3" else text.body["message"]
    assert answer["parts"][0]["text"] == "echo: EUR to USD?", text.body
    assert "amount" in (data.body if interface[2] == "0.3" else data.body["message"])["parts"][0]["text"]
    assert get_message_text(a2a_server.executor.seen[0]) == "EUR to USD?"
    # The route credential travelled as the A2A agent's bearer token.
    assert a2a_server.authorizations and all(h and h.startswith("Bearer ey") for h in a2a_server.authorizations)


async def test_a_jsonrpc_error_in_an_http_200_is_a_failed_call(a2a_node: RunningNode,
                                                               a2a_server: A2AServer) -> None:
    await a2a_server.start()
    # /a2a/strict speaks 1.0 only: the 0.3 method is answered -32601 with HTTP 200.
    await register(a2a_node, "echo.strict.one", a2a_server.port, [("http://127.0.0.1:{port}/a2a/strict",
                                                                   "JSONRPC", "0.3")])
    await wait_for(lambda: ready(a2a_node, "echo.strict.one"), timeout_s=15, message="ready")
    async with ReachClient(a2a_node.url, token=a2a_node.token("shop.checkout.one", TokenRole.CALLER),
                           report_flush_interval_ms=50) as reach:
        with pytest.raises(CallFailed) as failed:
            await reach.call("echo", "hello")
        await reach.flush_reports()
    attempt = failed.value.attempts[0]
    assert attempt.outcome is Outcome.FAILURE and attempt.status == 200 and "JSON-RPC error -32601" in attempt.error
    await wait_for(lambda: a2a_node.node.outcomes.weight_factor("echo.strict.one", now_ms=now_ms()) < 1.0,
                   timeout_s=5, message="the node counted the failure")


async def test_a_grpc_agent_is_refused_with_a_clear_error(a2a_node: RunningNode, a2a_server: A2AServer) -> None:
    await a2a_server.start()
    await register(a2a_node, "echo.grpc.one", a2a_server.port, [("127.0.0.1:{port}", "GRPC", "1.0")])
    await wait_for(lambda: ready(a2a_node, "echo.grpc.one"), timeout_s=15, message="ready")
    async with ReachClient(a2a_node.url, token=a2a_node.token("shop.checkout.one", TokenRole.CALLER)) as reach:
        ticket = await reach.resolve("echo")
        assert ticket.target.binding == "GRPC" and ticket.target.endpoint == f"grpc://127.0.0.1:{a2a_server.port}"
        with pytest.raises(UnsupportedBinding) as refused:
            await reach.call("echo", "hello")
    assert "GRPC" in refused.value.message and "a2a-sdk" in refused.value.message
    assert a2a_server.executor.seen == []
