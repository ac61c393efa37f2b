"""The ``agent-reach`` entry point: the parser of every subcommand (each in its own module) and :func:`main`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from node.redact import CredentialFilter

from . import node as node_command
from . import preflight, register, sidecar, tokens, up

__all__ = ["COMMAND_MODULES", "build_parser", "main"]

# Each module adds its subparser and sets ``func`` (taking the parsed args, returning an exit code).
COMMAND_MODULES = [node_command, tokens, up, register, preflight, sidecar]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-reach", description="Agent-Reach: the reach layer for agents.")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING … (default INFO)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # On the handlers, not the root logger: a handler's filter sees every propagated record.
    for handler in logging.getLogger().handlers:
        handler.addFilter(CredentialFilter())
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C before a command installed its own handling
        return 130

