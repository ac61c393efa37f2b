"""Errors of a regional node.

Hierarchy::

    NodeError                     base; carries an HTTP status and a snake_case code
    ├── BadRequest                400 the request is malformed (bad JSON, bad query parameter)
    ├── ValidationFailed          422 the body parsed but a field is wrong
    │   ├── RequestLineTooLong    414 (node.http.server) the request line exceeds the server's limit
    │   └── HeaderFieldsTooLarge  431 (node.http.server) a header exceeds the server's limit
    ├── PayloadTooLarge           413 the body exceeds the node's limit
    ├── RequestTimeout            408 the request (head: node.http.server; body: here) came too slowly
    ├── Unauthorized              401 no token, or a forged or expired one
    ├── Forbidden                 403 a valid token that may not do this
    ├── NotFound                  404 unknown agent, route, ticket …
    │   ├── UnknownAgent          404 the agent has no lease here: register again
    │   └── NoAgentAvailable      404 the router found nobody; says why per stage
    ├── Conflict                  409 a concurrent change won; retry
    ├── RateLimited               429 too many requests from one caller
    ├── TooManyConnections        503 (node.http.server) the node's connection cap is reached
    ├── StoreUnavailable          503 Redis cannot be reached
    ├── PeerUnreachable           503 a peer region's node did not answer a forwarded lookup in time
    └── SearchUnavailable         503 no search is attached to this node

:func:`first_problem` reads what pydantic found wrong first, for every layer that turns a
``ValidationError`` into a one-line message of its own (HTTP bodies, stored records, Kafka
events, config files). This module does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError


class NodeError(Exception):
    """Base of all node errors; rendered as ``{"error", "message", "field"}``."""

    status = 500
    code = "internal_error"

    def __init__(self, message: str, *, field: str | None = None, details: dict[str, object] | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details
        if code is not None:
            self.code = code

    def body(self) -> dict[str, object]:
        body: dict[str, object] = {"error": self.code, "message": self.message, "field": self.field}
        if self.details:
            body["details"] = self.details
        return body


class BadRequest(NodeError):
    """The request is malformed."""

    status = 400
    code = "bad_request"


class ValidationFailed(NodeError):
    """A field of the body or query is invalid."""

    status = 422
    code = "validation_failed"


class PayloadTooLarge(NodeError):
    """The request body exceeds the node's size limit."""

    status = 413
    code = "payload_too_large"


class RequestTimeout(NodeError):
    """The request did not arrive within the node's time limit."""

    status = 408
    code = "request_timeout"


class Unauthorized(NodeError):
    """The request carries no valid bearer token."""

    status = 401
    code = "unauthorized"


class Forbidden(NodeError):
    """The token is valid but does not allow this operation."""

    status = 403
    code = "forbidden"


class NotFound(NodeError):
    """The thing asked for does not exist."""

    status = 404
    code = "not_found"


class UnknownAgent(NotFound):
    """The agent has no lease in this region: register again."""

    code = "unknown_agent"


class NoAgentAvailable(NotFound):
    """The router found no agent; ``details`` says why at each stage."""

    code = "no_agent_available"


class Conflict(NodeError):
    """A concurrent change won the race; retry."""

    status = 409
    code = "conflict"


class RateLimited(NodeError):
    """The caller exceeded its request budget."""

    status = 429
    code = "rate_limited"


class StoreUnavailable(NodeError):
    """The region's Redis cannot be reached."""

    status = 503
    code = "store_unavailable"


class PeerUnreachable(NodeError):
    """No node of a peer region answered a forwarded lookup within its deadline (callers fall back)."""

    status = 503
    code = "peer_unreachable"


class SearchUnavailable(NodeError):
    """No natural-language search is attached to this node."""

    status = 503
    code = "search_unavailable"


@dataclass(frozen=True, slots=True)
class Problem:
    """One error pydantic found: where (dotted, None for the whole value), what, which kind."""

    field: str | None
    message: str
    kind: str  # pydantic's error type: "json_invalid", "extra_forbidden", "missing", ...
    location: tuple[int | str, ...]  # undotted, for callers that map it to their own names (node.core.a2a)

    def line(self) -> str:
        """``field: message``, or the message alone when it is about the whole value."""
        return f"{self.field}: {self.message}" if self.field else self.message

    @property
    def text(self) -> str:
        """The message without pydantic's "Value error, " prefix (what a validator raised)."""
        return self.message.removeprefix("Value error, ")


def problems(exc: ValidationError, *, limit: int | None = None) -> list[Problem]:
    """The errors of ``exc`` in pydantic's order (at most ``limit``)."""
    found = exc.errors(include_url=False)
    return [_problem(error) for error in (found if limit is None else found[:limit])]


def first_problem(exc: ValidationError) -> Problem:
    """The first error of ``exc``, the one a one-line message names."""
    return _problem(exc.errors(include_url=False)[0])


def _problem(error: Mapping[str, Any]) -> Problem:
    location = tuple(error["loc"])
    return Problem(field=".".join(str(part) for part in location) or None, message=error["msg"],
                   kind=error["type"], location=location)
