"""The ``agent-reach up --demo`` driver: demo agents in different regions, then a local and a cross-region call.

:func:`start_demo` starts the translator in the first region, the OCR agent in the second and
the image-search agent in the third (wrapping around with fewer regions), each as its own
process registered with its region's node. Then, as a caller in the first region, it calls
``translate.text`` (answered locally) and ``ocr.image`` (answered by the second region, found
through federation), and tries a plain-language request that only semantic discovery can route.
Each step prints one line. ``await demo.aclose()`` stops the agents, which deregister.

Standalone: ``python -m topology.demo --region us-east=http://127.0.0.1:7101 --region
us-west=http://127.0.0.1:7102`` (:func:`main`) with an admin token in ``$AGENT_REACH_TOKEN``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from node.client import NodeError, ReachClient

__all__ = ["DEFAULT_FEDERATION_TIMEOUT_S", "DEFAULT_START_TIMEOUT_S", "STOP_TIMEOUT_S", "Demo", "DemoAgent",
           "DemoError", "main", "start_demo"]

# Each runs as ``python -m <module>``: installed with the package, so from any working directory.
TRANSLATOR_MODULE = "topology.demo.translator"
OCR_MODULE = "topology.demo.ocr"
IMAGE_SEARCH_MODULE = "topology.demo.image_search"
AGENT_MODULES = (TRANSLATOR_MODULE, OCR_MODULE, IMAGE_SEARCH_MODULE)
DEFAULT_START_TIMEOUT_S = 30.0
DEFAULT_FEDERATION_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class DemoError(RuntimeError):
    """A demo agent did not start, or the demo calls failed; the message says which and why."""


@dataclass(slots=True)
class DemoAgent:
    module: str
    region: str
    node_url: str
    process: asyncio.subprocess.Process
    agent_id: str = ""
    url: str = ""
    drain: asyncio.Task[None] | None = None


@dataclass(slots=True)
class Demo:
    """The running demo agents and what the demo printed."""

    agents: list[DemoAgent]
    lines: list[str] = field(default_factory=list)

    async def aclose(self, *, stop_timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop every agent (SIGTERM: they deregister), killing any still running after
        ``stop_timeout_s`` (in all). Idempotent."""
        for agent in self.agents:
            if agent.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    agent.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + stop_timeout_s
        for agent in self.agents:
            try:
                await asyncio.wait_for(agent.process.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    agent.process.kill()
                await agent.process.wait()
            if agent.drain is not None:
                agent.drain.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await agent.drain


async def start_demo(region_urls: dict[str, str], admin_token: str, *, say: Callable[[str], None] = print,
                     start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                     federation_timeout_s: float = DEFAULT_FEDERATION_TIMEOUT_S,
                     stop_timeout_s: float = STOP_TIMEOUT_S) -> Demo:
    """Start the demo agents across ``region_urls`` (ordered: the first is the caller's region).

    Prints (through ``say``) where each agent runs, then a local and a cross-region call.
    Raises :class:`DemoError` when an agent does not start. When it raises or is cancelled,
    the agents already started are stopped first (within ``stop_timeout_s``).
    """
    if not region_urls:
        raise DemoError("the demo needs at least one region")
    regions = list(region_urls)
    demo = Demo(agents=[])
    try:
        for index, module in enumerate(AGENT_MODULES):
            region = regions[index % len(regions)]
            demo.agents.append(await _spawn(module, region, region_urls[region], admin_token))
        await asyncio.gather(*(_wait_ready(agent, start_timeout_s) for agent in demo.agents))

        def emit(line: str) -> None:
            demo.lines.append(line)
            say(line)

        for agent in demo.agents:
            emit(f"demo: {agent.agent_id} runs in region {agent.region} at {agent.url}")
        await _calls(demo, regions[0], region_urls[regions[0]], admin_token, emit, federation_timeout_s)
    except BaseException:  # cancelled (Ctrl-C) or failed: no agent may outlive the demo
        await demo.aclose(stop_timeout_s=stop_timeout_s)
        raise
    return demo


async def _spawn(module: str, region: str, node_url: str, token: str) -> DemoAgent:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, "--node", node_url,
        env={**os.environ, "AGENT_REACH_TOKEN": token}, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True)  # the terminal's Ctrl-C reaches the launcher, which stops us in order
    return DemoAgent(module=module, region=region, node_url=node_url, process=process)


async def _wait_ready(agent: DemoAgent, timeout_s: float) -> None:
    stream = agent.process.stdout
    if stream is None:
        raise DemoError(f"{agent.module} has no output to read")
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        try:
            line = await asyncio.wait_for(stream.readline(), max(0.01, remaining))
        except TimeoutError:
            raise DemoError(f"{agent.module} did not register with {agent.node_url} within {timeout_s:.0f}s; "
                            f"its output:\n{''.join(seen)}") from None
        if not line:
            raise DemoError(f"{agent.module} exited while starting; its output:\n{''.join(seen)}")
        text = line.decode(errors="replace")
        seen.append(text)
        if text.startswith("READY "):
            _, agent.agent_id, agent.url, *_ = text.split()
            # keep draining its output so a chatty agent never blocks on a full pipe
            agent.drain = asyncio.get_running_loop().create_task(_drain(stream))
            return


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def _calls(demo: Demo, region: str, node_url: str, token: str, emit: Callable[[str], None],
                 federation_timeout_s: float) -> None:
    async with ReachClient(node_url, token=token) as caller:
        local = await caller.call("translate.text", {"text": "退款说明", "target_lang": "en"}, idempotent=True)
        ticket = await caller.resolve("translate.text")
        emit(f"demo: local call from {region}: translate.text -> {local.agent_id} in region {local.region} "
             f"({ticket.locality.value}): {local.payload}")

        remote_agent = next((a for a in demo.agents if a.module == OCR_MODULE), None)
        if remote_agent is None or remote_agent.region == region:
            emit("demo: cross-region call skipped: the topology has one region")
            return
        deadline = time.monotonic() + federation_timeout_s
        while True:  # the registration reaches this region through Kafka; wait for it, with a deadline
            problem = ""
            try:
                ticket = await caller.resolve("ocr.image", fresh=True)
                if ticket.target.agent_id == remote_agent.agent_id:
                    break
                problem = f"routed to {ticket.target.agent_id} ({ticket.match.kind.value}) before the OCR agent arrived"
            except NodeError as exc:
                problem = exc.message
            if time.monotonic() > deadline:
                emit(f"demo: cross-region call failed: {problem} (is federation running?)")
                return
            await asyncio.sleep(0.1)
        remote = await caller.call("ocr.image", {"image": "invoice.pdf"}, idempotent=True)
        emit(f"demo: cross-region call from {region}: ocr.image -> {remote.agent_id} in region {remote.region} "
             f"({ticket.locality.value}): {remote.payload}")

        # The image agent lives in a third region: retry until federation and indexing bring it.
        deadline = time.monotonic() + DEFAULT_FEDERATION_TIMEOUT_S
        while True:
            try:
                found = await caller.call("find pictures of a cat on a sofa", {"query": "cat on a sofa"},
                                          operation="image:search", idempotent=True)
                emit(f"demo: semantic call from {region}: 'find pictures of a cat on a sofa' -> {found.agent_id} "
                     f"in region {found.region}: {found.payload}")
                return
            except NodeError as exc:
                if time.monotonic() > deadline:
                    emit(f"demo: semantic call not routed ({exc.code}): {exc.message}")
                    return
            await asyncio.sleep(0.2)


def _parse_region(text: str) -> tuple[str, str]:
    name, sep, url = text.partition("=")
    if not sep or not name or not url:
        raise argparse.ArgumentTypeError("use NAME=URL, e.g. us-east=http://127.0.0.1:7101")
    return name, url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Start the demo agents across regions and show calls.")
    parser.add_argument("--region", type=_parse_region, action="append", required=True,
                        help="NAME=URL of a region's node; the first is the caller's region (repeatable)")
    args = parser.parse_args(argv)
    token = os.environ.get("AGENT_REACH_TOKEN", "").strip()
    if not token:
        print("error: set AGENT_REACH_TOKEN to an admin token ('agent-reach token issue --admin')", file=sys.stderr)
        return 2

    async def run() -> None:
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        demo = await start_demo(dict(args.region), token)
        try:
            print("demo: Ctrl-C stops the demo agents", flush=True)
            await stop.wait()
        finally:
            await demo.aclose()

    asyncio.run(run())
    return 0

