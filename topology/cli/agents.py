"""``agent-reach agents list|get|deregister``: the agents a node knows, as its token may see them.

``list`` (``GET /v1/agents``: this region's and, with ``--scope global``, its peers'), ``get ID``
(one record, local or remote), ``deregister ID`` (``DELETE /v1/agents/{id}``: an admin token, or
the agent's own). A table by default, the node's JSON answer with ``--json``; exit codes in
:mod:`.operator`.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from .console import shown
from .operator import add_operator_options, as_json, exit_codes_epilog, print_table, run_operator

if TYPE_CHECKING:
    from .nodeclient import NodeClient

__all__ = ["add_arguments", "describe_load"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``agents``' actions and options, on the parser :mod:`.entrypoint` made for it."""
    parser.epilog = exit_codes_epilog()
    actions = parser.add_subparsers(dest="agents_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the agents the token may see", epilog=exit_codes_epilog())
    listing.add_argument("--capability", help="only agents with this capability")
    listing.add_argument("--pattern", help="agent ids matching namespace.group.name with * wildcards")
    listing.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="repeat for several")
    listing.add_argument("--scope", choices=["local", "local-first", "global"], default="global",
                         help="this region only, or its peers too (default global)")
    listing.add_argument("--routable", action="store_true", help="only agents the router would consider")
    add_operator_options(listing)
    listing.set_defaults(func=lambda args: run_operator(args, lambda client: _list(client, args)))
    get = actions.add_parser("get", help="one agent's record", epilog=exit_codes_epilog())
    get.add_argument("agent_id", metavar="AGENT_ID")
    add_operator_options(get)
    get.set_defaults(func=lambda args: run_operator(args, lambda client: _get(client, args)))
    deregister = actions.add_parser("deregister", help="remove an agent from its region (admin or the agent's token)",
                                    epilog=exit_codes_epilog())
    deregister.add_argument("agent_id", metavar="AGENT_ID")
    add_operator_options(deregister)
    deregister.set_defaults(func=lambda args: run_operator(args, lambda client: _deregister(client, args)))


def _list(client: NodeClient, args: argparse.Namespace) -> int:
    params = [("scope", args.scope)] + [("label", label) for label in args.label]
    if args.capability:
        params.append(("capability", args.capability))
    if args.pattern:
        params.append(("pattern", args.pattern))
    if args.routable:
        params.append(("routable", "true"))
    answer = client.call("GET", "/v1/agents", params=params)
    if as_json(args, answer):
        return 0
    now = time.time() * 1000
    rows = [[record["agent_id"], record["region"], record["status"], _probes(record), describe_load(record),
             _lease(record, answer["region"], now), ",".join(c["name"] for c in record["capabilities"])]
            for record in answer["agents"]]
    print_table(["AGENT", "REGION", "STATUS", "PROBES", "LOAD", "LEASE", "CAPABILITIES"], rows,
                empty="(no agent this token may see)")
    return 0


def _get(client: NodeClient, args: argparse.Namespace) -> int:
    record = client.call("GET", f"/v1/agents/{args.agent_id}")
    if as_json(args, record):
        return 0
    facts = [("agent", record["agent_id"]), ("display name", record["display_name"] or "-"),
             ("region", record["region"]), ("status", record["status"]), ("probes", _probes(record)),
             ("load", describe_load(record)), ("endpoints", ", ".join(f"{k}={v}" for k, v in record["endpoints"].items())),
             ("transport", record["transport"]), ("version", record["version"]), ("weight", record["weight"]),
             ("labels", ", ".join(f"{k}={v}" for k, v in record["labels"].items()) or "-"),
             ("allowed callers", ", ".join(record["allowed_callers"]) or "anyone")]
    width = max(len(name) for name, _ in facts)
    for name, value in facts:
        print(f"{name.ljust(width)}  {shown(value)}")
    print()
    print_table(["CAPABILITY", "VERSION", "DESCRIPTION"],
                [[c["name"], c["version"], c["description"] or "-"] for c in record["capabilities"]])
    return 0


def _deregister(client: NodeClient, args: argparse.Namespace) -> int:
    answer = client.call("DELETE", f"/v1/agents/{args.agent_id}")
    if not as_json(args, answer):
        print(shown(f"deregistered {answer['agent_id']} (region version {answer['version']})"))
    return 0


def _probes(record: dict[str, Any]) -> str:
    verdicts = []
    if record.get("liveness_probe"):
        verdicts.append("live" if record["live"] else "NOT-LIVE")
    if record.get("readiness_probe"):
        verdicts.append("ready" if record["ready"] else "NOT-READY")
    return ",".join(verdicts) or "-"


def describe_load(record: dict[str, Any]) -> str:
    load = record.get("load") or {}
    limit = record.get("max_concurrency")
    return f"{load.get('inflight', 0)}{'/' + str(limit) if limit else ''} inflight, {load.get('queued', 0)} queued"


def _lease(record: dict[str, Any], home: str, now_ms: float) -> str:
    if record["region"] != home:
        return "remote"
    left_s = (record["lease_expires_at_ms"] - now_ms) / 1000
    return f"{left_s:.0f}s" if left_s > 0 else "ended"
