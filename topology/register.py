"""``agent-reach register --a2a-card FILE --agent-id ID``: register an agent from its A2A card.

Once (the lease then runs out unless something heartbeats it), or with ``--keep-alive``:
heartbeat every lease/3 until SIGINT/SIGTERM, then deregister — for an A2A agent that has no
Agent-Reach SDK or sidecar of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import aiohttp

from node.models import AGENT_ID_RE, MAX_LEASE_TTL_MS, MIN_LEASE_TTL_MS

from .runtime import run

TOKEN_ENV = "AGENT_REACH_TOKEN"
DEFAULT_NODE_URL = "http://127.0.0.1:7070"


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("register", help="register an agent from its A2A Agent Card")
    parser.add_argument("--a2a-card", required=True, metavar="FILE", help="the agent's A2A Agent Card (JSON)")
    parser.add_argument("--agent-id", required=True, help="its Agent-Reach id, namespace.group.name")
    parser.add_argument("--node", default=DEFAULT_NODE_URL, help=f"node URL (default {DEFAULT_NODE_URL})")
    parser.add_argument("--token", help=f"bearer token for that agent or admin (default ${TOKEN_ENV})")
    parser.add_argument("--lease-ttl-ms", type=int, default=30_000)
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--keep-alive", action="store_true",
                        help="keep heartbeating until SIGINT/SIGTERM, then deregister")
    parser.set_defaults(func=_run)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _run(args: argparse.Namespace) -> int:
    token = args.token or os.environ.get(TOKEN_ENV)
    if not token:
        return _fail(f"give --token or set ${TOKEN_ENV} ('agent-reach token issue --agent {args.agent_id}')")
    if not AGENT_ID_RE.match(args.agent_id):
        return _fail(f"--agent-id {args.agent_id!r} is not namespace.group.name (lower case)")
    if not MIN_LEASE_TTL_MS <= args.lease_ttl_ms <= MAX_LEASE_TTL_MS:
        return _fail(f"--lease-ttl-ms must be within {MIN_LEASE_TTL_MS}..{MAX_LEASE_TTL_MS}")
    try:
        card = json.loads(Path(args.a2a_card).read_text())
    except OSError as exc:
        return _fail(f"cannot read {args.a2a_card}: {exc.strerror}")
    except json.JSONDecodeError as exc:
        return _fail(f"{args.a2a_card} is not JSON: {exc}")
    labels = {}
    for label in args.label:
        key, sep, value = label.partition("=")
        if not sep:
            return _fail(f"--label {label!r} must be KEY=VALUE")
        labels[key] = value
    body = {"agent_id": args.agent_id, "card": card, "lease_ttl_ms": args.lease_ttl_ms, "labels": labels}
    return run(_register(args.node.rstrip("/"), token, body, keep_alive=args.keep_alive))


async def _register(node: str, token: str, body: dict[str, object], *, keep_alive: bool) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    agent_id = body["agent_id"]
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=10)) as session:
        try:
            async with session.post(f"{node}/v1/agent-cards", json=body) as response:
                answer = await response.json(content_type=None)
                if response.status not in (200, 201):
                    where = f" ({answer.get('field')})" if answer.get("field") else ""
                    return _fail(f"the node refused the card{where}: {answer.get('message', answer)}")
        except aiohttp.ClientError as exc:
            return _fail(f"cannot reach the node at {node}: {exc}")
        print(f"registered {agent_id} in region {answer['region']} (version {answer['version']})", flush=True)
        if not keep_alive:
            return 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        interval_s = answer["heartbeat_interval_ms"] / 1000
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
                break
            except TimeoutError:
                pass
            try:
                async with session.put(f"{node}/v1/agents/{agent_id}/heartbeat", json={}) as response:
                    if response.status == 404:  # the lease ran out (node restart, pause): register again
                        async with session.post(f"{node}/v1/agent-cards", json=body) as again:
                            again.raise_for_status()
            except aiohttp.ClientError as exc:
                print(f"heartbeat failed, retrying: {exc}", file=sys.stderr, flush=True)
        async with session.delete(f"{node}/v1/agents/{agent_id}") as response:
            print(f"deregistered {agent_id} ({response.status})", flush=True)
    return 0
