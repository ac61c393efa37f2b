"""The agent SDK against a real node and real agent servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from typing import Any

import pytest
from aiohttp import web

from node.client import (
    AgentConfigError,
    CallFailed,
    CallRejected,
    CallTimeout,
    ReachClient,
    RetryPolicy,
    load_agent_config,
)
from node.core.models import Load, TokenRole
from node.delivery import BreakerState
from node.http import bound_port, serve

from ..helpers import AgentServer, RunningNode, free_port, registration, wait_for


class FailingAgent(AgentServer):
    """An agent whose /invoke answers 503: it receives the request, then fails it."""

    async def _invoke(self, request: web.Request) -> web.Response:
        self.calls += 1
        return web.json_response({"error": "overloaded"}, status=503)


class RecordingSleep:
    """An injected sleep: records each wait and returns at once (no wall time)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def expected_backoff(attempt: int, draw: float, *, initial: float = 0.5, multiplier: float = 2.0,
                     maximum: float = 8.0, jitter: float = 0.2) -> float:
    return min(maximum, initial * multiplier ** attempt) * (1 + jitter * (2 * draw - 1))


@pytest.mark.unit
def test_backoff_follows_the_formula_with_injected_rng() -> None:
    policy = RetryPolicy()  # the defaults: 500 ms, ×2, 8 s, ±20 %, 3 attempts
    assert (policy.initial_backoff_s, policy.multiplier, policy.max_backoff_s, policy.jitter_ratio,
            policy.max_attempts) == (0.5, 2.0, 8.0, 0.2, 3)
    rng, replay = random.Random(42), random.Random(42)
    waits = [policy.backoff_s(attempt, rng) for attempt in range(8)]
    assert waits == [expected_backoff(attempt, replay.random()) for attempt in range(8)]

    class Fixed(random.Random):
        def __init__(self, value: float) -> None:
            super().__init__()
            self.value = value

        def random(self) -> float:
            return self.value

    assert [policy.backoff_s(a, Fixed(0.5)) for a in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert policy.backoff_s(0, Fixed(0.0)) == pytest.approx(0.4)   # -20 %
    assert policy.backoff_s(6, Fixed(1.0)) == pytest.approx(9.6)   # the cap, +20 %


async def test_register_retries_with_backoff_until_the_node_answers(node: RunningNode) -> None:
    port = free_port()  # nothing listens here until the second backoff has passed
    sleep = RecordingSleep()
    runners = []

    async def sleep_then_open_the_port(seconds: float) -> None:
        await sleep(seconds)
        if len(sleep.waits) == 2:
            runners.append(await serve(node.node, host="127.0.0.1", port=port))
        if len(sleep.waits) > 5:
            raise AssertionError(f"still retrying after {sleep.waits}")

    client = ReachClient(f"http://127.0.0.1:{port}", token=node.token("lang.translate.late"),
                         sleep=sleep_then_open_the_port, rng=random.Random(3),
                         registration=registration("lang.translate.late", lease_ttl_ms=3_000))
    try:
        async with client:
            assert client.registered is not None and client.registered.agent_id == "lang.translate.late"
            replay = random.Random(3)
            assert sleep.waits == [expected_backoff(0, replay.random()), expected_backoff(1, replay.random())]
            status, record = await node.call("GET", "/v1/agents/lang.translate.late")
            assert status == 200 and record["agent_id"] == "lang.translate.late"
    finally:
        for runner in runners:
            await runner.cleanup()


async def test_rejected_registration_raises_at_once(node_factory) -> None:
    node = await node_factory(allowed_transports=["https+token"])
    sleep = RecordingSleep()
    client = ReachClient(node.url, token=node.token("lang.translate.plain"), sleep=sleep,
                         registration=registration("lang.translate.plain"))
    with pytest.raises(Exception) as caught:
        await client.start()
    assert getattr(caught.value, "code", None) == "transport_not_allowed"
    assert sleep.waits == []  # a rejection is not retried


class ThreadedAgent:
    """An SDK agent running in a thread with its own event loop, like an agent process.

    Its /invoke handler busy-loops for ``block_s`` seconds *on the agent's event loop* (pure
    Python, holding the GIL between switches), the way a careless CPU-bound handler would.
    """

    def __init__(self, node: RunningNode, agent_id: str, *, heartbeat_in_thread: bool) -> None:
        self.node = node
        self.agent_id = agent_id
        self.heartbeat_in_thread = heartbeat_in_thread
        self.url = ""
        self.client: ReachClient | None = None
        self.inflight = 0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name=f"agent-{agent_id}",
                                        daemon=True)
        self.error: BaseException | None = None

    async def _invoke(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.inflight += 1
        end = time.monotonic() + float(body["payload"]["block_s"])
        while time.monotonic() < end:  # blocks this event loop: nothing else on it runs
            pass
        self.inflight -= 1
        return web.json_response({"blocked_s": body["payload"]["block_s"]})

    async def _main(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            app = web.Application()
            app.router.add_post("/invoke", self._invoke)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self.url = f"http://127.0.0.1:{bound_port(runner)}"
            self.client = ReachClient(
                self.node.url, token=self.node.token(self.agent_id), heartbeat_in_thread=self.heartbeat_in_thread,
                register_max_wait_ms=5_000,
                registration=registration(self.agent_id, capability="work.block", endpoint=self.url + "/invoke",
                                          lease_ttl_ms=1_500),
                load=lambda: Load(inflight=self.inflight))
            async with self.client:
                self._ready.set()
                await self._stop.wait()
            await runner.cleanup()
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self._ready.set()

    async def __aenter__(self) -> ThreadedAgent:
        self._thread.start()
        # wait off the loop: the node this agent registers with runs on it
        await asyncio.to_thread(self._ready.wait, 15)
        if self.error is not None:
            raise self.error
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        await asyncio.to_thread(self._thread.join, 15)


async def _leases_while_blocked(node: RunningNode, agent: ThreadedAgent, block_s: float
                                ) -> tuple[set[int], list[int], dict[str, Any]]:
    """Block the agent's loop for ``block_s``; meanwhile watch its lease and resolvability."""
    leases: set[int] = set()
    statuses: list[int] = []
    invoke = asyncio.ensure_future(node.session.post(agent.url + "/invoke", json={"payload": {"block_s": block_s}}))
    deadline = time.monotonic() + block_s
    while time.monotonic() < deadline - 0.1:
        record = node.node.cache.index.get(agent.agent_id)
        if record is not None:
            leases.add(record.lease_expires_at_ms)
        status, _ = await node.resolve(capability="work.block", scope="local")
        statuses.append(status)
        await asyncio.sleep(0.05)
    response = await invoke
    body = await response.json()
    response.release()
    return leases, statuses, body


async def test_heartbeat_keeps_flowing_while_the_handler_blocks_the_event_loop(node: RunningNode) -> None:
    block_s = 3.0  # two lease lifetimes (1.5 s): without heartbeats the agent would expire
    async with ThreadedAgent(node, "work.blocker.threaded", heartbeat_in_thread=True) as agent:
        assert agent.client is not None and agent.client.heartbeat_stats is not None
        sent_before = agent.client.heartbeat_stats.sent
        leases, statuses, body = await _leases_while_blocked(node, agent, block_s)
        assert body == {"blocked_s": block_s}
        sent_during = agent.client.heartbeat_stats.sent - sent_before
        # interval = lease/3 = 500 ms: ~6 beats in 3 s; the lease moved forward again and again
        assert sent_during >= 4, agent.client.heartbeat_stats
        assert len(leases) >= 4, sorted(leases)
        assert statuses and all(status == 200 for status in statuses), statuses
        print(f"\nhandler blocked its loop {block_s:.1f} s: {sent_during} heartbeats, {len(leases)} lease renewals "
              f"seen, {len(statuses)} resolves all 200")
        assert agent.client.heartbeat_stats.thread_name == "reach-heartbeat-work.blocker.threaded"
        # the load callback was read on the heartbeat thread while the handler ran
        assert node.node.cache.index.get(agent.agent_id) is not None


async def test_heartbeats_on_the_agents_own_loop_starve_and_then_reregister(node: RunningNode) -> None:
    """The control: the same blocking handler with heartbeats as a task on the agent's loop."""
    async with ThreadedAgent(node, "work.blocker.task", heartbeat_in_thread=False) as agent:
        leases, statuses, _ = await _leases_while_blocked(node, agent, 3.0)
        assert 404 in statuses, "the lease should lapse when heartbeats share the blocked loop"
        print(f"\nheartbeats on the blocked loop: {len(leases)} lease value(s) seen, "
              f"{statuses.count(404)}/{len(statuses)} resolves found nobody")
        # once the handler returns, the next heartbeat meets unknown_agent and registers again
        assert agent.client is not None
        await wait_for(lambda: agent.client.heartbeat_stats.reregistered >= 1, timeout_s=5,
                       message="re-registration after unknown_agent")
        status, _ = await node.resolve(capability="work.block", scope="local")
        assert status == 200


async def test_load_callback_reregister_on_unknown_agent_and_deregister_on_close(node: RunningNode) -> None:
    load = {"inflight": 7, "queued": 2}
    client = ReachClient(node.url, token=node.token("lang.translate.life"),
                         registration=registration("lang.translate.life", lease_ttl_ms=1_500), load=lambda: load)
    async with client:
        await wait_for(lambda: (r := node.node.cache.index.get("lang.translate.life")) and r.load.inflight == 7,
                       timeout_s=5, message="load from the callback")
        # the lease vanishes behind the client's back: the next heartbeat gets unknown_agent
        status, _ = await node.call("DELETE", "/v1/agents/lang.translate.life")
        assert status == 200
        await wait_for(lambda: client.heartbeat_stats.reregistered == 1, timeout_s=5, message="re-registration")
        status, record = await node.call("GET", "/v1/agents/lang.translate.life")
        assert status == 200 and record["agent_id"] == "lang.translate.life"
    status, body = await node.call("GET", "/v1/agents/lang.translate.life")
    assert status == 404 and body["error"] == "unknown_agent"


async def test_killing_one_of_two_targets_mid_run(node: RunningNode) -> None:
    first, second = await AgentServer("first").start(), await AgentServer("second").start()
    # "first" wins nearly every decision (weight 10000 : 1), so the run keeps meeting it after it dies
    await node.register(registration("lang.translate.first", endpoint=first.url + "/invoke", weight=10_000))
    await node.register(registration("lang.translate.second", endpoint=second.url + "/invoke", weight=1))
    sleep = RecordingSleep()
    client = ReachClient(node.url, token=node.token("caller.app.one", TokenRole.CALLER), sleep=sleep,
                         rng=random.Random(11), report_flush_interval_ms=50)
    results = []
    killed = asyncio.Event()

    async def worker(count: int) -> None:
        for index in range(count):
            results.append(await client.call("translate.text", {"n": index}, idempotent=True))
            if len(results) == 15 and not killed.is_set():
                killed.set()
                await first.aclose()  # dies while the other workers have calls in flight

    try:
        async with client:
            await asyncio.gather(*(worker(15) for _ in range(3)))  # 45 calls, 3 at a time
            assert len(results) == 45  # no caller-visible error
            after = results[15:]
            assert all(result.agent_id == "lang.translate.second" for result in after[3:])
            assert client.breaker_state("lang.translate.first") is BreakerState.OPEN
            failovers = [r for r in results if len(r.attempts) > 1]
            # at most breaker_failures (5) calls (+ the ones in flight at the kill) paid for a failover
            assert 5 <= len(failovers) <= 8, [[a.agent_id for a in r.attempts] for r in failovers]
            for result in failovers:  # never the same address twice within one call
                assert len({a.agent_id for a in result.attempts}) == len(result.attempts)
                assert result.attempts[0].agent_id == "lang.translate.first"
            # one backoff per failover, each exactly the formula's attempt-0 wait with the injected RNG
            replay = random.Random(11)
            assert sleep.waits == [expected_backoff(0, replay.random()) for _ in sleep.waits]
            assert len(sleep.waits) == len(failovers)
            assert all(0.4 <= wait <= 0.6 for wait in sleep.waits)
            print(f"\nkill one of two: 45 calls, {len(failovers)} failed over after one backoff each "
                  f"({', '.join(f'{w * 1000:.0f} ms' for w in sleep.waits)}), then the breaker skipped the dead agent")
            await client.flush_reports()
        # the outcomes reached the node in batches and lowered the dead agent's weight there
        reports_posts = node.node.metrics.requests("/v1/reports", "200")._value.get()
        assert client.reports_sent == sum(len(r.attempts) for r in results)
        assert 1 <= reports_posts < client.reports_sent
        assert node.node.outcomes.weight_factor("lang.translate.first", now_ms=int(time.time() * 1000)) < 1.0
    finally:
        await first.aclose()
        await second.aclose()


async def test_non_idempotent_calls_are_not_retried(node: RunningNode) -> None:
    failing, healthy = await FailingAgent("failing").start(), await AgentServer("healthy").start()
    await node.register(registration("lang.translate.failing", endpoint=failing.url + "/invoke", weight=10_000))
    await node.register(registration("lang.translate.healthy", endpoint=healthy.url + "/invoke", weight=1))
    sleep = RecordingSleep()
    try:
        async with ReachClient(node.url, token=node.admin_token, sleep=sleep, rng=random.Random(5)) as client:
            with pytest.raises(CallFailed) as caught:
                await client.call("translate.text", {"charge": 10})  # idempotent defaults to False
            assert [a.agent_id for a in caught.value.attempts] == ["lang.translate.failing"]
            assert "not marked idempotent" in caught.value.message
            assert failing.calls == 1 and healthy.calls == 0 and sleep.waits == []

            # the same call marked idempotent moves on to the other agent after one backoff
            result = await client.call("translate.text", {"charge": 10}, idempotent=True)
            assert result.agent_id == "lang.translate.healthy"
            assert failing.calls == 2 and healthy.calls == 1
            assert sleep.waits == [expected_backoff(0, random.Random(5).random())]

            # a 4xx from the target is the caller's mistake: raised, not retried even if idempotent
            await failing.aclose()
            bad = await BadRequestAgent("strict").start()
            await node.register(registration("lang.check.strict", capability="check.strict",
                                             endpoint=bad.url + "/invoke"))
            with pytest.raises(CallRejected) as rejected:
                await client.call("check.strict", {"x": 1}, idempotent=True)
            assert rejected.value.response_status == 400 and bad.calls == 1
            await bad.aclose()
    finally:
        await failing.aclose()
        await healthy.aclose()


class BadRequestAgent(AgentServer):
    async def _invoke(self, request: web.Request) -> web.Response:
        self.calls += 1
        return web.json_response({"error": "missing field"}, status=400)


async def test_resolve_caches_tickets_until_they_expire(node_factory) -> None:
    node = await node_factory(ticket_ttl_ms=1_000)
    await node.register(registration("lang.translate.cached"))
    now = [1_000.0]
    async with ReachClient(node.url, token=node.admin_token, clock=lambda: now[0]) as client:
        first = await client.resolve("translate.text")
        assert (await client.resolve("translate.text")).ticket_id == first.ticket_id
        now[0] += 0.85  # inside the ticket's life (90 % of 1 s)
        assert (await client.resolve("translate.text")).ticket_id == first.ticket_id
        now[0] += 0.1
        assert (await client.resolve("translate.text")).ticket_id != first.ticket_id
        assert (await client.resolve("translate.text", fresh=True)).ticket_id != first.ticket_id


async def test_settings_from_toml_and_keywords(tmp_path, node: RunningNode) -> None:
    token_file = tmp_path / "agent.token"
    token_file.write_text(node.token("lang.translate.toml") + "\n")
    config = tmp_path / "agent.toml"
    config.write_text(f"""
[node]
url = "{node.url}"
token_file = "agent.token"

[agent]
agent_id = "lang.translate.toml"
description = "Translates short texts between Chinese and English."
endpoints = {{ primary = "http://127.0.0.1:9/invoke" }}
lease_ttl_ms = 6000
[[agent.capabilities]]
name = "translate.text"
version = "2"

[client]
connect_timeout_ms = 1500
retry_initial_backoff_ms = 250
max_attempts = 4
""")
    client = ReachClient(config=config, read_timeout_ms=2_000)
    assert client.settings.connect_timeout_ms == 1_500 and client.settings.read_timeout_ms == 2_000
    assert client.retry_policy.initial_backoff_s == 0.25 and client.retry_policy.max_attempts == 4
    async with client:
        assert client.registered is not None and client.registered.heartbeat_interval_ms == 2_000
        status, record = await node.call("GET", "/v1/agents/lang.translate.toml")
        assert status == 200 and record["capabilities"][0]["version"] == "2"

    config.write_text(config.read_text().replace("max_attempts = 4", "max_attempts = 4\nretries = 9"))
    with pytest.raises(AgentConfigError) as caught:
        load_agent_config(config)
    assert caught.value.field == "client.retries" and "unknown key" in caught.value.message
    with pytest.raises(AgentConfigError):
        ReachClient(config=None, node_url=node.url, token="t", connect_timeout=5)


class SlowAgent(AgentServer):
    """Answers only when the test releases it."""

    release: asyncio.Event

    async def _invoke(self, request: web.Request) -> web.Response:
        self.calls += 1
        await self.release.wait()
        return web.json_response({"late": True})


async def test_connect_read_and_overall_timeouts_are_separate(node: RunningNode) -> None:
    slow = await SlowAgent("slow").start()
    slow.release = asyncio.Event()
    # A listener whose accept queue is full: the kernel drops further SYNs, so connecting hangs.
    jammed = socket.socket()
    jammed.bind(("127.0.0.1", 0))
    jammed.listen(0)
    jammed_port = jammed.getsockname()[1]
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", jammed_port))
        fillers.append(filler)
    try:
        await node.register(registration("work.slow.one", capability="work.slow", endpoint=slow.url + "/invoke"))
        await node.register(registration("work.jammed.one", capability="work.jammed",
                                         endpoint=f"http://127.0.0.1:{jammed_port}/invoke"))
        async with ReachClient(node.url, token=node.admin_token, sleep=RecordingSleep()) as client:
            started = time.perf_counter()
            with pytest.raises(CallFailed) as caught:
                await client.call("work.jammed", {}, connect_timeout_ms=200, read_timeout_ms=10_000)
            assert caught.value.attempts[0].outcome.value == "timeout"
            assert time.perf_counter() - started < 2.0  # the connect timeout, not the read one

            started = time.perf_counter()
            with pytest.raises(CallFailed) as caught:
                await client.call("work.slow", {}, connect_timeout_ms=10_000, read_timeout_ms=200)
            assert caught.value.attempts[0].outcome.value == "timeout" and slow.calls == 1
            assert time.perf_counter() - started < 2.0  # the read timeout

            started = time.perf_counter()
            with pytest.raises(CallTimeout):
                await client.call("work.slow", {}, idempotent=True, timeout_ms=300, read_timeout_ms=10_000)
            assert time.perf_counter() - started < 2.0  # the overall budget, all attempts included
    finally:
        for filler in fillers:
            filler.close()
        jammed.close()
        slow.release.set()
        await slow.aclose()


async def test_an_a2a_card_registers_heartbeats_reregisters_and_deregisters(node: RunningNode) -> None:
    from node.client import CardRegistration

    from tests.semantic.test_discovery import CARD_V03

    card = CardRegistration.model_validate({"agent_id": "finance.invoice.sdk", "card": CARD_V03,
                                            "lease_ttl_ms": 1_500})
    with pytest.raises(AgentConfigError):
        ReachClient(node.url, token="t", card=card, registration=registration("finance.invoice.sdk"))
    async with ReachClient(node.url, token=node.token("finance.invoice.sdk"), card=card) as client:
        assert client.agent_id == "finance.invoice.sdk" and client.registered is not None
        status, record = await node.call("GET", "/v1/agents/finance.invoice.sdk")
        assert status == 200 and record["transport"] == "a2a+jsonrpc"
        status, _ = await node.call("DELETE", "/v1/agents/finance.invoice.sdk")  # the lease vanishes
        assert status == 200
        await wait_for(lambda: client.heartbeat_stats.reregistered == 1, timeout_s=5, message="card re-registered")
        status, _ = await node.call("GET", "/v1/agents/finance.invoice.sdk")
        assert status == 200
    status, _ = await node.call("GET", "/v1/agents/finance.invoice.sdk")
    assert status == 404  # deregistered on close
