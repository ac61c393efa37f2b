"""Command-line options several ``agent-reach`` commands share: the cluster secret, the data dir."""

from __future__ import annotations

import argparse

__all__ = ["add_secret_options", "add_storage_options"]


def add_secret_options(parser: argparse.ArgumentParser) -> None:
    """``--secret-file`` and ``--create-secret`` (see ``node.security.load_secret``)."""
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
