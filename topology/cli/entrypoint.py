"""The ``agent-reach`` entry point: the table of subcommands (:data:`COMMANDS`), the parser and
:func:`main`.

A command's module is imported only when that command is given (to run it or show its help):
the parser knows every command by its name and help line, and argparse looks up the parser of
the given command alone, which its module fills then (:class:`_CommandParsers`). So ``--version``
and the operator commands load neither the node's server, federation, Kafka nor the model —
``agent-reach node`` needs them, ``agent-reach agents list`` does not
(``tests/topology/test_cli_imports.py``). The log handler takes node's formatter and credential
filter with its first record (:class:`_LogHandler`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from .exitcodes import exit_codes_epilog
from .nodenames import LOG_FORMATS
from .options import LOG_FORMAT_ENV, log_format_help

__all__ = ["COMMANDS", "Command", "build_parser", "main", "version"]


class Command(NamedTuple):  # not a dataclass: dataclasses (and inspect) would add a third to --version's imports
    """A subcommand: its name, its line in ``agent-reach --help``, and ``arguments``, the
    ``module:function`` of this package that adds its options (and its ``func``, which takes the
    parsed args and returns the exit code) to the parser made for it."""

    name: str
    help: str
    arguments: str


COMMANDS = (
    Command("node", "run one region's registry node", "node:add_arguments"),
    Command("token", "issue or revoke bearer tokens", "tokens:add_arguments"),
    Command("up", "run a whole topology locally (embedded Redis/Kafka where none is set)", "up:add_arguments"),
    Command("register", "register an agent from its A2A Agent Card", "register:add_arguments"),
    Command("preflight", "check an agent config against its node before starting it", "preflight:add_arguments"),
    Command("sidecar", "register, probe and heartbeat for an existing HTTP agent", "sidecar:add_arguments"),
    Command("agents", "list, inspect or deregister agents on a node", "agents:add_arguments"),
    Command("resolve", "the route ticket a caller would get (POST /v1/resolve)", "lookup:add_resolve_arguments"),
    Command("search", "find agents by what they do, in plain words (GET /v1/search)", "lookup:add_search_arguments"),
    Command("watch", "follow the change feed (GET /v1/watch)", "watch:add_arguments"),
    Command("acl", "list, set or delete the region's ACL rules (an admin token)", "acl:add_arguments"),
)


class _CommandParsers(dict[str, argparse.ArgumentParser]):
    """The subcommands' parsers by name, each given its options by its command's module when it is
    first looked up — by argparse for the command given, or by a caller that wants its help."""

    def __init__(self) -> None:
        super().__init__()
        self._unfilled: dict[str, str] = {}

    def fill_later(self, name: str, arguments: str) -> None:
        self._unfilled[name] = arguments

    def __getitem__(self, name: str) -> argparse.ArgumentParser:
        parser = super().__getitem__(name)
        arguments = self._unfilled.pop(name, None)
        if arguments is not None:
            module, _, function = arguments.partition(":")
            getattr(importlib.import_module(f".{module}", __package__), function)(parser)
        return parser

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default


class _Commands(argparse._SubParsersAction):
    """The ``COMMAND`` argument, its parsers held in a :class:`_CommandParsers`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._name_parser_map = self.choices = _CommandParsers()

    def add_command(self, command: Command) -> None:
        self.add_parser(command.name, help=command.help)
        self._name_parser_map.fill_later(command.name, command.arguments)


class _Version(argparse._VersionAction):
    """``--version``, the installed version read only when asked for: ``importlib.metadata``
    takes longer to import than the rest of the parser."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        self.version = f"agent-reach {version()}"
        super().__call__(parser, namespace, values, option_string)


class _LogHandler(logging.StreamHandler):
    """stderr in the ``--log-format``, URL passwords masked (``node.trust.CredentialFilter``).

    The formatter and the filter are node's, imported with the first record: most commands log
    nothing, and ``node.ops`` and ``node.trust`` take longer to import than a light command runs.
    """

    def __init__(self, log_format: str) -> None:
        super().__init__(sys.stderr)
        self._log_format: str | None = log_format  # None once the formatter and the filter are set

    def handle(self, record: logging.LogRecord) -> bool:
        if self._log_format is not None:
            self._set_up()
        return super().handle(record)

    def _set_up(self) -> None:
        from node.ops import formatter
        from node.trust import CredentialFilter

        with self.lock:
            if self._log_format is None:  # another thread's record came first
                return
            self.setFormatter(formatter(self._log_format))
            # On the handler, not the root logger: a handler's filter sees every propagated record.
            self.addFilter(CredentialFilter())
            self._log_format = None


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; a command's options are added when its parser is looked up."""
    parser = argparse.ArgumentParser(prog="agent-reach", description="Agent-Reach: the reach layer for agents.",
                                     epilog="operator commands (agents, resolve, search, watch, acl, token revoke) "
                                            + exit_codes_epilog())
    parser.add_argument("--version", action=_Version)
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING … (default INFO)")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=os.environ.get(LOG_FORMAT_ENV) or "text",
                        help=log_format_help())
    commands = parser.add_subparsers(action=_Commands, dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        commands.add_command(command)
    return parser


def version() -> str:
    """The installed distribution's version (``pyproject.toml``), or ``unknown`` when not installed."""
    from importlib import metadata

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
    logging.basicConfig(level=args.log_level.upper(), handlers=[_LogHandler(args.log_format)])
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C before a command installed its own handling
        return 130
