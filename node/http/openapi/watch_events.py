"""The server-sent events of ``GET /v1/watch`` as the document describes them (``WatchEvent``,
the stream's ``itemSchema``): ``hello`` first, then one ``change`` (a
:class:`~node.core.models.ChangeEvent`) per event, ``overflow`` when a watcher fell behind,
``revoked`` when the watcher's token was revoked, ``expired`` when it expired (each ends the stream). The
stream itself is written by ``node.http.watch_stream``.
"""

from __future__ import annotations

from .patterns import Schema
from .shapes import Shape


class WatchHello(Shape):
    """The first event of every watch: the region and the version the node is at."""

    region: str
    version: int


class WatchOverflow(Shape):
    """The last event of a watcher that fell behind; reconnect with ``since=``."""

    message: str


class WatchRevoked(Shape):
    """The last event of a watcher whose token was revoked (``node.trust.revocation``)."""

    message: str


class WatchExpired(Shape):
    """The last event of a watcher whose token expired while it watched."""

    message: str


def watch_event_schema() -> Schema:
    """One event of the stream: its ``event`` name, its ``id`` (changes only) and its JSON ``data``."""
    return {"description": "One server-sent event of /v1/watch.", "oneOf": [
        _sse_event("hello", "WatchHello"),
        {**_sse_event("change", "ChangeEvent"), "required": ["event", "data", "id"]},
        _sse_event("overflow", "WatchOverflow"),
        _sse_event("revoked", "WatchRevoked"),
        _sse_event("expired", "WatchExpired"),
    ]}


def _sse_event(kind: str, model: str) -> Schema:
    return {"type": "object", "required": ["event", "data"], "properties": {
        "event": {"const": kind},
        "id": {"type": "string", "pattern": "^[0-9]+$", "description": "The region version of the last change."},
        "data": {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"$ref": f"#/components/schemas/{model}"}},
    }}
