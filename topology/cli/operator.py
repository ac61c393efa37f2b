"""What the operator commands share (``agents``, ``resolve``, ``search``, ``watch``, ``token
revoke``): the node and token options, the exit codes (:mod:`.exitcodes`), running a command
with a client of the node's v1 API (:class:`~topology.cli.nodeclient.NodeClient`, imported only
then) and how answers are printed — a table for people, ``--json`` for scripts.

A command is a plain function of the client: one request and its answer need no event loop
(``watch``, which follows a stream, runs its own, :func:`~topology.cli.runtime.run`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import console
from .exitcodes import (
    EXIT_CODES,
    EXIT_INTERRUPTED,
    EXIT_NODE_ERROR,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    exit_codes_epilog,
)
from .nodenames import TOKEN_ENV
from .nodeurl import add_node_option, node_url

if TYPE_CHECKING:
    from .nodeclient import NodeClient

__all__ = ["EXIT_CODES", "EXIT_INTERRUPTED", "EXIT_NODE_ERROR", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE",
           "NodeAnswered", "as_json", "OperatorError", "Unreachable", "UsageError", "add_operator_options",
           "exit_codes_epilog", "print_json", "print_table", "run_operator"]

DEFAULT_TIMEOUT_S = 10.0


class OperatorError(Exception):
    """A command failed; ``exit_code`` says how (see :data:`~topology.cli.exitcodes.EXIT_CODES`)."""

    exit_code = EXIT_NODE_ERROR


class UsageError(OperatorError):
    """The command line is incomplete or wrong."""

    exit_code = EXIT_USAGE


class Unreachable(OperatorError):
    """The node did not answer over HTTP."""

    exit_code = EXIT_UNREACHABLE


class NodeAnswered(OperatorError):
    """The node answered with an error status; ``body`` is its JSON error body, if any."""

    exit_code = EXIT_NODE_ERROR

    def __init__(self, message: str, *, status: int, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def add_operator_options(parser: argparse.ArgumentParser, *, json_help: str = "print the node's answer as JSON") -> None:
    """``--node``, ``--token``, ``--timeout-s`` and ``--json``."""
    add_node_option(parser)
    parser.add_argument("--token", help=f"bearer token (default ${TOKEN_ENV}); 'agent-reach token issue' prints one")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"give up on the node after this long (default {DEFAULT_TIMEOUT_S:g} s)")
    parser.add_argument("--json", action="store_true", help=json_help)


def token_of(args: argparse.Namespace) -> str:
    """``--token``, else ``$AGENT_REACH_TOKEN``; raises :class:`UsageError` without either."""
    token = (args.token or os.environ.get(TOKEN_ENV, "")).strip()
    if not token:
        raise UsageError(f"give --token or set ${TOKEN_ENV} (e.g. 'agent-reach token issue --admin')")
    return token


def run_operator(args: argparse.Namespace, command: Callable[[NodeClient], int | None]) -> int:
    """Run ``command`` with a client of the node the options name; errors become exit codes."""
    try:
        token = token_of(args)
        url = node_url(args.node)

        from .nodeclient import NodeClient

        with NodeClient(url, token, timeout_s=args.timeout_s) as client:
            return int(command(client) or EXIT_OK)
    except OperatorError as exc:
        console.error(console.shown(exc))  # one line: a node's message may quote what others sent it
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def print_json(value: object) -> None:
    """One JSON document on stdout (scripts parse it; keys as the node sent them)."""
    sys.stdout.write(console.json_text(value, indent=True) + "\n")
    sys.stdout.flush()


def as_json(args: argparse.Namespace, answer: object) -> bool:
    """With ``--json``: print ``answer`` as JSON and say so (the caller prints nothing else)."""
    if args.json:
        print_json(answer)
    return bool(args.json)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, empty: str = "(none)") -> None:
    """Aligned columns for people, each cell :func:`console.shown`; ``empty`` when there is no row."""
    if not rows:
        print(empty)
        return
    cells = [[console.shown(value) for value in row] for row in rows]
    widths = [max(len(headers[i]), *(len(row[i]) for row in cells)) for i in range(len(headers))]
    for row in [list(headers), *cells]:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip())
