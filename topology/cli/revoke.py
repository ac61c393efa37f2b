"""``agent-reach token revoke``: refuse a bearer token before it expires.

The token is named by itself (``TOKEN``, or ``-`` to read it from stdin: the command reads its
``jti`` and ``exp`` without checking the signature — the node checks who revokes, not what it is
told to refuse) or by ``--jti`` and ``--exp`` (from a log line or ``token issue``'s output). The
node's ``POST /v1/admin/tokens/revoke`` (an admin token) puts it on its region's deny list in
Redis; every node of that region refuses it within its ``revocation_poll_interval_ms``, and the
federation sends it to every peer region over Kafka (``federation.revocations``), so one call
reaches the whole cluster. ``--all-regions`` and ``--topology``, which once revoked region by
region, are accepted and change nothing. Exit codes in :mod:`.operator`.

``token``'s parser imports this module: what only a revocation needs (node's token code, the
topology file's models, the HTTP client) is imported where it is used.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from .operator import EXIT_OK, UsageError, add_operator_options, exit_codes_epilog, print_json, run_operator

if TYPE_CHECKING:
    from .nodeclient import NodeClient

__all__ = ["add_parser"]

REVOKE_PATH = "/v1/admin/tokens/revoke"


def add_parser(actions: argparse._SubParsersAction) -> None:
    parser = actions.add_parser("revoke", help="refuse a token before it expires, in every region",
                                epilog=exit_codes_epilog())
    parser.add_argument("revoked", nargs="?", metavar="TOKEN", help="the token to revoke ('-': read it from stdin)")
    parser.add_argument("--jti", help="the token's id (its jti claim), instead of TOKEN")
    parser.add_argument("--exp", type=int, help="with --jti: the token's expiry (its exp claim, seconds)")
    # Kept so scripts written for region-by-region revocation still run: one node's answer now
    # reaches every region (the federation relays it).
    parser.add_argument("--all-regions", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--topology", metavar="FILE", help=argparse.SUPPRESS)
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


def _revoke(client: NodeClient, args: argparse.Namespace) -> int:
    answer = client.call("POST", REVOKE_PATH, body=_named(args))
    if args.json:
        print_json(answer)
    else:
        print(_said(answer))
    return EXIT_OK


def _said(answer: dict[str, Any]) -> str:
    if answer["expired"]:
        return f"token {answer['jti']} has expired already: region {answer['region']} refuses it anyway"
    again = "" if answer["new"] else " (it was revoked already)"
    said = (f"token {answer['jti']} revoked in region {answer['region']}{again}: every node there refuses it "
            f"within {answer['poll_interval_ms']} ms, until it expires")
    peers = answer.get("peers") or []
    if peers:
        said += f"; regions {', '.join(peers)} refuse it once the federation delivers it (about a second)"
    return said
