"""The ``agent-reach`` command line: every subcommand lives in its own module."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from node.redact import CredentialFilter

from . import preflight, register, run_node, sidecar, tokens, up

# Each module adds its subparser and sets ``func`` (taking the parsed args, returning an exit code).
COMMAND_MODULES = [run_node, tokens, up, register, preflight, sidecar]


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


if __name__ == "__main__":
    sys.exit(main())
