"""``agent-reach register --a2a-card FILE --agent-id ID``: register an agent from its A2A card.

Once (the lease then runs out unless something heartbeats it), or with ``--keep-alive``:
heartbeat every lease/3 until SIGINT/SIGTERM, then deregister — for an A2A agent that has no
Agent-Reach SDK or sidecar of its own. Both go through the SDK (:class:`node.client.ReachClient`),
so the heartbeats, the re-registration after a lapsed lease and the deregistration are the SDK's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import orjson
from pydantic import ValidationError

from node.client import CardRegistration, NodeError, NodeUnreachable, ReachClient
from node.core import first_problem

from .nodeurl import add_node_option, node_url
from .runtime import run

TOKEN_ENV = "AGENT_REACH_TOKEN"
NODE_TIMEOUT_MS = 10_000
# The card and its options as the CLI names them, for messages about a field that is wrong.
_OPTION_OF_FIELD = {"agent_id": "--agent-id", "lease_ttl_ms": "--lease-ttl-ms", "labels": "--label"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``register``'s options, on the parser :mod:`.entrypoint` made for it."""
    parser.add_argument("--a2a-card", required=True, metavar="FILE", help="the agent's A2A Agent Card (JSON)")
    parser.add_argument("--agent-id", required=True, help="its Agent-Reach id, namespace.group.name")
    add_node_option(parser)
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
    try:
        # As the node parses it (strict JSON), so what passes here is what the node gets.
        registration = CardRegistration.model_validate_json(orjson.dumps(body), strict=True)
    except ValidationError as exc:
        return _fail(_invalid(exc, args.a2a_card))
    return run(_register(node_url(args.node), token, registration, keep_alive=args.keep_alive))


def _invalid(exc: ValidationError, card_file: str) -> str:
    first = first_problem(exc)
    option = _OPTION_OF_FIELD.get(str(first.location[0])) if first.location else None
    if option is not None:
        return f"{option}: {first.message}"
    return f"the card in {card_file} is invalid ({first.field or ''}): {first.message}"


async def _register(node: str, token: str, card: CardRegistration, *, keep_alive: bool) -> int:
    try:
        if not keep_alive:
            async with ReachClient(node, token=token, node_timeout_ms=NODE_TIMEOUT_MS) as client:
                answer = await client.register_card(card)
            print(f"registered {card.agent_id} in region {answer.region} (version {answer.version})", flush=True)
            return 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        # register_max_wait_ms=0: one try, as without --keep-alive; a node that is down is an error now
        async with ReachClient(node, token=token, card=card, node_timeout_ms=NODE_TIMEOUT_MS,
                               register_max_wait_ms=0) as client:
            answer = client.registered
            if answer is not None:
                print(f"registered {card.agent_id} in region {answer.region} (version {answer.version})",
                      flush=True)
            await stop.wait()
        print(f"deregistered {card.agent_id}", flush=True)
        return 0
    except NodeUnreachable as exc:
        return _fail(f"cannot reach the node at {node}: {exc.message}")
    except NodeError as exc:
        where = f" ({exc.field})" if exc.field else ""
        return _fail(f"the node refused the card{where}: {exc.message}")
