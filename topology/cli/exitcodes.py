"""The exit codes of the operator commands (``agents``, ``resolve``, ``search``, ``watch``,
``token revoke``), the same for each (:data:`EXIT_CODES`; ``--help`` lists them):

====  ==========================================================================================
 0    done
 1    the node answered with an error (4xx/5xx; the message is the node's, on stderr)
 2    usage: a missing or malformed option, no token
 3    the node cannot be reached (refused, timed out, not HTTP)
130   interrupted (Ctrl-C)
====  ==========================================================================================

A module of its own: ``agent-reach --help`` lists them, and ``--version`` builds that parser.
"""

from __future__ import annotations

__all__ = ["EXIT_CODES", "EXIT_INTERRUPTED", "EXIT_NODE_ERROR", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE",
           "exit_codes_epilog"]

EXIT_OK = 0
EXIT_NODE_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130
EXIT_CODES = {
    EXIT_OK: "done",
    EXIT_NODE_ERROR: "the node answered with an error (its message on stderr)",
    EXIT_USAGE: "usage: a missing or malformed option, no token",
    EXIT_UNREACHABLE: "the node cannot be reached",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}


def exit_codes_epilog() -> str:
    """The exit codes, as ``--help`` shows them."""
    return "exit codes: " + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items())
