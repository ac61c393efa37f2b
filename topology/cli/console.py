"""What the command line prints: status lines on stdout, notices and errors on stderr, URLs masked."""

from __future__ import annotations

import sys

from node.redact import mask_credentials

__all__ = ["error", "notice", "say"]


def say(line: str) -> None:
    """A status line on stdout (flushed: a supervisor or a test reads it as it comes)."""
    print(mask_credentials(line), flush=True)


def notice(line: str) -> None:
    """Something happened that needs no action but should be seen (a restart) — on stderr."""
    print(mask_credentials(line), file=sys.stderr, flush=True)


def error(message: str) -> None:
    """``error: <message>`` on stderr; the message should say how to fix the problem."""
    print(f"error: {mask_credentials(message)}", file=sys.stderr, flush=True)
