"""How the node's log lines look: plain text or one JSON object per line, and the access log.

``agent-reach --log-format json`` puts :class:`JsonFormatter` on the handlers: every line is an
object with ``ts`` (ISO 8601, UTC, milliseconds), ``level``, ``logger`` and ``message``, plus the
structured fields a call passed as ``extra={"fields": {...}}`` (the access log's method, route,
status …), so a log pipeline needs no parsing rules. The text format shows the same fields as
``key=value`` after the message.

The access log (``NodeConfig.access_log``) is one line per HTTP request on the logger
:data:`ACCESS_LOGGER`, written by the API's middleware (:func:`access_line`).
"""

from __future__ import annotations

import datetime
import logging
import re
from typing import Any

import orjson

from ..core.models import NOT_IN_ONE_LINE

__all__ = ["ACCESS_LOGGER", "FIELDS", "JsonFormatter", "LOG_FORMATS", "TextFormatter", "access_line", "formatter", "one_line"]

ACCESS_LOGGER = "agent_reach.access"
FIELDS = "fields"  # the ``extra`` key structured fields travel under
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, FIELDS, None)
    return fields if isinstance(fields, dict) else {}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``message``, the record's fields,
    and ``exception`` (the formatted traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        line: dict[str, Any] = {"ts": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                                "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for key, value in _fields(record).items():
            line.setdefault(key, value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:  # a filter may have masked it already (node.trust.redact.CredentialFilter)
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    """The classic line, with the record's fields appended as ``key=value``.

    One record is one line (a traceback below it aside): control characters and line breaks in
    the message and the fields — a request's path, an agent's answer in a probe error — are
    written as escapes (``\\n``, ``\\x1b``, ``\\u2028``), so nothing a client sends can start a
    line of its own that reads as the node's.
    """

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging.Formatter's name
        escaped = logging.makeLogRecord(record.__dict__)  # the record itself goes on to other handlers
        escaped.message = one_line(record.message)
        return super().formatMessage(escaped)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = _fields(record)
        if not fields:
            return text
        head, newline, rest = text.partition("\n")  # a traceback stays below the line
        pairs = " ".join(f"{key}={one_line(str(value))}" for key, value in fields.items())
        return f"{head} {pairs}{newline}{rest}"


_UNPRINTABLE_RE = re.compile(f"[{NOT_IN_ONE_LINE}]")


def one_line(text: str) -> str:
    """``text`` with control characters and line breaks as backslash escapes (``\\n``, ``\\x1b``)."""
    if not _UNPRINTABLE_RE.search(text):
        return text
    return _UNPRINTABLE_RE.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), text)


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``log_format`` (one of :data:`LOG_FORMATS`); raises ValueError naming them."""
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return TextFormatter()
    raise ValueError(f"log format {log_format!r}: use one of {', '.join(LOG_FORMATS)}")


def access_line(*, method: str, path: str, route: str, status: int, duration_s: float, remote: str | None,
                caller: str | None, trace_id: str | None) -> tuple[str, dict[str, Any]]:
    """The access log's message and fields for one answered request."""
    fields: dict[str, Any] = {"method": method, "path": path, "route": route, "status": status,
                              "duration_ms": round(duration_s * 1000, 3), "remote": remote, "caller": caller}
    if trace_id:
        fields["trace_id"] = trace_id
    return f"{method} {path} {status}", fields
