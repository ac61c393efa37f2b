"""Errors of a regional node.

Hierarchy::

    NodeError                     base; carries an HTTP status and a snake_case code
    ├── BadRequest                400 the request is malformed (bad JSON, bad query parameter)
    ├── ValidationFailed          422 the body parsed but a field is wrong
    │   ├── RequestLineTooLong    414 (node.server) the request line exceeds the server's limit
    │   └── HeaderFieldsTooLarge  431 (node.server) a header exceeds the server's limit
    ├── PayloadTooLarge           413 the body exceeds the node's limit
    ├── RequestTimeout            408 the request (head: node.server; body: here) came too slowly
    ├── Unauthorized              401 no token, or a forged or expired one
    ├── Forbidden                 403 a valid token that may not do this
    ├── NotFound                  404 unknown agent, route, ticket …
    │   ├── UnknownAgent          404 the agent has no lease here: register again
    │   └── NoAgentAvailable      404 the router found nobody; says why per stage
    ├── Conflict                  409 a concurrent change won; retry
    ├── RateLimited               429 too many requests from one caller
    ├── TooManyConnections        503 (node.server) the node's connection cap is reached
    ├── StoreUnavailable          503 Redis cannot be reached
    └── SearchUnavailable         503 no search is attached to this node
"""

from __future__ import annotations


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


class SearchUnavailable(NodeError):
    """No natural-language search is attached to this node."""

    status = 503
    code = "search_unavailable"
