"""What the command line prints: status lines on stdout, notices and errors on stderr, URLs masked;
and text of others (an agent's names and descriptions, a node's answers) made safe for a terminal.

Registered text may hold what a terminal acts on rather than shows: C1 controls (U+009B is CSI,
U+009D OSC in terminals that read them), carriage returns and line breaks (prose may hold them:
a row overwritten or a row made up), and bidirectional overrides (U+202E shows the rest of a line
reversed). :func:`shown` writes each as an escape, ``\\x9b``/``\\u202e``; :func:`json_text` writes
them as JSON escapes, so ``--json`` output parses to the same values and prints inert.
"""

from __future__ import annotations

import re
import sys

import orjson

from .nodenames import NOT_IN_ONE_LINE

__all__ = ["error", "json_text", "notice", "say", "shown"]

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[{NOT_IN_ONE_LINE}{_BIDI}]")
_UNSAFE_KEEPING_LINES = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029{_BIDI}]")
# orjson escapes C0 itself; these it writes as they are (JSON allows them raw).
_UNSAFE_IN_JSON = re.compile(f"[\x7f-\x9f\u2028\u2029{_BIDI}]")


def _masked(line: str) -> str:
    """``node.trust.mask_credentials(line)``, importing ``node.trust`` (Redis, cryptography: slow to
    import) only for a line that can hold a password, one with ``scheme://`` and an ``@``."""
    if "@" not in line or "://" not in line:
        return line
    from node.trust import mask_credentials

    return mask_credentials(line)


def _escape(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: object) -> str:
    """``text`` as one inert line for a terminal: control, line-breaking and bidi characters as escapes."""
    return _UNSAFE.sub(_escape, str(text))


def json_text(value: object, *, indent: bool = False) -> str:
    """``value`` as JSON that a terminal prints inert (see the module docstring); parses to ``value``."""
    text = orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else 0).decode()
    return _UNSAFE_IN_JSON.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


def say(line: str) -> None:
    """A status line on stdout (flushed: a supervisor or a test reads it as it comes)."""
    print(_masked(line), flush=True)


def notice(line: str) -> None:
    """Something happened that needs no action but should be seen (a restart) — on stderr."""
    print(_masked(line), file=sys.stderr, flush=True)


def error(message: str) -> None:
    """``error: <message>`` on stderr; the message should say how to fix the problem."""
    print(f"error: {_UNSAFE_KEEPING_LINES.sub(_escape, _masked(message))}", file=sys.stderr, flush=True)
