"""What the SDK raises: its own error classes, and :func:`node_error` for the node's error answers.

The hierarchy is drawn in :mod:`node.client`'s docstring, the page SDK users read; a node error
with a known code or status becomes its :mod:`node.core.errors` class, any other a :class:`NodeRejected`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import (
    BadRequest,
    Conflict,
    EnvelopeExpired,
    Forbidden,
    HopLimitExceeded,
    NoAgentAvailable,
    NodeError,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    StoreUnavailable,
    Unauthorized,
    UnknownAgent,
    ValidationFailed,
)
from ..core.models import Outcome


class ClientError(NodeError):
    """Base of the errors only the SDK raises."""

    status = 500
    code = "client_error"


class NodeUnreachable(ClientError):
    """The registry node did not answer: check the URL, the network and that it runs."""

    status = 503
    code = "node_unreachable"


class NodeRejected(ClientError):
    """The node answered with an error status this SDK has no class for (see ``status``)."""

    def __init__(self, message: str, *, status: int, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.status = status


@dataclass(slots=True)
class Attempt:
    """One try of a call: which agent, and how it went."""

    agent_id: str
    endpoint: str
    outcome: Outcome
    latency_ms: float
    status: int | None = None
    error: str | None = None


class CallFailed(ClientError):
    """No attempt of a call succeeded; ``attempts`` lists each, with its error."""

    status = 502
    code = "call_failed"

    def __init__(self, message: str, *, attempts: list[Attempt], trace_id: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.attempts = attempts
        self.trace_id = trace_id


class CallRejected(CallFailed):
    """The target answered 4xx: the request itself is wrong, so it is not retried."""

    code = "call_rejected"

    def __init__(self, message: str, *, attempts: list[Attempt], trace_id: str, response_status: int,
                 body: Any, **kwargs: Any) -> None:
        super().__init__(message, attempts=attempts, trace_id=trace_id, **kwargs)
        self.response_status = response_status
        self.body = body


class CallTimeout(CallFailed):
    """The call's overall timeout (``request_timeout_ms``) passed."""

    status = 504
    code = "call_timeout"


_BY_CODE: dict[str, type[NodeError]] = {"unknown_agent": UnknownAgent, "no_agent_available": NoAgentAvailable,
                                         "hop_limit_exceeded": HopLimitExceeded, "envelope_expired": EnvelopeExpired}
_BY_STATUS: dict[int, type[NodeError]] = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
                                          409: Conflict, 413: PayloadTooLarge, 422: ValidationFailed,
                                          429: RateLimited, 503: StoreUnavailable}


def node_error(status: int, body: Any, *, what: str) -> NodeError:
    """The exception for a node's error answer (``{"error", "message", "field"}``)."""
    if not isinstance(body, dict):
        body = {"message": str(body)[:300]}
    code = str(body.get("error") or "")
    message = f"{what}: {body.get('message') or f'HTTP {status}'}"
    kwargs: dict[str, Any] = {"field": body.get("field"), "details": body.get("details"), "code": code or None}
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status)
    if cls is None:
        return NodeRejected(message, status=status, **kwargs)
    return cls(message, **kwargs)


__all__ = ["Attempt", "CallFailed", "CallRejected", "CallTimeout", "ClientError", "NodeRejected", "NodeUnreachable",
           "node_error"]
