"""Sessions: the SDK renews leases over one WebSocket per process, and the node hears it end.

Real sockets throughout: a node on 127.0.0.1, SDK agents in this process (their sessions on a
thread of their own) or in a subprocess killed with SIGKILL, and a TCP proxy the test controls
to cut a session the way a network does.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import time

import aiohttp
import pytest

from node.client import ReachClient
from node.client._session import NodeSession, SessionState
from node.config import NodeConfig
from node.core.models import TokenRole
from node.http import bound_port, serve
from node.service import RegistryNode

from ..conftest import TEST_SECRET
from ..helpers import RunningNode, both_workers_answer, free_port, registration, start_workers, terminate, wait_for

# An SDK agent in a process of its own: registers with its lease, says so, then holds its session.
AGENT_PROCESS = """
import asyncio, json, sys
from node.client import ReachClient

async def main():
    url, token, body = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    async with ReachClient(url, token=token, registration=body) as client:
        print("registered", client.registered.version, flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


def metric(text: str, name: str) -> float:
    """The sum of a counter's samples (every label) in a /metrics page."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + "{", name + " ")))


async def metrics_page(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        return await response.text()


async def routable(url: str, token: str, capability: str) -> bool:
    """Whether the node resolves ``capability`` now (a fresh connection: any worker may answer)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        async with http.post(f"{url}/v1/resolve", json={"capability": capability, "semantic": False},
                             headers={"Authorization": f"Bearer {token}"}) as response:
            await response.read()
            return response.status == 200


async def agent_status(url: str, token: str, agent_id: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/agents/{agent_id}",
                                                         headers={"Authorization": f"Bearer {token}"}) as response:
        await response.read()
        return response.status


class AgentProcess:
    """An SDK agent in a subprocess; ``kill()`` is SIGKILL: nothing of it says goodbye."""

    def __init__(self, url: str, token: str, body: dict[str, object]) -> None:
        import json
        self.process = subprocess.Popen([sys.executable, "-c", AGENT_PROCESS, url, token, json.dumps(body)],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    async def registered(self) -> str:
        line = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline), 60)  # type: ignore[union-attr]
        if not line.startswith("registered"):
            self.process.kill()
            raise AssertionError(f"the agent process did not register: {line!r} {self.process.stderr.read()!r}")
        return line

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


class TcpProxy:
    """127.0.0.1 relay to a node that the test can cut (every connection aborted, new ones refused)
    and restore, as a network partition would."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.refusing = False
        self.links: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def cut(self) -> None:
        self.refusing = True
        for writer in list(self.links):
            writer.transport.abort()
        self.links.clear()

    def restore(self) -> None:
        self.refusing = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.links.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65_536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self.links.discard(writer)
            writer.transport.abort()

    async def aclose(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def lease_agent(agent_id: str, capability: str, lease_ttl_ms: int) -> dict[str, object]:
    return registration(agent_id, capability=capability, lease_ttl_ms=lease_ttl_ms)


async def test_an_agent_on_its_session_sends_no_http_heartbeat_and_a_kill_is_seen_at_once(node: RunningNode) -> None:
    """Acceptance: 3 s lease, 10 s held on the session: no HTTP heartbeat, routable throughout;
    kill -9 of its process: not routable within 3 s, by suspicion (the lease still runs); then the
    lease lapses as before."""
    agent_id, capability = "sess.kill.a1", "sess.kill"
    agent = AgentProcess(node.url, node.token(agent_id), lease_agent(agent_id, capability, 3_000))
    try:
        await agent.registered()
        page = await wait_for(lambda: _with(node.url, lambda p: metric(p, "agent_reach_session_renewals_total") >= 1),
                              timeout_s=20, message="a renewal over the session")
        heartbeats_before = metric(page, "agent_reach_heartbeats_total")
        renewals_before = metric(page, "agent_reach_session_renewals_total")
        held_until = time.monotonic() + 10
        checks = 0
        while time.monotonic() < held_until:
            assert await routable(node.url, node.admin_token, capability), "the agent stopped being routable"
            checks += 1
            await asyncio.sleep(0.25)
        page = await metrics_page(node.url)
        assert metric(page, "agent_reach_heartbeats_total") == heartbeats_before == 0
        assert metric(page, "agent_reach_session_renewals_total") >= renewals_before + 5  # ~1 a second (3 s / 3)
        assert checks >= 10

        agent.kill()
        killed_at = time.monotonic()
        await wait_for(lambda: _not(routable(node.url, node.admin_token, capability)), timeout_s=10, interval_s=0.01,
                       message="the killed agent to stop being routable")
        unroutable_s = time.monotonic() - killed_at
        record = node.node.cache.index.get(agent_id)
        # Unroutable because its session ended, not because its lease ran out.
        assert agent_id in node.node.cache.index.suspects
        assert record is not None and record.lease_expires_at_ms > time.time() * 1000
        print(f"unroutable after kill -9: {unroutable_s:.3f}s")
        assert unroutable_s < 3.0, f"not routable only after {unroutable_s:.2f}s"
        assert metric(await metrics_page(node.url), "agent_reach_session_suspects_total") == 1

        # Nothing comes back: the lease lapses and the record goes, as without sessions.
        await wait_for(lambda: _is(agent_status(node.url, node.admin_token, agent_id), 404), timeout_s=15,
                       message="the lease to lapse")
        assert agent_id not in node.node.cache.index.suspects
        store = node.node.store  # the deletion took the session marks with it
        assert await store.redis.hlen(store.key_suspects) == await store.redis.hlen(store.key_holders) == 0
    finally:
        agent.close()


async def _with(url: str, accept) -> str | None:  # type: ignore[no-untyped-def]
    page = await metrics_page(url)
    return page if accept(page) else None


async def _not(awaitable) -> bool:  # type: ignore[no-untyped-def]
    return not await awaitable


async def _is(awaitable, expected: object) -> bool:  # type: ignore[no-untyped-def]
    return await awaitable == expected


async def test_a_session_cut_by_the_network_and_restored_within_the_lease_needs_no_registration(
        node: RunningNode) -> None:
    agent_id, capability = "sess.cut.a1", "sess.cut"
    proxy = TcpProxy(int(node.url.rsplit(":", 1)[1]))
    proxy_url = await proxy.start()
    try:
        async with ReachClient(proxy_url, token=node.token(agent_id),
                               registration=lease_agent(agent_id, capability, 6_000)) as client:
            version = client.registered.version
            await wait_for(lambda: client.heartbeat_stats.over_session >= 1, message="a renewal over the session")
            registrations = metric(await metrics_page(node.url), "agent_reach_registrations_total")

            proxy.cut()
            await wait_for(lambda: agent_id in node.node.cache.index.suspects, timeout_s=5,
                           message="the node to see the session end")
            assert not await routable(node.url, node.admin_token, capability)
            proxy.restore()
            await wait_for(lambda: routable(node.url, node.admin_token, capability), timeout_s=5,
                           message="the agent to be routable again")
            session = client._node_session
            assert session is not None
            await wait_for(lambda: session.connects >= 2, timeout_s=10, message="the session to reconnect")

            record = node.node.cache.index.get(agent_id)
            assert record is not None and record.version == version  # no version bump
            assert client.heartbeat_stats.reregistered == 0
            assert metric(await metrics_page(node.url), "agent_reach_registrations_total") == registrations
            renewed = client.heartbeat_stats.over_session
            await wait_for(lambda: client.heartbeat_stats.over_session > renewed, timeout_s=10,
                           message="renewals over the restored session")
            assert agent_id not in node.node.cache.index.suspects
    finally:
        await proxy.aclose()


async def test_sessions_reconnect_to_a_restarted_node_spread_out(redis_url: str, region: str) -> None:
    """A node restart: every session's wait is jittered and doubling (no storm), and each comes
    back; its agents stay registered and routable without registering again."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = NodeConfig(region=region, redis_url=redis_url, port=port, sweep_interval_ms=100,
                        lease_sync_interval_ms=100, leader_ttl_ms=1_000, egress={"allow": ["loopback"]})

    async def start() -> RunningNode:
        node = RegistryNode(config, secret=TEST_SECRET)
        await node.start()
        runner = await serve(node, host="127.0.0.1", port=port)
        assert bound_port(runner) == port
        return RunningNode(node=node, runner=runner, url=url,
                           admin_token=node.signer.issue("admin", TokenRole.ADMIN, ttl_s=3600))

    running = await start()
    count = 12
    sessions = [NodeSession(url, token=running.admin_token) for _ in range(count)]
    try:
        for index, session in enumerate(sessions):
            agent_id = f"sess.restart.a{index}"
            await running.register(lease_agent(agent_id, "sess.restart", 30_000))
            session._start()
            session.join(agent_id, running.token(agent_id))
        for index, session in enumerate(sessions):
            await wait_for(lambda s=session, i=index: s.joined(f"sess.restart.a{i}"), message="every agent joined")

        await running.aclose()
        stopped_at = time.monotonic()
        await wait_for(lambda: all(s.state is not SessionState.OPEN for s in sessions), message="the sessions to end")
        await wait_for(lambda: all(s.attempts >= 4 for s in sessions), timeout_s=20,
                       message="each session to try a few times")
        down_s = time.monotonic() - stopped_at
        attempts = [s.attempts for s in sessions]
        # Waits of at least 100 ms doubling: n tries take 0.1 × (2^n − 1) s, so a few, not hundreds.
        assert max(attempts) <= 2 + math.log2(down_s / 0.1 + 1), (attempts, down_s)
        running = await start()
        restarted_at = time.monotonic()
        await wait_for(lambda: all(s.state is SessionState.OPEN for s in sessions), timeout_s=20,
                       message="every session back")
        for index, session in enumerate(sessions):
            await wait_for(lambda s=session, i=index: s.joined(f"sess.restart.a{i}"), message="every agent joined again")
        opened = sorted(s.opened_at - restarted_at for s in sessions)
        print("attempts", attempts, f"down {down_s:.2f}s", "reopened", [round(o, 3) for o in opened])
        # Jittered: the returns are spread over the waits, not one burst at the same instant.
        assert opened[-1] - opened[0] > 0.05, opened
        assert await routable(url, running.admin_token, "sess.restart")
        assert metric(await metrics_page(url), "agent_reach_registrations_total") == 0
    finally:
        for session in sessions:
            await asyncio.to_thread(session._close)
        with contextlib.suppress(Exception):
            await running.aclose()


@pytest.mark.unit
def test_the_reconnect_wait_doubles_from_100_ms_to_5_s_with_jitter() -> None:
    import random

    session = NodeSession("http://127.0.0.1:9", token="t", rng=random.Random(7))
    waits = [session._backoff_s(failures) for failures in range(10)]
    for failures, wait_s in enumerate(waits):
        ceiling = min(5.0, 0.1 * 2 ** failures)
        assert ceiling / 2 <= wait_s <= ceiling
    assert len({round(w, 6) for w in waits[-3:]}) == 3  # at the cap, still spread


async def test_a_gone_target_stops_being_handed_out_at_once_while_tickets_are_kept_long(node_factory) -> None:
    """Item 3: a caller keeps its tickets for 60 s while its session is open; the node pushes gone
    when a target is deregistered, drained, suspect or ejected, and the SDK hands it out no more.
    A caller resolving one capability 5,000 times still costs the node one resolve."""
    from node.core import NoAgentAvailable
    from node.http.sessions import SESSIONS_KEY

    node = await node_factory(ticket_ttl_ms=120_000)
    hub = node.runner.app[SESSIONS_KEY]
    proxy = TcpProxy(int(node.url.rsplit(":", 1)[1]))
    proxy_url = await proxy.start()
    for agent_id in ("push.dereg.a1", "push.drain.a1", "push.eject.a1", "push.eject.b1", "push.eject.c1"):
        await node.register(lease_agent(agent_id, agent_id.rsplit(".", 1)[0], 60_000))  # the router ejects 1 of 3
    suspect = ReachClient(proxy_url, token=node.token("push.suspect.a1"),
                          registration=lease_agent("push.suspect.a1", "push.suspect", 60_000))
    try:
        await suspect.start()
        async with ReachClient(node.url, token=node.admin_token, session_ticket_reuse_ms=60_000) as caller:
            session = caller._node_session
            assert session is not None
            await wait_for(lambda: session.pushing, message="the caller's session")

            resolves_before = metric(await metrics_page(node.url), "agent_reach_resolves_total")
            first = await caller.resolve("push.dereg")
            for _ in range(4_999):
                assert (await caller.resolve("push.dereg")).ticket_id == first.ticket_id
            assert metric(await metrics_page(node.url), "agent_reach_resolves_total") == resolves_before + 1

            async def deregister() -> None:
                assert (await node.call("DELETE", "/v1/agents/push.dereg.a1"))[0] == 200

            async def drain() -> None:
                status, body = await node.call("PUT", "/v1/agents/push.drain.a1/heartbeat",
                                               json={"status": "draining"}, token=node.token("push.drain.a1"))
                assert status == 200, body

            async def cut() -> None:
                proxy.cut()

            async def eject() -> None:  # an admin's failure reports are evidence enough to open the breaker
                ticket = await caller.resolve("push.eject")
                reports = [{"signature": ticket.signature, "agent_id": "push.eject.a1", "outcome": "failure"}] * 12
                assert (await node.call("POST", "/v1/reports", json={"reports": reports}))[0] in (200, 202)

            handed_for: dict[str, float] = {}
            for case, make_it_go in (("dereg", deregister), ("drain", drain), ("suspect", cut), ("eject", eject)):
                target, capability = f"push.{case}.a1", f"push.{case}"
                ticket = await caller.resolve(capability)
                assert target in names(ticket)
                await wait_for(lambda t=target: t in hub.watchers, message=f"the node to hear the watch of {target}")
                assert (await caller.resolve(capability)).ticket_id == ticket.ticket_id  # kept, not asked again

                async def still_handed_out(capability: str = capability, target: str = target) -> bool:
                    try:
                        return target in names(await caller.resolve(capability))
                    except NoAgentAvailable:
                        return False

                gone_at = time.monotonic()
                await make_it_go()
                await wait_for(lambda s=still_handed_out: _not(s()), timeout_s=10, interval_s=0.005,
                               message=f"{target} to stop being handed out")
                handed_for[case] = time.monotonic() - gone_at
            print("handed out after it went (s):", {case: round(s, 3) for case, s in handed_for.items()})
            # Without the push the cached ticket would be handed out for its 60 s of reuse.
            assert max(handed_for.values()) < 2.0, handed_for
            assert session.pushes >= 4
    finally:
        await suspect.aclose()
        await proxy.aclose()


def names(ticket) -> set[str]:  # type: ignore[no-untyped-def]
    """Every agent a ticket hands out: its target and alternates (a call is drawn among them)."""
    return {ticket.target.agent_id, *(alternate.agent_id for alternate in ticket.alternates)}


async def test_under_two_workers_a_session_on_one_keeps_the_regions_lease(redis_url: str, region: str) -> None:
    """--workers 2: the agent's session lands on one worker; through either the agent stays
    routable past its lease, and a kill -9 makes it unroutable through both at once."""
    from node.trust import Signer

    secret = "sessions-workers-secret-0123456789abcdef"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    parent = start_workers(redis_url, region, port, "--egress-allow", "loopback", secret=secret)
    signer = Signer(secret.encode())
    admin = signer.issue("admin", TokenRole.ADMIN, ttl_s=600)
    agent_id, capability = "sess.workers.a1", "sess.workers"
    agent: AgentProcess | None = None
    try:
        await wait_for(lambda: both_workers_answer(url), timeout_s=60, message="both workers")
        agent = AgentProcess(url, signer.issue(agent_id, TokenRole.AGENT, ttl_s=600),
                             lease_agent(agent_id, capability, 3_000))
        await agent.registered()

        async def through_every_worker(expected: bool) -> bool:
            return all([await routable(url, admin, capability) == expected for _ in range(8)])

        held_until = time.monotonic() + 8  # more than two leases
        while time.monotonic() < held_until:
            assert await through_every_worker(True), "a worker stopped routing to the agent"
            await asyncio.sleep(0.25)
        agent.kill()
        killed_at = time.monotonic()
        await wait_for(lambda: through_every_worker(False), timeout_s=10, interval_s=0.01,
                       message="both workers to stop routing to the killed agent")
        unroutable_s = time.monotonic() - killed_at
        async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/agents/{agent_id}",
                                                             headers={"Authorization": f"Bearer {admin}"}) as response:
            body = await response.json()
        assert response.status == 200 and body["lease_expires_at_ms"] > time.time() * 1000, body  # still leased
        print(f"unroutable through both workers after kill -9: {unroutable_s:.3f}s")
        assert unroutable_s < 3.0
    finally:
        if agent is not None:
            agent.close()
        terminate(parent)
        if parent.stderr is not None:
            parent.stderr.close()


@pytest.mark.unit
def test_renewals_due_within_one_interval_meet_on_the_sessions_beat() -> None:
    session = NodeSession("http://127.0.0.1:9", token="t")
    session.phase = 0.25  # this process renews at .25 of every interval
    for due in (100.3, 100.9, 101.1, 101.2499):
        assert session.aligned(due, 1.0) == pytest.approx(100.25)  # never later than due, never an interval early
    assert session.aligned(101.25, 1.0) == pytest.approx(101.25)
    assert session.aligned(107.0, 4.0) == pytest.approx(105.0)


async def test_the_agents_of_one_process_renew_together_in_one_frame(node: RunningNode) -> None:
    clients = [ReachClient(node.url, token=node.token(f"sess.batch.a{i}"),
                           registration=lease_agent(f"sess.batch.a{i}", "sess.batch", 3_000)) for i in range(6)]
    try:
        for client in clients:
            await client.start()
        session = clients[0]._node_session
        assert session is not None and all(client._node_session is session for client in clients)
        start_renewals, start_frames = session.renewals, session.renew_frames
        await wait_for(lambda: session.renewals - start_renewals >= 30, timeout_s=30, message="30 renewals")
        renewals, frames = session.renewals - start_renewals, session.renew_frames - start_frames
        print(f"{renewals} renewals in {frames} frames")
        assert frames <= renewals / 3, (renewals, frames)  # six agents: about one frame a beat
        assert all(client.heartbeat_stats.sent == client.heartbeat_stats.over_session for client in clients)
        assert metric(await metrics_page(node.url), "agent_reach_heartbeats_total") == 0
    finally:
        for client in clients:
            await client.aclose()
