"""``agent-reach token revoke``: refuse a bearer token before it expires.

The token is named by itself (``TOKEN``, or ``-`` to read it from stdin: the command reads its
``jti`` and ``exp`` without checking the signature — the node checks who revokes, not what it is
told to refuse) or by ``--jti`` and ``--exp`` (from a log line or ``token issue``'s output). The
node's ``POST /v1/admin/tokens/revoke`` (an admin token) puts it on its region's deny list in
Redis; every node of that region refuses it within its ``revocation_poll_interval_ms``. Tokens
are valid in every region, so ``--all-regions`` revokes it in each region of the topology file,
trying each region's node URLs in turn. Exit codes in :mod:`.operator`; with several regions,
the worst of theirs (3 if one could not be reached).

``token``'s parser imports this module: what only a revocation needs (node's token code, the
topology file's models, the HTTP client) is imported where it is used.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from .operator import (
    EXIT_NODE_ERROR,
    EXIT_OK,
    EXIT_UNREACHABLE,
    OperatorError,
    Unreachable,
    UsageError,
    add_operator_options,
    exit_codes_epilog,
    print_json,
    print_table,
    run_operator,
)

if TYPE_CHECKING:
    from ..spec import Topology
    from .nodeclient import NodeClient

__all__ = ["add_parser"]

REVOKE_PATH = "/v1/admin/tokens/revoke"


def add_parser(actions: argparse._SubParsersAction) -> None:
    parser = actions.add_parser("revoke", help="refuse a token before it expires (in one region, or all)",
                                epilog=exit_codes_epilog())
    parser.add_argument("revoked", nargs="?", metavar="TOKEN", help="the token to revoke ('-': read it from stdin)")
    parser.add_argument("--jti", help="the token's id (its jti claim), instead of TOKEN")
    parser.add_argument("--exp", type=int, help="with --jti: the token's expiry (its exp claim, seconds)")
    parser.add_argument("--all-regions", action="store_true",
                        help="revoke in every region of the topology file (default: the one --node is in)")
    parser.add_argument("--topology", metavar="FILE", help="with --all-regions: the topology file (default: the "
                                                           "packaged local.toml)")
    add_operator_options(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return run_operator(args, lambda client: _revoke(client, args))


def _named(args: argparse.Namespace) -> dict[str, Any]:
    if args.revoked is not None:
        from node.trust import token_claims_unverified

        if args.jti is not None or args.exp is not None:
            raise UsageError("name the token by TOKEN or by --jti and --exp, not both")
        text = sys.stdin.read() if args.revoked == "-" else args.revoked
        try:
            claims = token_claims_unverified(text)
        except ValueError as exc:
            raise UsageError(f"TOKEN: {exc}") from None
        if claims.jti is None:
            raise UsageError(f"this token ({claims.sub}, {claims.role.value}) has no id: it was issued before tokens "
                             "had one and cannot be revoked alone; change the cluster secret to end every token")
        return {"jti": claims.jti, "exp": claims.exp}
    if args.jti is None or args.exp is None:
        raise UsageError("name the token to revoke: TOKEN, or --jti and --exp")
    return {"jti": args.jti, "exp": args.exp}


async def _revoke(client: NodeClient, args: argparse.Namespace) -> int:
    body = _named(args)
    if not args.all_regions:
        answer = await client.call("POST", REVOKE_PATH, body=body)
        if args.json:
            print_json(answer)
        else:
            print(_said(answer))
        return EXIT_OK
    from ..spec import TopologyError, load_topology

    try:
        topology = load_topology(args.topology)
    except TopologyError as exc:
        raise UsageError(str(exc)) from None
    results = [await _revoke_in(client, topology, region.name, body) for region in topology.regions]
    if args.json:
        print_json({"jti": body["jti"], "regions": [result for result, _ in results]})
    else:
        print_table(["REGION", "NODE", "RESULT"], [[r["region"], r["node"], r["result"]] for r, _ in results])
    return max(code for _, code in results)


async def _revoke_in(client: NodeClient, topology: Topology, region: str, body: dict[str, Any],
                     ) -> tuple[dict[str, Any], int]:
    """Revoke through the first node URL of ``region`` that answers."""
    from .nodeclient import NodeClient

    failure: OperatorError | None = None
    for url in topology.region(region).node_urls:
        node = NodeClient(url, client.token, timeout_s=client.timeout_s)
        try:
            async with node:
                answer = await node.call("POST", REVOKE_PATH, body=body)
        except Unreachable as exc:
            failure = exc
            continue
        except OperatorError as exc:
            return {"region": region, "node": url, "ok": False, "result": str(exc)}, EXIT_NODE_ERROR
        if answer.get("region") != region:
            return ({"region": region, "node": url, "ok": False,
                     "result": f"that node serves region {answer.get('region')}, not {region}"}, EXIT_NODE_ERROR)
        return {"region": region, "node": url, "ok": True, "result": _said(answer), "answer": answer}, EXIT_OK
    message = str(failure) if failure is not None else "no node URL"
    return {"region": region, "node": "-", "ok": False, "result": message}, EXIT_UNREACHABLE


def _said(answer: dict[str, Any]) -> str:
    if answer["expired"]:
        return f"token {answer['jti']} has expired already: region {answer['region']} refuses it anyway"
    again = "" if answer["new"] else " (it was revoked already)"
    return (f"token {answer['jti']} revoked in region {answer['region']}{again}: every node there refuses it "
            f"within {answer['poll_interval_ms']} ms, until it expires")
