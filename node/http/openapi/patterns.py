"""What the models' validators check, as JSON Schema: the grammars of versions, version
constraints, IPv6 literals and URLs, and the schema fragments the refinements are built from.

Each pattern states what the node accepts (``tests/http/test_fuzz.py`` holds them to the code
they mirror: ``node.core.models``, ``node.trust.egress``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ...core.models import INT64_MAX, LABEL_KEY_PATTERN, MULTI_LINE_PATTERN, SINGLE_LINE_PATTERN

Schema = dict[str, Any]


def _any_case(word: str) -> str:
    """A regex matching ``word`` in any letter case (JSON Schema patterns take no flags)."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


def _one_of_words(*words: str) -> str:
    return "(?:" + "|".join(_any_case(word) for word in words) + ")"


# Whitespace that Python's str.strip() removes and a single-line field may hold.
_SPACE = "[ \\u00a0\\u1680\\u2000-\\u200a\\u202f\\u205f\\u3000]*"
_SEP = "[._-]?"
# PEP 440 (packaging.version.VERSION_PATTERN), case-insensitive, without the optional ``v``.
_PEP440 = (
    "(?:[0-9]+!)?[0-9]+(?:\\.[0-9]+)*"
    f"(?:{_SEP}{_one_of_words('alpha', 'a', 'beta', 'b', 'preview', 'pre', 'c', 'rc')}{_SEP}[0-9]*)?"
    f"(?:-[0-9]+|{_SEP}{_one_of_words('post', 'rev', 'r')}{_SEP}[0-9]*)?"
    f"(?:{_SEP}{_any_case('dev')}{_SEP}[0-9]*)?"
    "(?:\\+[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*)?"
)
# node.core.models.parse_version: whitespace and any number of leading v's are dropped, then
# packaging's Version takes whitespace and one v again.
_VERSION = f"{_SPACE}[vV]*{_SPACE}[vV]?{_PEP440}{_SPACE}"
VERSION_PATTERN = f"^{_VERSION}$"
# node.core.models.VersionConstraint: a version (same major, at least it), or PEP 440 specifiers.
# The specifier grammar is larger than this (wildcards, ===, pre-releases): what is here is
# accepted, and the description says where the rest is defined.
_SPECIFIER = "(?:~= *[vV]?[0-9]+(?:\\.[0-9]+)+|(?:==|!=|<=|>=|<|>) *[vV]?[0-9]+(?:\\.[0-9]+)*)"
CONSTRAINT_PATTERN = f"^(?:{_SPACE}|{_VERSION}|{_SPACE}{_SPECIFIER}(?: *, *{_SPECIFIER})*{_SPACE})$"
CONSTRAINT_DESCRIPTION = ("'1' or 'v1.2' (same major version, at least that one) or PEP 440 specifiers such as "
                          "'>=1.2,<3'; empty accepts every version")

# IPv6 literals as RFC 3986 writes them (what ipaddress, urllib and yarl read).
_H16 = "[0-9A-Fa-f]{1,4}"
_IPV4 = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])(?:\\.(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])){3}"
_LS32 = f"(?:{_H16}:{_H16}|{_IPV4})"
IPV6_PATTERN = "(?:" + "|".join([
    f"(?:{_H16}:){{6}}{_LS32}",
    f"::(?:{_H16}:){{5}}{_LS32}",
    f"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    f"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    f"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    f"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    f"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    f"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
    f"(?:(?:{_H16}:){{0,6}}{_H16})?::",
]) + ")"
# node.core.models.fields.check_url, with the host grammar of node.trust.egress: ASCII names (IPv4 literals among
# them) or bracketed IPv6 literals. The egress policy may still refuse an address (a 422
# egress_denied); it also admits internationalised names, which this grammar leaves out.
_HOST = f"(?:[A-Za-z0-9_][A-Za-z0-9_-]{{0,62}}(?:\\.[A-Za-z0-9_][A-Za-z0-9_-]{{0,62}})*\\.?|\\[{IPV6_PATTERN}\\])"
_PORT = "(?::(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?"
_URL_TAIL = "(?:[/?#][^\\x00-\\x20\\x7f-\\x9f\\u2028\\u2029]*)?"


def url_pattern(schemes: Iterable[str]) -> str:
    """Absolute URLs with one of ``schemes``, a host, an optional port, no userinfo, no whitespace."""
    return f"^{_one_of_words(*schemes)}://{_HOST}{_PORT}{_URL_TAIL}$"


def stored_url_pattern(schemes: Iterable[str]) -> str:
    """What a stored URL is sure to be (a record may hold any URL the node accepted)."""
    return f"^{_one_of_words(*schemes)}://[^\\x00-\\x20\\x7f-\\x9f\\u2028\\u2029]+$"


NODE_SCHEMES = ("http", "https")
ENDPOINT_SCHEMES = ("http", "https", "grpc", "grpcs", "ws", "wss")
NODE_URL = {"type": "string", "maxLength": 2_000, "pattern": url_pattern(NODE_SCHEMES),
            "description": "An http(s) URL the node dials (the region's egress policy applies)."}
ENDPOINT_URL = {"type": "string", "maxLength": 2_000, "pattern": url_pattern(ENDPOINT_SCHEMES)}
STORED_NODE_URL = {"type": "string", "maxLength": 2_000, "pattern": stored_url_pattern(NODE_SCHEMES)}
STORED_ENDPOINT_URL = {"type": "string", "maxLength": 2_000, "pattern": stored_url_pattern(ENDPOINT_SCHEMES)}
AGENT_PATTERN = "^[a-z0-9_*-]+\\.[a-z0-9_*-]+\\.[a-z0-9_*-]+$"
CALLER_PATTERN = "^(?:admin|[a-z0-9_*-]+\\.[a-z0-9_*-]+\\.[a-z0-9_*-]+)$"
SINGLE_LINE = {"pattern": SINGLE_LINE_PATTERN}
MULTI_LINE = {"pattern": MULTI_LINE_PATTERN}
SHORT_TEXT = {"type": "string", "maxLength": 200, "pattern": SINGLE_LINE_PATTERN}
LABELS = {"type": "object", "maxProperties": 64, "propertyNames": {"pattern": LABEL_KEY_PATTERN},
          "additionalProperties": SHORT_TEXT}
# node.core.models.check_json_value: integers within int64, finite numbers, nesting at most 32 deep
# (the depth is not expressible; nothing deeper is accepted).
JSON_VALUE: Schema = {
    "description": "Any JSON value: integers within 64 bits, finite numbers, nested at most 32 levels.",
    "anyOf": [
        {"type": "null"}, {"type": "boolean"}, {"type": "string"},
        {"type": "integer", "minimum": -INT64_MAX - 1, "maximum": INT64_MAX},
        {"type": "number", "not": {"type": "integer"}},
        {"type": "array", "items": {"$ref": "#/components/schemas/JsonValue"}},
        {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/JsonValue"}},
    ],
}
JSON_REF = {"$ref": "#/components/schemas/JsonValue"}
