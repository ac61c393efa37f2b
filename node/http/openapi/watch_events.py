"""The server-sent events of ``GET /v1/watch`` as the document describes them (``WatchEvent``,
the stream's ``itemSchema``): ``hello`` first, then one ``change`` (a
:class:`~node.core.models.ChangeEvent`) per event, ``overflow`` when a watcher fell behind,
``revoked`` when the watcher's token was revoked, ``expired`` when it expired (each ends the stream);
``leases`` (asked for with ``leases=true``) when leases moved. The stream itself is written by
``node.http.watch_stream``.
"""

from __future__ import annotations

from pydantic import Field

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


class WatchLeases(Shape):
    """With ``leases=true``, about every second: the lease ends of this region's agents that moved
    since the last one (a renewal is no change event)."""

    region: str
    now_ms: int = Field(description="The node's clock when it was sent: compare the leases to it")
    leases: dict[str, int] = Field(description="agent_id -> lease end (ms since the epoch)")


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
        _sse_event("leases", "WatchLeases"),
    ]}


def _sse_event(kind: str, model: str) -> Schema:
    return {"type": "object", "required": ["event", "data"], "properties": {
        "event": {"const": kind},
        "id": {"type": "string", "pattern": "^[0-9]+$", "description": "The region version of the last change."},
        "data": {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"$ref": f"#/components/schemas/{model}"}},
    }}
