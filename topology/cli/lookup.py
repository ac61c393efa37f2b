"""``agent-reach resolve`` and ``agent-reach search``: ask a node where a capability is served.

``resolve CAPABILITY`` (or ``--agent-id``, ``--pattern``) is ``POST /v1/resolve``: the route
ticket the router would hand a caller with this token — target, alternates, how it matched.
``search "plain words"`` is ``GET /v1/search``: the agents a natural-language query finds, with
their scores and what matched. A table by default, the node's JSON with ``--json``; exit codes in
:mod:`.operator`.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .console import shown
from .operator import (
    UsageError,
    add_operator_options,
    as_json,
    exit_codes_epilog,
    print_table,
    run_operator,
)

if TYPE_CHECKING:
    from .nodeclient import NodeClient

__all__ = ["add_resolve_arguments", "add_search_arguments"]


def add_resolve_arguments(resolve: argparse.ArgumentParser) -> None:
    """``resolve``'s options, on the parser :mod:`.entrypoint` made for it."""
    resolve.epilog = exit_codes_epilog()
    resolve.add_argument("capability", nargs="?", metavar="CAPABILITY", help="e.g. translate.text")
    resolve.add_argument("--version", help="capability version constraint, e.g. '1' or '>=1.2,<3'")
    resolve.add_argument("--agent-id", help="this agent (instead of a capability)")
    resolve.add_argument("--pattern", help="an agent id pattern with * wildcards (instead of a capability)")
    resolve.add_argument("--scope", choices=["local", "local-first", "global"], default=None)
    resolve.add_argument("--preferred-region")
    resolve.add_argument("--no-semantic", action="store_true", help="never the semantic fallback")
    add_operator_options(resolve)
    resolve.set_defaults(func=lambda args: run_operator(args, lambda client: _resolve(client, args)))


def add_search_arguments(search: argparse.ArgumentParser) -> None:
    """``search``'s options, on the parser :mod:`.entrypoint` made for it."""
    search.epilog = exit_codes_epilog()
    search.add_argument("query", nargs="+", metavar="WORDS", help='e.g. "translate a contract into German"')
    search.add_argument("-k", type=int, default=10, help="how many agents (default 10)")
    search.add_argument("--scope", choices=["local", "local-first", "global"], default="global")
    search.add_argument("--routable", action="store_true", help="only agents the router would consider")
    add_operator_options(search)
    search.set_defaults(func=lambda args: run_operator(args, lambda client: _search(client, args)))


def _resolve(client: NodeClient, args: argparse.Namespace) -> int:
    selectors = [value for value in (args.capability, args.agent_id, args.pattern) if value]
    if len(selectors) != 1:
        raise UsageError("name exactly one of CAPABILITY, --agent-id or --pattern")
    body: dict[str, Any] = {"capability": args.capability, "agent_id": args.agent_id, "pattern": args.pattern,
                            "version": args.version, "preferred_region": args.preferred_region,
                            "scope": args.scope}
    body = {name: value for name, value in body.items() if value is not None}
    if args.no_semantic:
        body["semantic"] = False
    ticket = client.call("POST", "/v1/resolve", body=body)
    if as_json(args, ticket):
        return 0
    match = ticket["match"]
    how = match["kind"] + (f" {match['capability']}" if match.get("capability") else "")
    if match["kind"] == "semantic":
        how += f" (score {match['score']:.3f})"
    print(shown(f"ticket {ticket['ticket_id']}  trace {ticket['trace_id']}  match {how}  caller {ticket['caller']}"))
    rows = [["target", *_target(ticket["target"])]]
    rows += [["alternate", *_target(target)] for target in ticket["alternates"]]
    print_table(["ROLE", "AGENT", "REGION", "LOCALITY", "ENDPOINT"], rows)
    return 0


def _target(target: dict[str, Any]) -> list[str]:
    locality = target["locality"] + (" (stale)" if target.get("stale") else "")
    return [target["agent_id"], target["region"], locality, target["endpoint"]]


def _search(client: NodeClient, args: argparse.Namespace) -> int:
    if not 1 <= args.k <= 100:
        raise UsageError("-k must be within 1..100")
    params = [("q", " ".join(args.query)), ("k", str(args.k)), ("scope", args.scope)]
    if args.routable:
        params.append(("routable", "true"))
    answer = client.call("GET", "/v1/search", params=params)
    if as_json(args, answer):
        return 0
    print(shown(f"{len(answer['hits'])} agents ({answer['mode']} ranking, {answer['took_ms']:.1f} ms)"))
    rows = [[f"{hit['score']:.3f}", hit["agent_id"], hit["region"], hit["locality"],
             f"capability {hit['capability']}" if hit["capability"] else "description",
             "yes" if hit["routable"] else "no"] for hit in answer["hits"]]
    print_table(["SCORE", "AGENT", "REGION", "LOCALITY", "MATCHED", "ROUTABLE"], rows,
                empty="(nothing this token may see matches)")
    return 0
