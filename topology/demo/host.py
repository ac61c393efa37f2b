"""A small host for SDK agents: an HTTP server speaking envelopes, registered with ``ReachClient``.

What an agent written this way gets:

* ``POST /invoke`` takes an :class:`~node.envelope.Envelope`, refuses it once expired (410),
  answers a repeated envelope id from a local cache instead of running the handler again (the
  receiving half of idempotency), and answers ``envelope.reply(result)``;
* ``GET /healthz`` and ``GET /readyz`` (the latter with the current load);
* registration, heartbeats carrying ``inflight`` (on their own thread), and deregistration on exit.

``main()`` is the command line every demo agent shares: ``--node URL`` plus the token in
``$AGENT_REACH_TOKEN``; it prints ``READY <agent_id> <url>`` once registered and runs until
SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from node.client import Capability, Envelope, Load, ReachClient, Registration

Handler = Callable[[Envelope], Awaitable[Any]]
ANSWER_CACHE_SIZE = 1_000
DEFAULT_LEASE_TTL_MS = 15_000


class AgentHost:
    """Serves one agent's handler over HTTP and keeps it registered; an async context manager."""

    def __init__(self, *, agent_id: str, display_name: str, description: str, capabilities: list[Capability],
                 handler: Handler, node_url: str, token: str, host: str = "127.0.0.1", port: int = 0,
                 labels: dict[str, str] | None = None, lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS) -> None:
        self.agent_id = agent_id
        self.display_name = display_name
        self.description = description
        self.capabilities = capabilities
        self.handler = handler
        self.node_url = node_url
        self.token = token
        self.host = host
        self.port = port
        self.labels = labels or {}
        self.lease_ttl_ms = lease_ttl_ms
        self.inflight = 0
        self.handled = 0
        self.url = ""
        self.client: ReachClient | None = None
        self._answers: OrderedDict[str, bytes] = OrderedDict()
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> AgentHost:
        app = web.Application()
        app.router.add_post("/invoke", self._invoke)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.url = f"http://{self.host}:{bound_port(self._runner)}"
        registration = Registration(
            agent_id=self.agent_id, display_name=self.display_name, description=self.description,
            capabilities=self.capabilities, endpoints={"primary": f"{self.url}/invoke"}, labels=self.labels,
            lease_ttl_ms=self.lease_ttl_ms)
        self.client = ReachClient(self.node_url, token=self.token, registration=registration,
                                  load=lambda: Load(inflight=self.inflight))
        try:
            await self.client.start()
        except BaseException:
            await self._runner.cleanup()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self.client is not None:
            await self.client.aclose()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _invoke(self, request: web.Request) -> web.Response:
        try:
            envelope = Envelope.model_validate_json(await request.read())
        except ValidationError as exc:
            return web.json_response({"error": "invalid_envelope", "message": str(exc.errors()[0]["msg"])}, status=400)
        if envelope.expired():
            return web.json_response({"error": "envelope_expired", "message": "nobody may act on it"}, status=410)
        cached = self._answers.get(envelope.id)
        if cached is not None:  # the same message again (a retry): same answer, no second execution
            return web.Response(body=cached, content_type="application/json")
        self.inflight += 1
        try:
            result = await self.handler(envelope)
        finally:
            self.inflight -= 1
        self.handled += 1
        body = envelope.reply(result).to_json()
        self._answers[envelope.id] = body
        if len(self._answers) > ANSWER_CACHE_SIZE:
            self._answers.popitem(last=False)
        return web.Response(body=body, content_type="application/json")

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "agent_id": self.agent_id})

    async def _readyz(self, request: web.Request) -> web.Response:
        return web.json_response({"ready": True, "inflight": self.inflight})


def bound_port(runner: web.AppRunner) -> int:
    """The TCP port a runner listens on (with port 0, the one the kernel chose)."""
    for address in runner.addresses:
        if isinstance(address, tuple):
            return address[1]
    raise RuntimeError("the runner has no listening TCP site")


def main(argv: Sequence[str] | None, *, agent_id: str, display_name: str, description: str,
         capabilities: list[Capability], handler: Handler) -> int:
    """The command line of a demo agent (``python -m topology.demo.<name> --node URL``)."""
    parser = argparse.ArgumentParser(description=f"{display_name}: {description}")
    parser.add_argument("--node", required=True, help="the region's node URL, e.g. http://127.0.0.1:7101")
    parser.add_argument("--agent-id", default=agent_id, help=f"default {agent_id}")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port")
    args = parser.parse_args(argv)
    token = os.environ.get("AGENT_REACH_TOKEN", "").strip()
    if not token:
        print("error: set AGENT_REACH_TOKEN ('agent-reach token issue --agent AGENT_ID' prints one)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        async with AgentHost(agent_id=args.agent_id, display_name=display_name, description=description,
                             capabilities=capabilities, handler=handler, node_url=args.node, token=token,
                             host=args.host, port=args.port) as host:
            region = host.client.registered.region if host.client and host.client.registered else "?"
            print(f"READY {host.agent_id} {host.url} {region}", flush=True)
            await stop.wait()

    asyncio.run(run())
    return 0
