"""Calling an A2A agent in its own protocol: what :func:`~node.delivery.attempts.attempt` sends to
a target whose ticket names an A2A binding (``RouteTarget.binding``), and how it reads the answer.

* **JSONRPC**: one JSON-RPC 2.0 request to the interface URL — ``SendMessage`` with the header
  ``A2A-Version: <version>`` for A2A 1.x interfaces, ``message/send`` (the v0.3 method and
  message shape) for 0.x ones, as a2a-sdk's server speaks them. The answer's ``result`` (a
  ``SendMessageResponse``: ``{"task": …}`` or ``{"message": …}``) is the call's body. A
  JSON-RPC ``error`` — even in an HTTP 200 — fails the attempt (outcome ``failure``, reported to
  the node like any failure); an answer that is no JSON-RPC response fails it too.
* **HTTP+JSON**: ``POST {url}/message:send`` (``{url}/v1/message:send`` for 0.x) with the
  ``SendMessageRequest``; the answer's status means what it means for every target.
* **Anything else** (GRPC, a binding this SDK does not know) is refused before anything is sent:
  :class:`UnsupportedBinding` names the binding and the address to use an A2A client of that
  binding with.

The envelope's payload is the message's one part: a string a text part, anything else a data
part (v0.3: an object as it is, other values as ``{"value": …}``); its id is the message id,
and the envelope's trace id, id and operation travel in the message's metadata under
``agentReach``. The route credential goes as ``Authorization: Bearer``, as to every target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ..core import Envelope, NodeError
from ..core.models import RouteTarget

SPOKEN_BINDINGS = ("JSONRPC", "HTTP+JSON")
VERSION_HEADER = "A2A-Version"
A2A_JSON_TYPES = ("application/json", "application/a2a+json")  # the HTTP+JSON binding answers the second


class UnsupportedBinding(NodeError):
    """The target speaks an A2A binding this SDK does not (GRPC): call it with an A2A client of that binding."""

    status = 502
    code = "unsupported_binding"


@dataclass(frozen=True, slots=True)
class WireRequest:
    """What one attempt posts to an A2A target."""

    url: str
    body: bytes
    headers: dict[str, str]


def a2a_request(target: RouteTarget, envelope: Envelope) -> WireRequest | None:
    """The request for ``target`` in its A2A binding; None when the target is not A2A (the envelope goes).

    Raises :class:`UnsupportedBinding` for a binding this SDK does not speak.
    """
    binding = target.binding
    if binding is None:
        return None
    if binding not in SPOKEN_BINDINGS:
        raise UnsupportedBinding(
            f"agent {target.agent_id} speaks A2A over {binding} at {target.endpoint}; this SDK speaks "
            f"{' and '.join(SPOKEN_BINDINGS)}: call it with an A2A {binding} client (e.g. a2a-sdk's) at that "
            "address, with the ticket's credential as 'Authorization: Bearer'", field="binding")
    version = target.protocol_version or "1.0"
    legacy = version.startswith("0.")
    message = _message(envelope, legacy=legacy)
    headers = {} if legacy else {VERSION_HEADER: version}
    if binding == "JSONRPC":
        body = {"jsonrpc": "2.0", "id": envelope.id, "method": "message/send" if legacy else "SendMessage",
                "params": {"message": message}}
        return WireRequest(target.endpoint, orjson.dumps(body), headers)
    path = "/v1/message:send" if legacy else "/message:send"
    return WireRequest(target.endpoint.rstrip("/") + path, orjson.dumps({"message": message}), headers)


def jsonrpc_result(body: bytes) -> tuple[bytes | None, str | None]:
    """``(result as JSON, None)`` of a JSON-RPC answer, or ``(None, why it is a failure)``."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, "the JSON-RPC answer is not JSON"
    if not isinstance(answer, dict) or answer.get("jsonrpc") != "2.0":
        return None, "the answer is not a JSON-RPC 2.0 response"
    error = answer.get("error")
    if error is not None:
        code = error.get("code") if isinstance(error, dict) else None
        text = error.get("message") if isinstance(error, dict) else error
        return None, f"JSON-RPC error {code}: {str(text)[:300]}"
    if "result" not in answer:
        return None, "the JSON-RPC answer has neither result nor error"
    return orjson.dumps(answer["result"]), None


def _message(envelope: Envelope, *, legacy: bool) -> dict[str, Any]:
    payload = envelope.payload
    metadata = {"agentReach": {"traceId": envelope.trace_id, "envelopeId": envelope.id,
                               "operation": envelope.operation}}
    conversation = envelope.extensions.get("conversation_id")
    if legacy:
        if isinstance(payload, str):
            part: dict[str, Any] = {"kind": "text", "text": payload}
        else:
            part = {"kind": "data", "data": payload if isinstance(payload, dict) else {"value": payload}}
        message = {"kind": "message", "messageId": envelope.id, "role": "user", "parts": [part],
                   "metadata": metadata}
    else:
        part = {"text": payload} if isinstance(payload, str) else {"data": payload, "mediaType": "application/json"}
        message = {"messageId": envelope.id, "role": "ROLE_USER", "parts": [part], "metadata": metadata}
    if isinstance(conversation, str):
        message["contextId"] = conversation
    return message


__all__ = ["A2A_JSON_TYPES", "SPOKEN_BINDINGS", "VERSION_HEADER", "UnsupportedBinding", "WireRequest", "a2a_request",
           "jsonrpc_result"]
