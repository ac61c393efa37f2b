"""The call itself, over real HTTP: never to the caller itself, fallback that can be turned off and
says what it did, typed search, and retries that reach a sole instance restarted in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from node.client import MatchKind, NoAgentAvailable, ReachClient, SearchResponse
from node.client.host import AgentHost
from node.config import NodeConfig
from node.core import Envelope
from node.core.models import Capability, TokenRole
from topology import build_node

from ..conftest import TEST_SECRET
from ..helpers import RunningNode, free_port, registration, start_node, wait_for

SUMMARIZER = "text.summarize.one"
WRITER = "report.write.weekly"


@pytest.fixture
async def lexical(redis_url: str, region: str) -> AsyncIterator[RunningNode]:
    """A node with search and the semantic fallback attached (lexical: no model to load)."""
    config = NodeConfig(region=region, redis_url=redis_url, port=0, semantic_enabled=False,
                        sweep_interval_ms=100, lease_sync_interval_ms=100, egress={"allow": ["loopback"]})
    running = await start_node(build_node(config, secret=TEST_SECRET))
    try:
        yield running
    finally:
        await running.aclose()


async def _summarize(envelope: Envelope) -> dict[str, Any]:
    return {"summary": str(envelope.payload["text"])[:12]}


async def _stages(call: Any) -> dict[str, str]:
    with pytest.raises(NoAgentAvailable) as caught:
        await call
    return caught.value.details["stages"]


async def test_the_fallback_never_sends_a_call_back_to_the_caller(lexical: RunningNode) -> None:
    node = lexical
    summarizer = {"agent_id": SUMMARIZER, "description": "Summarizes long texts into a few lines.",
                  "capabilities": [Capability(name="text.summarize", description="Summarize a text")]}
    # The writer describes what it *uses*: a self-describing agent the fallback would match.
    writer = {"agent_id": WRITER, "description": "Writes weekly reports; to summarize text it calls a summarizer "
                                                 "agent (text summarize).",
              "capabilities": [Capability(name="report.write", description="Write the weekly report")]}
    async with AgentHost(summarizer, _summarize, node_url=node.url, token=node.token(SUMMARIZER)) as first:
        async def write(envelope: Envelope) -> dict[str, Any]:
            assert writing.client is not None
            try:
                summary = await writing.client.call("text.summarize", {"text": envelope.payload["text"]},
                                                    idempotent=True)
            except NoAgentAvailable:  # nobody summarizes: the report goes out without a summary
                return {"report": envelope.payload["text"], "by": None, "match": None}
            return {"report": summary.payload["summary"], "by": summary.agent_id, "match": summary.match.kind.value}

        async with AgentHost(writer, write, node_url=node.url, token=node.token(WRITER)) as writing:
            assert writing.client is not None
            async with ReachClient(node.url, token=node.token("ops.desk.web", TokenRole.CALLER)) as caller:
                report = await caller.call("report.write", {"text": "a long week of work"}, idempotent=True)
                assert report.payload == {"report": "a long week ", "by": SUMMARIZER, "match": "exact"}
                assert (report.match.kind, report.match.capability, report.match.score) == (
                    MatchKind.EXACT, "report.write", 1.0)

                await first.aclose()  # the summarizer is gone (deregistered)
                await wait_for(lambda: node.node.cache.index.get(SUMMARIZER) is None, message="the summarizer gone")
                await node.node.searcher.settled(timeout_s=30)

                # The writer asks again: the only match is itself, so nobody, and the reason says so.
                stages = await _stages(writing.client.resolve("text.summarize", fresh=True))
                assert "caller itself" in stages["semantic"] and WRITER in stages["semantic"], stages
                stages = await _stages(writing.client.call("text.summarize", {"text": "x"}, idempotent=True))
                assert "caller itself" in stages["semantic"] and WRITER in stages["semantic"], stages
                stages = await _stages(writing.client.resolve(agent_id=WRITER))  # by name: not to itself either
                assert "caller_itself" in stages["local"] and "never goes to the calling agent" in stages["local"]

                # Another caller may be routed to the writer by the fallback, and is told so.
                found = await caller.call("text.summarize", {"text": "y"}, operation="report.write")
                assert found.payload == {"report": "y", "by": None, "match": None}
                assert found.agent_id == WRITER and found.semantic and found.match.kind is MatchKind.SEMANTIC
                assert found.match.capability in (None, "report.write") and 0 < found.match.score <= 1
                # … unless it turns the fallback off for the call,
                stages = await _stages(caller.call("text.summarize", {"text": "y"}, semantic=False))
                assert "semantic" not in stages and "no agent has capability" in stages["local"], stages
                stages = await _stages(caller.resolve("text.summarize", semantic=False))
                assert "semantic" not in stages

            # … or the writer registers as one the fallback never picks.
            await node.register({**registration(WRITER, capability="report.write",
                                                endpoint=writing.url + "/invoke"),
                                 "description": writer["description"], "semantic_fallback": False},
                                token=node.token(WRITER))
            await node.node.searcher.settled(timeout_s=30)
            status, body = await node.resolve(capability="text.summarize")
            assert status == 404 and "threshold" in body["details"]["stages"]["semantic"], body
            status, ticket = await node.resolve(capability="report.write")
            assert status == 200 and ticket["target"]["agent_id"] == WRITER  # by name it is still found


async def test_search_returns_typed_hits(lexical: RunningNode) -> None:
    node = lexical
    await node.register({**registration("lang.translate.doc", capability="translate.text"),
                         "description": "Translates contracts between Chinese and English"})
    await node.node.searcher.settled(timeout_s=30)
    async with ReachClient(node.url, token=node.token("ops.desk.web", TokenRole.CALLER)) as caller:
        found = await caller.search("translate a Chinese contract into English", k=3)
        assert isinstance(found, SearchResponse) and found.mode == "lexical" and found.scope.value == "global"
        best = found.hits[0]
        assert best.agent_id == "lang.translate.doc" and best.region == node.node.region and best.score > 0
        local = await caller.search("translate a Chinese contract", scope="local", routable=True)
        assert local.scope.value == "local" and [hit.agent_id for hit in local.hits] == ["lang.translate.doc"]


# -- a sole instance that dies and comes back -------------------------------------------------

AGENT = "demo.translate.phrasebook"


async def _start_agent(node: RunningNode, port: int) -> asyncio.subprocess.Process:
    """The demo translator as its own process on ``port``, registered (prints READY). Without a
    session, so a SIGKILL leaves its lease naming the dead address, as an agent that cannot hold
    one (any HTTP-only agent) does; with a session the node stops routing to it at once
    (tests/client/test_sessions.py)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "topology.demo.translator", "--node", node.url, "--port", str(port), "--no-session",
        env={**os.environ, "AGENT_REACH_TOKEN": node.token(AGENT)}, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    assert process.stdout is not None
    seen = []
    deadline = time.monotonic() + 60
    while True:
        line = await asyncio.wait_for(process.stdout.readline(), max(0.1, deadline - time.monotonic()))
        seen.append(line.decode(errors="replace"))
        if not line:
            raise AssertionError(f"the agent exited while starting: {''.join(seen)}")
        if line.startswith(b"READY "):
            return process


async def _stop(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), 10)
    except TimeoutError:
        process.kill()
        await process.wait()


@pytest.mark.timeout(120)
async def test_an_idempotent_call_reaches_its_sole_instance_restarted_within_the_deadline(node: RunningNode) -> None:
    port = free_port()
    first = await _start_agent(node, port)
    processes = [first]
    first.kill()  # SIGKILL: no deregistration, the lease still names the dead address
    await first.wait()
    waits: list[float] = []

    async def restart_during_the_backoff(seconds: float) -> None:
        # The instance comes back on the same port while the call waits before its next attempt.
        waits.append(seconds)
        if len(waits) == 1:
            processes.append(await _start_agent(node, port))
        await asyncio.sleep(seconds)

    try:
        async with ReachClient(node.url, token=node.token("ops.desk.web", TokenRole.CALLER),
                               sleep=restart_during_the_backoff) as caller:
            result = await caller.call("translate.text", {"text": "谢谢", "target_lang": "fr"}, idempotent=True)
            assert result.payload["text"] == "merci"
            assert [(a.agent_id, a.outcome.value) for a in result.attempts] == [(AGENT, "failure"), (AGENT, "success")]
            assert "ClientConnectorError" in (result.attempts[0].error or "") and len(waits) == 1

            # Not idempotent: one attempt, as ever (a call that failed may have run).
            processes[-1].kill()
            await processes[-1].wait()
            with pytest.raises(Exception) as caught:
                await caller.call("translate.text", {"text": "谢谢"})
            assert "not marked idempotent" in str(caught.value) and len(waits) == 1
    finally:
        for process in processes:
            if process.returncode is None:
                await _stop(process)
