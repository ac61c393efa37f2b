"""``agent-reach token issue``: print a bearer token signed with the cluster secret;
``agent-reach token revoke`` (:mod:`.revoke`): refuse one before it expires.

Every token the command line issues — ``token issue`` for any role, the admin token ``up`` and
``node --print-admin-token`` print — lasts ``DEFAULT_TOKEN_TTL_S`` (30 days) unless ``--ttl-s``
says otherwise, and each says how long it lasts in the same words (:func:`lifetime`).

Node's token code (``node.trust``, which loads Redis and cryptography with it) is imported when a
token is issued, not to build the parser.
"""

from __future__ import annotations

import argparse
import sys

from . import console, revoke
from .nodenames import DEFAULT_TOKEN_TTL_S
from .options import add_secret_options

__all__ = ["add_arguments", "admin_token_line", "issue_token", "lifetime"]


def add_arguments(token: argparse.ArgumentParser) -> None:
    """``token``'s actions, on the parser :mod:`.entrypoint` made for it."""
    actions = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    issue = actions.add_parser("issue", help="print a token")
    who = issue.add_mutually_exclusive_group(required=True)
    who.add_argument("--agent", metavar="AGENT_ID", help="a token that may register/heartbeat this agent")
    who.add_argument("--admin", action="store_true", help="an admin token (may act for any agent)")
    who.add_argument("--caller", metavar="NAME", help="a token that may only resolve/search/report")
    issue.add_argument("--ttl-s", type=int, default=DEFAULT_TOKEN_TTL_S,
                       help=f"lifetime in seconds (default {DEFAULT_TOKEN_TTL_S}: {lifetime(DEFAULT_TOKEN_TTL_S)})")
    add_secret_options(issue)
    issue.set_defaults(func=issue_token)
    revoke.add_parser(actions)


def issue_token(args: argparse.Namespace) -> int:
    from node.core.models import AGENT_ID_RE, TokenRole
    from node.trust import SecretError, Signer, load_secret, token_claims_unverified

    if args.agent and not AGENT_ID_RE.match(args.agent):
        print(f"error: {args.agent!r} is not an agent id (namespace.group.name, lower-case)", file=sys.stderr)
        return 2
    if args.caller is not None and args.caller.strip().lower() == "admin":
        # Harmless on the node (a tenant is a role and a subject), but a caller named "admin" reads
        # like the admin in every trace, log line and decision it appears in.
        print("error: 'admin' names the admin role, not a caller: use --admin for an admin token, or give the "
              "caller another name", file=sys.stderr)
        return 2
    if args.ttl_s <= 0:
        print("error: --ttl-s must be positive", file=sys.stderr)
        return 2
    try:
        secret, source = load_secret(secret_file=args.secret_file, create=args.create_secret)
    except SecretError as exc:
        console.error(str(exc))
        return 2
    if args.admin:
        subject, role = "admin", TokenRole.ADMIN
    elif args.agent:
        subject, role = args.agent, TokenRole.AGENT
    else:
        subject, role = args.caller, TokenRole.CALLER
    token = Signer(secret).issue(subject, role, ttl_s=args.ttl_s)
    print(token)
    claims = token_claims_unverified(token)
    print(f"({role.value} token for {subject}, id {claims.jti}, valid {lifetime(args.ttl_s)}; signed with the "
          f"secret from {source})", file=sys.stderr)
    return 0


def lifetime(ttl_s: int) -> str:
    """How long a token lasts, as every command says it: ``30 days``, ``12 h``, ``90 s``."""
    if ttl_s % 86_400 == 0:
        days = ttl_s // 86_400
        return f"{days} day{'s' if days != 1 else ''}"
    if ttl_s % 3_600 == 0:
        return f"{ttl_s // 3_600} h"
    return f"{ttl_s} s"


def admin_token_line(token: str) -> str:
    """The line ``up`` and ``node --print-admin-token`` print."""
    return f"admin token (valid {lifetime(DEFAULT_TOKEN_TTL_S)}): {token}"
