"""Command-line options several ``agent-reach`` commands share: the cluster secret, the data dir."""

from __future__ import annotations

import argparse

from .nodenames import LOG_FORMATS

__all__ = ["LOG_FORMAT_ENV", "add_log_format_option", "add_secret_options", "add_storage_options", "log_format_help"]

LOG_FORMAT_ENV = "AGENT_REACH_LOG_FORMAT"


def log_format_help() -> str:
    return (f"log lines as text or as one JSON object each (default: ${LOG_FORMAT_ENV}, else text; 'up' passes "
            "it to its nodes)")


def add_log_format_option(parser: argparse.ArgumentParser) -> None:
    """``--log-format`` after the command too (``agent-reach node --log-format json``); the global one's
    value stays when it is not given here."""
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=argparse.SUPPRESS, help=log_format_help())


def add_secret_options(parser: argparse.ArgumentParser) -> None:
    """``--secret-file`` and ``--create-secret`` (see ``node.trust.tokens.load_secret``)."""
    parser.add_argument("--secret-file", help="cluster secret file (default: $AGENT_REACH_SECRET, "
                                              "$AGENT_REACH_SECRET_FILE, ~/.agent-reach/secret); a named file "
                                              "must exist unless --create-secret (see README: Security)")
    parser.add_argument("--create-secret", action="store_true",
                        help="create the --secret-file (mode 0600) if it does not exist")


def add_storage_options(parser: argparse.ArgumentParser, *, data_dir_help: str) -> None:
    """``--data-dir DIR`` or ``--ephemeral``: where embedded Redis data lives (:mod:`topology.embedded.datadir`)."""
    storage = parser.add_mutually_exclusive_group()
    storage.add_argument("--data-dir", metavar="DIR", help=data_dir_help)
    storage.add_argument("--ephemeral", action="store_true",
                         help="keep the embedded Redis data in a temporary directory removed on exit")
