"""The ``agent-reach`` entry point: the parser of every subcommand (each in its own module) and :func:`main`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib import metadata

from node.redact import CredentialFilter

from . import agents, lookup, preflight, register, sidecar, tokens, up, watch
from . import node as node_command
from .operator import exit_codes_epilog

__all__ = ["COMMAND_MODULES", "build_parser", "main", "version"]

# Each module adds its subparser and sets ``func`` (taking the parsed args, returning an exit code).
COMMAND_MODULES = [node_command, tokens, up, register, preflight, sidecar, agents, lookup, watch]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-reach", description="Agent-Reach: the reach layer for agents.",
                                     epilog="operator commands (agents, resolve, search, watch, token revoke) "
                                            + exit_codes_epilog())
    parser.add_argument("--version", action="version", version=f"agent-reach {version()}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING … (default INFO)")
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
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # On the handlers, not the root logger: a handler's filter sees every propagated record.
    for handler in logging.getLogger().handlers:
        handler.addFilter(CredentialFilter())
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C before a command installed its own handling
        return 130

