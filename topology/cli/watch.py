"""``agent-reach watch``: follow a node's change feed (``GET /v1/watch``) on the terminal.

One line per change the token may see (``upsert``, ``status``, ``delete``) until Ctrl-C, the
node ends the stream, or ``--count`` changes were printed. ``--json`` prints one JSON object per
line (``{"event": …, "data": …}``, the ``hello`` first), for ``jq`` and scripts. Exit codes in
:mod:`.operator`; a watcher the node drops for falling behind (``overflow``) or for a revoked token
(``revoked``) or an expired one (``expired``) exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

import orjson

from .console import json_text, shown
from .operator import NodeAnswered, UsageError, add_operator_options, exit_codes_epilog, run_operator

if TYPE_CHECKING:
    from .nodeclient import NodeClient

__all__ = ["add_arguments"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``watch``'s options, on the parser :mod:`.entrypoint` made for it."""
    parser.epilog = exit_codes_epilog()
    parser.add_argument("--capability", help="only agents with this capability")
    parser.add_argument("--pattern", help="only agent ids matching this pattern (* wildcards)")
    parser.add_argument("--since", type=int, metavar="VERSION", help="replay this region's changes after VERSION first")
    parser.add_argument("--count", type=int, metavar="N", help="stop after N changes (exit 0)")
    add_operator_options(parser, json_help="one JSON object per line: {\"event\": …, \"data\": …}")
    parser.set_defaults(func=lambda args: run_operator(args, lambda client: _follow(client, args)))


def _follow(client: NodeClient, args: argparse.Namespace) -> int:
    import asyncio

    from .runtime import run

    try:
        return run(_watch(client, args))
    except asyncio.CancelledError:  # Ctrl-C cancelled the stream
        raise KeyboardInterrupt from None


async def _watch(client: NodeClient, args: argparse.Namespace) -> int:
    if args.count is not None and args.count < 1:
        raise UsageError("--count must be 1 or more")
    params = [(name, str(value)) for name, value in (("capability", args.capability), ("pattern", args.pattern),
                                                     ("since", args.since)) if value is not None]
    changes = 0
    async for event, data in client.events("/v1/watch", params=params):
        if args.json:
            sys.stdout.write(json_text({"event": event, "data": data}) + "\n")
        else:
            sys.stdout.write(shown(_line(event, data)) + "\n")
        sys.stdout.flush()
        if event == "overflow":
            raise NodeAnswered("the node ended the watch: this watcher fell behind (reconnect with --since)",
                               status=200)
        if event == "revoked":
            raise NodeAnswered("the node ended the watch: the token was revoked", status=401)
        if event == "expired":
            raise NodeAnswered("the node ended the watch: the token has expired", status=401)
        if event == "change":
            changes += 1
            if args.count is not None and changes >= args.count:
                return 0
    return 0


def _line(event: str, data: dict) -> str:
    if event == "hello":
        return f"watching region {data['region']} from version {data['version']} (Ctrl-C stops)"
    if event != "change":
        return f"{event} {orjson.dumps(data).decode()}"
    at = time.strftime("%H:%M:%S", time.localtime(data["at_ms"] / 1000))
    record = data.get("record") or {}
    detail = data.get("reason") or record.get("status") or ""
    return f"{at}  {data['kind']:<6}  {data['region']}  v{data['version']}  {data['agent_id']}  {detail}".rstrip()
