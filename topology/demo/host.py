"""The command line every demo agent shares, around the SDK's agent host (:class:`node.client.host.AgentHost`).

What a demo agent gets from the host: ``POST /invoke`` taking an envelope after verifying the
caller's route credential, expired envelopes refused (410), a repeated envelope id answered from
a cache, ``GET /healthz`` and ``/readyz``, registration, heartbeats carrying ``inflight`` and
deregistration on exit.

``main()``: ``--node URL`` plus the token in ``$AGENT_REACH_TOKEN``; it prints ``READY <agent_id>
<url> <region>`` once registered and runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from node.client import Capability
from node.client.host import AgentHost, Handler

__all__ = ["DEFAULT_LEASE_TTL_MS", "AgentHost", "main"]

DEFAULT_LEASE_TTL_MS = 15_000


def main(argv: Sequence[str] | None, *, agent_id: str, display_name: str, description: str,
         capabilities: list[Capability], handler: Handler) -> int:
    """The command line of a demo agent (``python -m topology.demo.<name> --node URL``)."""
    parser = argparse.ArgumentParser(description=f"{display_name}: {description}")
    parser.add_argument("--node", required=True, help="the region's node URL, e.g. http://127.0.0.1:7101")
    parser.add_argument("--agent-id", default=agent_id, help=f"default {agent_id}")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port")
    parser.add_argument("--no-session", dest="session", action="store_false",
                        help="renew the lease over HTTP only: the node then hears of a killed process only when "
                             "its lease lapses, not when its session drops")
    args = parser.parse_args(argv)
    token = os.environ.get("AGENT_REACH_TOKEN", "").strip()
    if not token:
        print("error: set AGENT_REACH_TOKEN ('agent-reach token issue --agent AGENT_ID' prints one)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    registration = {"agent_id": args.agent_id, "display_name": display_name, "description": description,
                    "capabilities": capabilities, "lease_ttl_ms": DEFAULT_LEASE_TTL_MS}

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        async with AgentHost(registration, handler, node_url=args.node, token=token, host=args.host,
                             port=args.port, session=args.session) as host:
            region = host.client.registered.region if host.client and host.client.registered else "?"
            print(f"READY {host.agent_id} {host.url} {region}", flush=True)
            await stop.wait()

    asyncio.run(run())
    return 0
