"""The vocabulary of the boundary models: identifier patterns, bounded text and numbers, URLs,
free-form JSON, agent-id patterns, and :class:`Strict`, the base of every model.

Whatever a route accepts must read back from Redis, the change stream, Kafka and JSON
encoders, so these admit only what every one of them can carry: finite floats, integers within
int64, text without control characters (prose may hold tabs and line breaks), URLs without
whitespace. This module does no I/O.
"""

from __future__ import annotations

import fnmatch
import math
import re
from functools import lru_cache
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

_SEGMENT = r"[a-z0-9_-]+"
AGENT_ID_PATTERN = rf"^{_SEGMENT}\.{_SEGMENT}\.{_SEGMENT}$"
AGENT_ID_RE = re.compile(AGENT_ID_PATTERN)
_PATTERN_SEGMENT = r"[a-z0-9_*-]+"
AGENT_PATTERN_RE = re.compile(rf"^{_PATTERN_SEGMENT}\.{_PATTERN_SEGMENT}\.{_PATTERN_SEGMENT}$")
CAPABILITY_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.:/-]{0,127}$"
LABEL_KEY_PATTERN = r"^[a-z0-9][a-z0-9_./-]{0,62}$"
REGION_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
TRANSPORT_PATTERN = r"^[a-z][a-z0-9+_-]{0,31}$"
TRACE_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,100}$"
ENDPOINT_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"

INT64_MAX = 2**63 - 1
# One line of text: no C0/C1 control characters, no Unicode line or paragraph separators. The
# class body is shared by what writes others' text for a reader (node.ops.logs, the CLI's console).
NOT_IN_ONE_LINE = "\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029"
SINGLE_LINE_PATTERN = f"^[^{NOT_IN_ONE_LINE}]*$"
# Prose: tabs and line breaks allowed, other control characters not.
MULTI_LINE_PATTERN = "^[^\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f]*$"
_URL_FORBIDDEN_RE = re.compile(r"[\x00-\x20\x7f-\x9f\u2028\u2029]")
MAX_JSON_DEPTH = 32

AgentId = Annotated[str, Field(pattern=AGENT_ID_PATTERN, max_length=200, examples=["payment.risk_check.prod_01"])]
Region = Annotated[str, Field(pattern=REGION_PATTERN, max_length=63)]
ShortText = Annotated[str, Field(max_length=200, pattern=SINGLE_LINE_PATTERN)]
LongText = Annotated[str, Field(max_length=4_000, pattern=MULTI_LINE_PATTERN)]
Millis = Annotated[int, Field(ge=0, le=INT64_MAX, description="ms since the epoch")]
EndpointName = Annotated[str, Field(pattern=ENDPOINT_NAME_PATTERN)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]


class Strict(BaseModel):
    """Base of every boundary model: unknown fields are errors, floats are finite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def check_url(value: str, *, schemes: tuple[str, ...] = ("http", "https")) -> str:
    """``value`` if it is an absolute URL with one of ``schemes``; raises ValueError saying why not."""
    if _URL_FORBIDDEN_RE.search(value):
        raise ValueError("must not contain whitespace or control characters")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise ValueError(f"is not a valid URL: {exc}") from None
    if parts.scheme not in schemes or not parts.hostname:
        raise ValueError(f"must be an absolute URL with scheme {' or '.join(schemes)}")
    return value


def check_json_value(value: object, *, _depth: int = 0) -> object:
    """Free-form JSON (payloads, extensions) limited to what every encoder carries.

    Integers must fit int64 — whole numbers written as floats (1e300) too — and floats be
    finite (orjson, Redis and Kafka consumers all refuse or mangle the rest); nesting is bounded.
    """
    if _depth > MAX_JSON_DEPTH:
        raise ValueError(f"is nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        if not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise ValueError("holds an integer outside the 64-bit range")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("holds NaN or an infinite number")
        if value.is_integer() and not -INT64_MAX - 1 <= value <= INT64_MAX:
            # JSON (and the spec's JSON Schema) calls 1e300 an integer, whatever its spelling: a
            # consumer decoding it as one would overflow, as with an integer literal this large.
            raise ValueError("holds a whole number outside the 64-bit range")
        return value
    if isinstance(value, list):
        for item in value:
            check_json_value(item, _depth=_depth + 1)
        return value
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError("holds an object key that is not a string")
            check_json_value(item, _depth=_depth + 1)
        return value
    raise ValueError(f"holds a {type(value).__name__}, which is not JSON")


JsonValue = Annotated[object, AfterValidator(check_json_value)]


@lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> re.Pattern[str]:
    """``payment.risk_check.*`` → a regex; ``*`` matches within one segment only."""
    if not AGENT_PATTERN_RE.match(pattern):
        raise ValueError("must look like namespace.group.name with '*' wildcards, e.g. 'payment.*.*'")
    regex = fnmatch.translate(pattern).replace(".*", "[^.]*")
    return re.compile(regex)
