"""One attempt and one failover (node.delivery.attempts) for the SDK and the proxy alike, on real HTTP.

The same misbehaving targets are called directly (``ReachClient.call``) and through the node
(``POST /v1/send``); both must treat them the same way: redirects never followed, answers
capped, the same headers sent, an address tried once however many agents stand behind it.
"""

from __future__ import annotations

import random
import subprocess
import sys
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError

from node.client import CallFailed, ClientSettings, ReachClient
from node.config import ProxySettings
from node.core import Envelope
from node.core.models import TokenRole
from node.delivery import AttemptLimits, DeliverySettings, RetryPolicy
from node.http import bound_port
from node.http.proxy import PROXY_KEY
from node.http.traces import TRACES_KEY
from node.service import RegistryNode
from topology import Topology

from ..conftest import TEST_SECRET
from ..helpers import RunningNode, registration, start_node


class Target:
    """A real HTTP target on 127.0.0.1 with one route per behaviour; counts and records what it gets."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self.headers: list[dict[str, str]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> Target:
        app = web.Application()
        for name, handler in (("echo", self._echo), ("redirect", self._redirect), ("steal", self._echo),
                              ("big", self._big), ("fail", self._fail)):
            app.router.add_post(f"/{name}", handler)
            app.router.add_post(f"/{name}/{{size}}", handler)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{bound_port(self.runner)}"
        return self

    def _count(self, request: web.Request) -> None:
        route = request.path.split("/")[1]
        self.hits[route] = self.hits.get(route, 0) + 1
        self.headers.append({key: value for key, value in request.headers.items() if key.startswith("X-Reach-")})

    async def _echo(self, request: web.Request) -> web.Response:
        self._count(request)
        envelope = Envelope.model_validate_json(await request.read())
        return web.Response(body=envelope.reply({"hop_count": envelope.hop_count}).to_json(),
                            content_type="application/json")

    async def _redirect(self, request: web.Request) -> web.Response:
        self._count(request)
        raise web.HTTPTemporaryRedirect(f"{self.url}/steal")

    async def _big(self, request: web.Request) -> web.Response:
        self._count(request)
        return web.Response(body=b"x" * int(request.match_info["size"]), content_type="application/octet-stream")

    async def _fail(self, request: web.Request) -> web.Response:
        self._count(request)
        return web.json_response({"error": "down"}, status=503)

    async def aclose(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


@pytest.fixture
async def target() -> Any:
    server = await Target().start()
    try:
        yield server
    finally:
        await server.aclose()


async def send(node: RunningNode, envelope: Envelope, *, token: str) -> tuple[int, Any, dict[str, str]]:
    async with node.session.post("/v1/send", data=envelope.to_json(),
                                 headers={**node.headers(token), "Content-Type": "application/json"}) as response:
        body: Any = await response.read()
        if response.content_type == "application/json":
            body = await response.json()
        return response.status, body, dict(response.headers)


async def test_neither_follows_a_redirect(node: RunningNode, target: Target) -> None:
    await node.register(registration("hop.redirect.one", capability="hop.redirect", endpoint=f"{target.url}/redirect"))
    async with ReachClient(node.url, token=node.admin_token) as client:
        with pytest.raises(CallFailed) as caught:
            await client.call("hop.redirect", {"secret": 1})
    [attempt] = caught.value.attempts
    assert attempt.status == 307 and "never follows redirects" in (attempt.error or "")
    status, body, _ = await send(node, Envelope(operation="hop.redirect", payload={"card_number": 1}),
                                 token=node.token("app.caller.one"))
    assert status == 502 and "never follows redirects" in body["details"]["attempts"][0]["error"]
    assert target.hits == {"redirect": 2}  # the body never went to the redirect's target


async def test_both_cap_the_answer_size(node_factory, target: Target) -> None:
    node = await node_factory(proxy=ProxySettings(max_response_bytes=4_096))
    await node.register(registration("hop.big.large", capability="hop.large", endpoint=f"{target.url}/big/8192"))
    await node.register(registration("hop.big.small", capability="hop.small", endpoint=f"{target.url}/big/4096"))
    async with ReachClient(node.url, token=node.admin_token, max_response_bytes=4_096) as client:
        with pytest.raises(CallFailed) as caught:
            await client.call("hop.large", {})
        assert "exceeds this client's limit of 4096 bytes" in (caught.value.attempts[0].error or "")
        fitting = await client.call("hop.small", {})
        assert fitting.status == 200 and fitting.body == b"x" * 4_096
    token = node.token("app.caller.one")
    status, body, _ = await send(node, Envelope(operation="hop.large", payload={}), token=token)
    assert status == 502 and "exceeds the proxy's limit of 4096 bytes" in body["details"]["attempts"][0]["error"]
    status, body, _ = await send(node, Envelope(operation="hop.small", payload={}), token=token)
    assert status == 200 and body == b"x" * 4_096


async def test_both_send_the_same_headers(node: RunningNode, target: Target) -> None:
    await node.register(registration("hop.echo.one", capability="hop.echo", endpoint=f"{target.url}/echo"))
    direct = Envelope(operation="hop.echo", payload={}, hop_count=2, trace_id="trace-headers")
    async with ReachClient(node.url, token=node.admin_token) as client:
        result = await client.call(envelope=direct)
    assert result.payload == {"hop_count": 3}
    proxied = direct.model_copy(update={"id": "msg_headers_proxied"})
    status, body, _ = await send(node, proxied, token=node.token("app.caller.one"))
    assert status == 200 and body["payload"] == {"hop_count": 3}
    sdk_headers, proxy_headers = target.headers
    # The proxy alone adds its signed stamp of the hop count (node.http.proxy.hops): a direct call's
    # count is the calling agent's to keep.
    stamp = proxy_headers.pop("X-Reach-Hop")
    assert node.node.signer.verify_hop(stamp) == {"trc": "trace-headers", "hop": 3, "to": "hop.echo.one"}
    assert sdk_headers == {"X-Reach-Trace-Id": "trace-headers", "X-Reach-Envelope-Id": direct.id,
                           "X-Reach-Hop-Count": "3"}
    assert proxy_headers == {"X-Reach-Trace-Id": "trace-headers", "X-Reach-Envelope-Id": proxied.id,
                             "X-Reach-Hop-Count": "3"}


async def test_an_address_is_tried_once_however_many_agents_stand_behind_it(node: RunningNode,
                                                                            target: Target) -> None:
    shared = f"{target.url}/fail"
    behind = ["hop.shared.first", "hop.shared.second"]
    for agent_id in behind:  # nearly every decision picks one of these two first (10000 : 1)
        await node.register(registration(agent_id, capability="hop.shared", endpoint=shared, weight=10_000))
    await node.register(registration("hop.shared.healthy", capability="hop.shared", endpoint=f"{target.url}/echo",
                                     weight=1))
    async with ReachClient(node.url, token=node.admin_token, sleep=_no_wait, rng=random.Random(1)) as client:
        result = await client.call("hop.shared", {}, idempotent=True)
    tried = [attempt.agent_id for attempt in result.attempts]
    assert tried[-1] == "hop.shared.healthy" and len([a for a in tried if a in behind]) <= 1, tried
    assert target.hits.get("fail", 0) == len(tried) - 1

    before = target.hits.get("fail", 0)
    status, body, headers = await send(node, Envelope(operation="hop.shared", payload={}, idempotent=True),
                                       token=node.token("app.caller.one"))
    assert status == 200 and headers["X-Reach-Agent"] == "hop.shared.healthy", (status, body)
    assert target.hits["fail"] - before == int(headers["X-Reach-Attempts"]) - 1 <= 1
    print(f"\nshared address: SDK tried {tried}, proxy took {headers['X-Reach-Attempts']} attempt(s)")


async def _no_wait(seconds: float) -> None:
    return None


@pytest.mark.unit
def test_the_sdk_and_the_proxy_are_timed_and_retried_by_one_settings_type() -> None:
    sdk, proxy = ClientSettings(), ProxySettings()
    assert isinstance(sdk, DeliverySettings) and isinstance(proxy, DeliverySettings)
    for name, original in DeliverySettings.model_fields.items():  # one rule per setting, each its own default
        for field in (ClientSettings.model_fields[name], ProxySettings.model_fields[name]):
            assert (field.annotation, field.metadata, field.description) == (
                original.annotation, original.metadata, original.description), name
    assert (sdk.retry_initial_backoff_ms, proxy.retry_initial_backoff_ms) == (500, 100)
    assert sdk.retry_policy() == RetryPolicy()  # the SDK's defaults are the policy's
    assert proxy.retry_policy() == RetryPolicy(initial_backoff_s=0.1, max_backoff_s=2.0)
    assert proxy.attempt_limits(owner="the proxy's") == AttemptLimits(
        connect_timeout_s=3.0, read_timeout_s=30.0, max_response_bytes=4 * 2**20, owner="the proxy's")
    for settings in (ClientSettings, ProxySettings):  # and one rule for a longest backoff below the first
        with pytest.raises(ValidationError, match="retry_max_backoff_ms must be at least retry_initial_backoff_ms"):
            settings(retry_initial_backoff_ms=3_000, retry_max_backoff_ms=2_000)


async def test_the_proxy_is_configured_from_a_topology_file(redis_url: str, region: str, target: Target) -> None:
    topology = Topology.model_validate({
        "name": "proxy-settings",
        "node": {"proxy": {"max_hops": 3, "trace_max_events": 7}},
        "regions": [{"name": region, "node_urls": ["http://127.0.0.1:7391"],
                     "node": {"proxy": {"max_response_bytes": 2_048}, "egress": {"allow": ["loopback"]}}},
                    {"name": "other", "node_urls": ["http://127.0.0.1:7392"]}],
    })
    assert topology.node_config("other", redis_url=redis_url).proxy == ProxySettings(max_hops=3, trace_max_events=7)
    config = topology.node_config(region, redis_url=redis_url, port=0)
    # a region's node table replaces the [node] table's proxy settings as a whole (one merge level)
    assert config.proxy == ProxySettings(max_response_bytes=2_048)
    with pytest.raises(ValidationError, match="node.proxy.max_response_bytes"):
        Topology.model_validate({"name": "bad", "node": {"proxy": {"max_response_bytes": 0}},
                                 "regions": [{"name": "a", "node_urls": ["http://127.0.0.1:7391"]}]})

    running = await start_node(RegistryNode(config, secret=TEST_SECRET))
    try:
        app = running.runner.app
        assert app[PROXY_KEY].settings is config.proxy and app[TRACES_KEY] is app[PROXY_KEY].traces
        await running.register(registration("hop.cfg.big", capability="hop.cfg", endpoint=f"{target.url}/big/4096"))
        status, body, _ = await send(running, Envelope(operation="hop.cfg", payload={}, trace_id="trace-cfg"),
                                     token=running.token("app.caller.one"))
        assert status == 502 and "limit of 2048 bytes" in body["details"]["attempts"][0]["error"]
        # the counter is the node's own metric now
        metrics = running.node.metrics.render().decode()
        assert 'agent_reach_proxy_sends_total{result="failed"} 1.0' in metrics
        status, trace = await running.call("GET", "/v1/traces/trace-cfg")
        assert status == 200 and [e["event"] for e in trace["events"]] == ["decision", "delivery", "outcome"]
    finally:
        await running.aclose()


def test_the_sdk_imports_without_the_server() -> None:
    """A fresh interpreter: ``from node.client import ReachClient`` loads no server module."""
    probe = (
        "import sys\n"
        "from node.client import ReachClient\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    loaded = set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                timeout=60).stdout.split())
    server_rooms = ("node.store", "node.view", "node.routing", "node.trust", "node.duties", "node.http", "node.ops")
    server = {"node.service", "node.config", "node.envconfig",
              "redis", "prometheus_client", "aiohttp.web", "aiokafka", "federation", "semantic", "topology"}
    assert not loaded & server, sorted(loaded & server)
    assert not {name for name in loaded if name.startswith(tuple(f"{room}." for room in server_rooms))}
    assert not loaded & set(server_rooms), sorted(loaded & set(server_rooms))
    assert not {name for name in loaded if name.startswith(("redis.", "prometheus_client.", "federation."))}
    assert {"node.client", "node.delivery.attempts", "node.core.models", "node.core.envelope",
            "node.core.errors"} <= loaded


def test_node_exports_are_lazy_and_complete() -> None:
    probe = (
        "import sys, node\n"
        "assert 'node.service' not in sys.modules\n"
        "from node import RegistryNode, NodeConfig, Router, StoreUnavailable\n"
        "assert RegistryNode.__module__ == 'node.service' and 'node.service' in sys.modules\n"
        "missing = [name for name in node.__all__ if getattr(node, name, None) is None]\n"
        "assert not missing, missing\n"
        "print(len(node.__all__))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 39


async def test_a_caller_token_is_enough_for_both(node: RunningNode, target: Target) -> None:
    """Sanity of the shared path with the least privileged token: resolve, deliver, report."""
    await node.register(registration("hop.echo.caller", capability="hop.caller", endpoint=f"{target.url}/echo"))
    token = node.token("app.caller.one", TokenRole.CALLER)
    async with ReachClient(node.url, token=token, report_flush_interval_ms=10) as client:
        result = await client.call("hop.caller", {})
        await client.flush_reports()
        assert result.agent_id == "hop.echo.caller" and client.reports_sent == 1
    status, _, headers = await send(node, Envelope(operation="hop.caller", payload={}), token=token)
    assert status == 200 and headers["X-Reach-Agent"] == "hop.echo.caller"
