"""What a proxied delivery's answer becomes for its caller (:mod:`node.http.proxy`): the result
envelope a callback carries, the result kept by trace id (:func:`kept_result`, read back at
``GET /v1/traces/{trace_id}/result``), and how ``DeliveryFailed.details.attempts`` describes a
failed attempt.

The target's answer is hostile input like any other: whatever it is, the caller gets a result.
An answer that is an envelope goes as it is (``reply_to_id`` set when it has none); any other
answer is wrapped in a response envelope, its decoded JSON the payload — or, when that JSON is
more than an envelope's payload may hold (nested deeper than 32 levels, a whole number beyond 64
bits such as ``1e300``), the answer's text.
"""

from __future__ import annotations

import base64
import contextlib
from typing import Any, Literal

import orjson
from pydantic import ValidationError

from ...core import Envelope, EnvelopeType, TraceResult, looks_like_envelope, now_ms
from ...core.models import TokenClaims, check_json_value, compat
from ...delivery import AttemptError
from ...store import Answer
from ...trust import EgressDenied

__all__ = ["described", "kept_result", "result_envelope"]


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


def kept_result(request: Envelope, caller: TokenClaims, answer: Answer, *, delivery: Literal["sync", "callback"],
                max_bytes: int) -> TraceResult:
    """What the trace keeps of the answer to ``request`` for ``caller``: its JSON when it is JSON an
    envelope's payload may hold, else its text, else its bytes (base64); only its facts when it is
    larger than ``max_bytes``."""
    body = answer.body
    kept = TraceResult(trace_id=request.trace_id, envelope_id=request.id, caller=caller.sub, delivery=delivery,
                       agent_id=answer.headers.get("X-Reach-Agent"), status=answer.status,
                       content_type=answer.content_type, at_ms=now_ms(), size_bytes=len(body))
    if len(body) > max_bytes:
        return kept.model_copy(update={"too_large": True})
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return kept.model_copy(update={"body_base64": base64.b64encode(body).decode()})
    if answer.content_type.startswith("application/json"):
        with contextlib.suppress(orjson.JSONDecodeError, ValueError):
            return kept.model_copy(update={"result": check_json_value(orjson.loads(body))})
    return kept.model_copy(update={"text": text})
