"""The ``agent-reach`` entry point: the parser of every subcommand (each in its own module) and :func:`main`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from importlib import metadata

from node.ops import LOG_FORMATS, formatter
from node.trust import CredentialFilter

from . import agents, lookup, preflight, register, sidecar, tokens, up, watch
from . import node as node_command
from .operator import exit_codes_epilog
from .options import LOG_FORMAT_ENV, log_format_help

__all__ = ["COMMAND_MODULES", "build_parser", "main", "version"]

# Each module adds its subparser and sets ``func`` (taking the parsed args, returning an exit code).
COMMAND_MODULES = [node_command, tokens, up, register, preflight, sidecar, agents, lookup, watch]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-reach", description="Agent-Reach: the reach layer for agents.",
                                     epilog="operator commands (agents, resolve, search, watch, token revoke) "
                                            + exit_codes_epilog())
    parser.add_argument("--version", action="version", version=f"agent-reach {version()}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING … (default INFO)")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=os.environ.get(LOG_FORMAT_ENV) or "text",
                        help=log_format_help())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        getattr(module, "add_parser", getattr(module, "add_parsers", None))(commands)
    return parser


def version() -> str:
    """The installed distribution's version (``pyproject.toml``), or ``unknown`` when not installed."""
    try:
        return metadata.version("agent-reach")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given: what --workers hands its children
    if args.log_format not in LOG_FORMATS:  # from the environment: argparse checks only the flag
        print(f"agent-reach: error: {LOG_FORMAT_ENV}={args.log_format!r}: use one of {', '.join(LOG_FORMATS)}",
              file=sys.stderr)
        return 2
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(args.log_format))
    # On the handler, not the root logger: a handler's filter sees every propagated record.
    handler.addFilter(CredentialFilter())
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C before a command installed its own handling
        return 130

