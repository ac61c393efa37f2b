"""Fair shares per tenant (a token's role and subject): rate budgets on by default and one per region,
per capability too, the watch share, the callback pool and the trace quota (issue "Tenants share
fairly"). Each test is an attack that worked before: a caller token named like an agent or
``admin`` spending their budgets, one tenant's slow callbacks starving another's, traced requests
the quota did not count.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from node.config import NodeConfig
from node.core import Envelope
from node.core.models import TokenRole

from ..conftest import NodeFactory
from ..helpers import RunningNode, registration, wait_for
from .test_proxy import EnvelopeAgent, send

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


async def _status(node: RunningNode, method: str, path: str, token: str,
                  json: Any = None) -> tuple[int, Any, dict[str, str]]:
    async with node.session.request(method, node.url + path, json=json, headers=node.headers(token)) as response:
        body = await response.json() if response.content_type == "application/json" else await response.read()
        return response.status, body, dict(response.headers)


async def test_a_caller_token_named_like_an_agent_spends_its_own_budget_not_the_agents(
        node_factory: NodeFactory) -> None:
    node = await node_factory(rate_limit_rps=0.01, rate_limit_burst=5)  # callers'; agents keep theirs
    await node.register(registration("pay.core.prod", capability="pay.charge"), token=node.token("admin",
                                                                                                  TokenRole.ADMIN))
    impostor = node.token("pay.core.prod", TokenRole.CALLER)
    answers = [(await _status(node, "GET", "/v1/agents/pay.core.prod", impostor)) for _ in range(6)]
    assert [status for status, _, _ in answers] == [200] * 5 + [429], answers
    # the real agent's heartbeat spends the agent's budget, untouched by its namesake
    status, body, _ = await _status(node, "PUT", "/v1/agents/pay.core.prod/heartbeat", node.token("pay.core.prod"), {})
    assert status == 200, body
    status, body, headers = answers[-1]
    assert body["error"] == "rate_limited" and body["details"]["budget"] == "caller", body
    assert int(headers["Retry-After"]) >= 1, headers


async def test_a_caller_named_admin_takes_neither_the_admins_watch_share_nor_its_budget(
        node_factory: NodeFactory) -> None:
    node = await node_factory(watch_streams_per_caller=2, rate_limit_rps=0.01, rate_limit_burst=4)
    impostor, admin = node.token("admin", TokenRole.CALLER), node.token("admin", TokenRole.ADMIN)
    held: list[aiohttp.ClientResponse] = []
    try:
        for _ in range(2):
            response = await node.session.get(node.url + "/v1/watch", headers=node.headers(impostor))
            held.append(response)
            assert response.status == 200
        refused = await node.session.get(node.url + "/v1/watch", headers=node.headers(impostor))
        assert refused.status == 429 and (await refused.json())["error"] == "too_many_watches"
        refused.release()
        while (await _status(node, "GET", "/v1/regions", impostor))[0] != 429:  # bounded: burst 4
            pass
        console = await node.session.get(node.url + "/v1/watch", headers=node.headers(admin))  # the console's watch
        held.append(console)
        assert console.status == 200
        assert (await _status(node, "GET", "/v1/regions", admin))[0] == 200
    finally:
        for response in held:
            response.close()


async def test_rate_limits_are_on_by_default_and_counted_in_metrics(node_factory: NodeFactory) -> None:
    defaults = NodeConfig(region="eu", redis_url="redis://127.0.0.1:6379/0")
    assert (defaults.rate_limit_rps, defaults.rate_limit_burst) == (200.0, 400)
    assert (defaults.rate_limit_agent_rps, defaults.rate_limit_capability_rps, defaults.rate_limit_admin_rps) == (
        100.0, 100.0, 0.0)
    node = await node_factory()  # the defaults
    token = node.token("app.eager.caller", TokenRole.CALLER)
    statuses: list[int] = []

    async def one() -> None:
        statuses.append((await _status(node, "GET", "/v1/regions", token))[0])

    while 429 not in statuses and len(statuses) < 4_000:  # bounded: 4,000 requests, 16 at a time
        await asyncio.gather(*(one() for _ in range(16)))
    assert statuses.count(200) >= 400 and 429 in statuses, (statuses.count(200), len(statuses))
    assert set(statuses) == {200, 429}
    metrics = (await node.session.get(node.url + "/metrics")).content
    text = (await metrics.read()).decode()
    assert 'agent_reach_rate_limited_total{budget="caller",region="' in text and 'role="caller"' in text, text[-2000:]


async def test_a_capability_has_a_budget_of_its_own_per_caller(node_factory: NodeFactory) -> None:
    node = await node_factory(rate_limit_capability_rps=0.01, rate_limit_capability_burst=3)
    for agent_id, capability in (("cap.one.a", "cap.one"), ("cap.two.a", "cap.two")):
        await node.register(registration(agent_id, capability=capability))
    token = node.token("app.cap.caller", TokenRole.CALLER)
    first = [(await _status(node, "POST", "/v1/resolve", token, {"capability": "cap.one"}))[0] for _ in range(4)]
    assert first == [200, 200, 200, 429], first
    status, body, _ = await _status(node, "POST", "/v1/resolve", token, {"capability": "cap.one"})
    assert status == 429 and body["details"]["budget"] == "capability", body
    assert (await _status(node, "POST", "/v1/resolve", token, {"capability": "cap.two"}))[0] == 200
    other = node.token("app.cap.other", TokenRole.CALLER)
    assert (await _status(node, "POST", "/v1/resolve", other, {"capability": "cap.one"}))[0] == 200


async def test_two_node_processes_of_a_region_spend_one_budget(node_factory: NodeFactory) -> None:
    options = {"rate_limit_rps": 0.05, "rate_limit_burst": 10, "rate_limit_sync_interval_ms": 20}
    first, second = await node_factory(**options), await node_factory(**options)
    token = first.token("app.spread.caller", TokenRole.CALLER)
    spent = [(await _status(first, "GET", "/v1/regions", token))[0] for _ in range(11)]
    assert spent == [200] * 10 + [429], spent
    budgets = first.node.budgets
    await wait_for(lambda: budgets.shared == budgets.admitted, message="the first process's sync")
    # The second process knows nothing yet: it admits one, learns the region's level, then refuses.
    assert (await _status(second, "GET", "/v1/regions", token))[0] == 200
    budgets = second.node.budgets
    await wait_for(lambda: budgets.shared == budgets.admitted, message="the second process's sync")
    status, body, headers = await _status(second, "GET", "/v1/regions", token)
    assert status == 429 and int(headers["Retry-After"]) >= 1, body


async def test_one_tenants_slow_callbacks_leave_the_pool_to_others(node_factory: NodeFactory) -> None:
    node = await node_factory(proxy={"max_background": 50})  # a tenant's share: a tenth, 5
    slow = await EnvelopeAgent("slow").start()
    slow.gate = asyncio.Event()
    results = await _CallbackSink().start()
    try:
        await node.register(registration("slow.work.agent", capability="slow.work", endpoint=slow.invoke_url))
        for tenant in ("tenant.one.app", "tenant.two.app"):
            await node.register(registration(tenant, capability=f"{tenant}.none",
                                             callback_endpoint=f"{results.url}/{tenant}"))
        hostile = node.token("tenant.one.app")
        statuses = [(await send(node, Envelope(operation="slow.work", payload={"n": n}), token=hostile,
                                delivery="callback"))[0] for n in range(50)]
        assert statuses.count(202) == 5 and statuses.count(429) == 45, statuses
        status, body, _ = await send(node, Envelope(operation="slow.work", payload={"n": "other"}),
                                     token=node.token("tenant.two.app"), delivery="callback")
        assert status == 202, body
        _, refused, headers = await send(node, Envelope(operation="slow.work", payload={}), token=hostile,
                                         delivery="callback")
        assert refused["error"] == "background_full" and "Retry-After" in headers, refused
        # a caller token named like the agent does not get the agent's callbacks
        status, body, _ = await send(node, Envelope(operation="slow.work", payload={}), delivery="callback",
                                     token=node.token("tenant.two.app", TokenRole.CALLER))
        assert status == 422 and body["error"] == "no_callback_endpoint", body
    finally:
        slow.gate.set()
        await wait_for(lambda: len(results.received) == 6, timeout_s=30, message="every accepted callback")
        await results.aclose()
        await slow.aclose()


class _CallbackSink:
    """Where callback-mode results go: records the path each arrived at."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> _CallbackSink:
        app = web.Application()
        app.router.add_post("/{name}", self._result)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def _result(self, request: web.Request) -> web.Response:
        self.received.append(request.match_info["name"])
        return web.json_response({})

    async def aclose(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def test_traced_resolves_and_sends_count_against_the_callers_trace_quota(
        node_factory: NodeFactory, redis_url: str) -> None:
    node = await node_factory(proxy={"trace_caller_bytes": 6_000})
    agent = await EnvelopeAgent("quota").start()
    try:
        await node.register(registration("quota.echo.agent", capability="quota.echo", endpoint=agent.invoke_url))
        token = node.token("app.tracing.caller", TokenRole.CALLER)
        statuses = []
        for n in range(60):  # bounded: each request a fresh trace id; a few hundred bytes of records each
            if n % 2:
                status, body, _ = await send(node, Envelope(operation="quota.echo", payload={"n": n},
                                                            trace_id=f"trace-fresh-{n}"), token=token)
            else:
                status, body, _ = await _status(node, "POST", "/v1/resolve", token,
                                                {"capability": "quota.echo", "trace_id": f"trace-fresh-{n}"})
            statuses.append(status)
            if status == 429:
                assert body["error"] == "trace_quota", body
        assert 200 in statuses and statuses[-1] == 429, statuses
        written = statuses.index(429)
        async with aioredis.from_url(redis_url) as redis:
            base = node.node.store.key_base  # other tests' regions share the server
            traces = [key async for key in redis.scan_iter(match=f"{base}:trace:trace-fresh-*/node")]
            assert len(traces) == written, (len(traces), written)  # nothing written once refused
            quota = await redis.hgetall(f"{base}:trace:/quota/caller:app.tracing.caller")
            assert sum(int(value) for value in quota.values()) >= 6_000, quota
        # an untraced resolve still answers: the quota is of traces
        assert (await _status(node, "POST", "/v1/resolve", token, {"capability": "quota.echo"}))[0] == 200
    finally:
        await agent.aclose()
