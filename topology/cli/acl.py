"""``agent-reach acl list|set|delete``: the region's ACL rules, changed at runtime (an admin token).

``set RULE_ID --agents fin.*.* --callers shop.*.* [--capability NAME] [--effect deny|allow]``
(``PUT /v1/acl/{rule_id}``) holds on every node of the node's region within its
``acl_poll_interval_ms`` and reaches the peer regions over the federation, with no agent
registering again; ``delete RULE_ID`` lifts it; ``list`` shows the rules in force (from every
region). A table by default, the node's JSON answer with ``--json``; exit codes in :mod:`.operator`.
The node checks the rule; this command imports nothing of it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .console import shown
from .operator import add_operator_options, as_json, exit_codes_epilog, print_table, run_operator

if TYPE_CHECKING:
    from .nodeclient import NodeClient

__all__ = ["add_arguments"]

ACL_PATH = "/v1/acl"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``acl``'s actions and options, on the parser :mod:`.entrypoint` made for it."""
    parser.epilog = exit_codes_epilog()
    actions = parser.add_subparsers(dest="acl_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the rules in force in the node's region", epilog=exit_codes_epilog())
    add_operator_options(listing)
    listing.set_defaults(func=lambda args: run_operator(args, lambda client: _list(client, args)))
    setting = actions.add_parser("set", help="set a rule (it holds within about a second, in every region)",
                                 epilog=exit_codes_epilog())
    setting.add_argument("rule_id", metavar="RULE_ID")
    setting.add_argument("--agents", required=True, help="agent id or pattern (namespace.group.name, '*' wildcards)")
    setting.add_argument("--callers", required=True, action="append", metavar="PATTERN",
                         help="caller subject or pattern ('admin' names the admin role); repeat for several")
    setting.add_argument("--capability", help="only routing by this capability of those agents")
    setting.add_argument("--effect", choices=["deny", "allow"], default="deny",
                         help="deny: those callers may not reach them; allow: only those callers may (default deny)")
    setting.add_argument("--description", default="", help="why the rule exists")
    add_operator_options(setting)
    setting.set_defaults(func=lambda args: run_operator(args, lambda client: _set(client, args)))
    deleting = actions.add_parser("delete", help="delete a rule", epilog=exit_codes_epilog())
    deleting.add_argument("rule_id", metavar="RULE_ID")
    add_operator_options(deleting)
    deleting.set_defaults(func=lambda args: run_operator(args, lambda client: _delete(client, args)))


def _list(client: NodeClient, args: argparse.Namespace) -> int:
    answer = client.call("GET", ACL_PATH)
    if as_json(args, answer):
        return 0
    rows = [[entry["id"], entry["rule"]["effect"], entry["rule"]["agents"], entry["rule"].get("capability") or "*",
             ",".join(entry["rule"]["callers"]), entry["origin"]] for entry in answer["rules"]]
    print_table(["RULE", "EFFECT", "AGENTS", "CAPABILITY", "CALLERS", "SET IN"], rows,
                empty=f"(no ACL rule in region {answer['region']})")
    return 0


def _set(client: NodeClient, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"agents": args.agents, "callers": args.callers, "effect": args.effect,
                            "description": args.description}
    if args.capability:
        body["capability"] = args.capability
    answer = client.call("PUT", f"{ACL_PATH}/{args.rule_id}", body=body)
    if not as_json(args, answer):
        print(shown(f"rule {args.rule_id} set in region {answer['region']}: every node there applies it within "
                    f"{answer['poll_interval_ms']} ms, the peer regions once the federation delivers it"))
    return 0


def _delete(client: NodeClient, args: argparse.Namespace) -> int:
    answer = client.call("DELETE", f"{ACL_PATH}/{args.rule_id}")
    if not as_json(args, answer):
        print(shown(f"rule {args.rule_id} deleted in region {answer['region']}"))
    return 0
