"""What a proxied delivery's answer becomes for its caller (:mod:`node.http.proxy`): the result
envelope a callback carries, and how ``DeliveryFailed.details.attempts`` describes a failed attempt.

The target's answer is hostile input like any other: whatever it is, the caller gets a result.
An answer that is an envelope goes as it is (``reply_to_id`` set when it has none); any other
answer is wrapped in a response envelope, its decoded JSON the payload — or, when that JSON is
more than an envelope's payload may hold (nested deeper than 32 levels, a whole number beyond 64
bits such as ``1e300``), the answer's text.
"""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
from pydantic import ValidationError

from ..core import Envelope, EnvelopeType, looks_like_envelope
from ..core.models import TokenClaims, compat
from ..delivery import AttemptError
from ..store import Answer
from ..trust import EgressDenied

__all__ = ["described", "result_envelope"]


def described(agent_id: str, failure: AttemptError) -> dict[str, Any]:
    """How ``DeliveryFailed.details.attempts`` describes one failed attempt."""
    found: dict[str, Any] = {"agent_id": agent_id, "error": str(failure), "status": failure.status}
    if isinstance(failure.denied, EgressDenied):
        found["reason"] = failure.denied.code
        found["egress"] = {"address": failure.denied.address, "rule": failure.denied.rule}
    return found


def result_envelope(request: Envelope, caller: TokenClaims, answer: Answer) -> Envelope:
    """What goes to the callback: the target's response envelope, or its answer wrapped in one."""
    decoded: Any = answer.body
    if answer.content_type.startswith("application/json"):
        with contextlib.suppress(orjson.JSONDecodeError):
            decoded = orjson.loads(answer.body)
    if looks_like_envelope(decoded):
        with contextlib.suppress(ValidationError):
            response = compat.read_python(Envelope, decoded)
            if response.reply_to_id is None:
                response = response.model_copy(update={"reply_to_id": request.id})
            return response
    text = answer.body.decode(errors="replace")
    fields: dict[str, Any] = {
        "type": EnvelopeType.RESPONSE, "operation": request.operation, "trace_id": request.trace_id,
        "source_agent": answer.headers.get("X-Reach-Agent"), "target_agent": caller.sub, "reply_to_id": request.id,
        "hop_count": request.hop_count + 1, "expire_at_ms": request.expire_at_ms,
        "extensions": {"status": answer.status}}
    try:
        return Envelope(payload=text if isinstance(decoded, bytes) else decoded, **fields)
    except ValidationError:  # JSON no payload may hold: the answer as it came
        return Envelope(payload=text, **fields)
