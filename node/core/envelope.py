"""The message envelope every agent-to-agent message travels in.

Fields, each with one job::

    id             idempotency key: a receiver that sees the same id twice answers from its cache
    source_agent   who sent it (set by the node from the caller's token in proxy mode)
    target_agent   agent_id or pattern to deliver to; empty = route by ``operation`` as capability
    type           request | response | event | ack (unknown values from newer peers pass through)
    operation      what to do, e.g. ``translate.text`` (the capability name for routing)
    payload        business data; never parsed, validated or rewritten by the reach layer
    trace_id       one id per collaboration, copied into every message of it
    expire_at_ms   after this instant (ms since the epoch) nobody may act on it: no ghost messages
    hop_count      incremented by every forwarding hop; refused beyond the maximum (no A→B→A loops)
    reply_to_id    on a response/ack: the id of the message it answers
    idempotent     the sender declares the operation safe to execute twice (it may be retried)
    extensions     cross-cutting context (user_id, conversation_id, locale …), never the payload

``ack`` means "received", ``response`` means "done" (with the result), ``event`` is a
business-level push such as progress; do not mix them.

Errors (both raised by the proxy and by the SDK before a direct call)::

    ValidationFailed ── HopLimitExceeded   422 hop_count reached the maximum (default 5)
    NodeError ──────── EnvelopeExpired     410 expire_at_ms has passed

The second half holds the records of what happened to envelopes — route events and the trace
of one collaboration — and the region policy a client can read before it registers.
This module does no I/O.
"""

from __future__ import annotations

import enum
import os
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from .clock import now_ms as epoch_ms  # its name here: methods below take a now_ms parameter
from .errors import NodeError, ValidationFailed
from .models import MULTI_LINE_PATTERN, SINGLE_LINE_PATTERN, TRACE_ID_PATTERN, JsonValue, Millis, TokenClaims

DEFAULT_MAX_HOPS = 5
MAX_HOPS_CEILING = 64
# The node's signed hop count of a delivery (``node.http.proxy.hops``); an agent sends it back, unchanged,
# with the sends it makes while handling that delivery (the SDK does so by itself).
HOP_HEADER = "X-Reach-Hop"
ENVELOPE_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
TYPE_PATTERN = r"^[a-z][a-z0-9_.-]{0,31}$"

EnvelopeId = Annotated[str, Field(pattern=ENVELOPE_ID_PATTERN, examples=["msg_6f1c0e3b9d2a4c58"])]


def new_message_id() -> str:
    """A random 128-bit message id (``msg_`` + 32 hex digits)."""
    return "msg_" + os.urandom(16).hex()


def new_trace_id() -> str:
    """A random 128-bit trace id (32 hex digits)."""
    return os.urandom(16).hex()


class HopLimitExceeded(ValidationFailed):
    """The envelope already travelled the maximum number of hops: a loop, or a chain too long."""

    code = "hop_limit_exceeded"


class EnvelopeExpired(NodeError):
    """The envelope's ``expire_at_ms`` has passed: nobody may act on it any more."""

    status = 410
    code = "envelope_expired"


class EnvelopeType(str, enum.Enum):
    """The four message semantics the reach layer knows."""

    REQUEST = "request"
    RESPONSE = "response"
    EVENT = "event"
    ACK = "ack"


class Envelope(BaseModel):
    """One message; see the module docstring for what each field is for.

    ``type`` accepts values this version does not know (a newer peer's ``progress``) and keeps
    them as plain strings: the protocol layer passes unknown enum values through and leaves the
    decision to the business layer. ``payload`` and ``extensions`` are never interpreted.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    id: EnvelopeId = Field(default_factory=new_message_id)
    source_agent: str | None = Field(default=None, max_length=200, pattern=SINGLE_LINE_PATTERN)
    target_agent: str | None = Field(default=None, max_length=200, pattern=SINGLE_LINE_PATTERN)
    type: EnvelopeType | Annotated[str, Field(pattern=TYPE_PATTERN)] = EnvelopeType.REQUEST
    operation: str | None = Field(default=None, max_length=500, pattern=SINGLE_LINE_PATTERN)
    payload: JsonValue = None
    trace_id: Annotated[str, Field(pattern=TRACE_ID_PATTERN)] = Field(default_factory=new_trace_id)
    expire_at_ms: Millis | None = Field(default=None, description="ms since the epoch; None = never")
    hop_count: int = Field(default=0, ge=0, le=MAX_HOPS_CEILING)
    reply_to_id: EnvelopeId | None = None
    idempotent: bool = False
    extensions: dict[Annotated[str, Field(max_length=200)], JsonValue] = Field(default_factory=dict, max_length=64)

    @field_validator("type", mode="before")
    @classmethod
    def _known_type_as_enum(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return EnvelopeType(value)
            except ValueError:
                return value
        return value

    @property
    def known_type(self) -> EnvelopeType | None:
        """The type as an enum, or None for a value this version does not know."""
        return self.type if isinstance(self.type, EnvelopeType) else None

    def expired(self, *, now_ms: int | None = None) -> bool:
        return self.expire_at_ms is not None and self.expire_at_ms <= (epoch_ms() if now_ms is None else now_ms)

    def remaining_ms(self, *, now_ms: int | None = None) -> int | None:
        """Milliseconds until expiry (negative once expired); None when it never expires."""
        if self.expire_at_ms is None:
            return None
        return self.expire_at_ms - (epoch_ms() if now_ms is None else now_ms)

    def forwarded(self) -> Envelope:
        """The same message one hop further (same id, trace and expiry; hop_count + 1)."""
        return self.model_copy(update={"hop_count": self.hop_count + 1})

    def reply(self, payload: Any = None, *, type: EnvelopeType | str = EnvelopeType.RESPONSE) -> Envelope:
        """A response (or ack/event) to this message: same trace, swapped parties, reply_to_id set."""
        return Envelope(source_agent=self.target_agent, target_agent=self.source_agent, type=type,
                        operation=self.operation, payload=payload, trace_id=self.trace_id,
                        expire_at_ms=self.expire_at_ms, hop_count=self.hop_count, reply_to_id=self.id,
                        extensions=dict(self.extensions))

    def child(self, *, operation: str, payload: Any = None, target_agent: str | None = None,
              idempotent: bool = False, source_agent: str | None = None) -> Envelope:
        """A new request made while handling this one: same trace, expiry and hop count.

        Carrying ``hop_count`` over is what lets the reach layer stop an A→B→A loop.
        """
        return Envelope(source_agent=source_agent or self.target_agent, target_agent=target_agent,
                        type=EnvelopeType.REQUEST, operation=operation, payload=payload, trace_id=self.trace_id,
                        expire_at_ms=self.expire_at_ms, hop_count=self.hop_count, idempotent=idempotent,
                        extensions=dict(self.extensions))

    def to_json(self) -> bytes:
        return self.model_dump_json(exclude_none=False).encode()


class RouteEventKind(str, enum.Enum):
    """What a route event records."""

    DECISION = "decision"      # the router chose a target (and alternates)
    DELIVERY = "delivery"      # one attempt to hand the message to a target
    OUTCOME = "outcome"        # how the whole send ended
    DUPLICATE = "duplicate"    # a repeated envelope id answered from the idempotency cache
    REFUSED = "refused"        # refused before routing: hop limit, expiry …
    CALLBACK = "callback"      # one attempt to deliver an async result to the caller's callback_endpoint


class RouteEvent(BaseModel):
    """One structured event of a collaboration, kept per trace_id."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    event: RouteEventKind
    at_ms: Millis
    trace_id: Annotated[str, Field(pattern=TRACE_ID_PATTERN)]
    mode: Literal["proxy", "direct"] = "proxy"
    caller: str = Field(max_length=200, pattern=SINGLE_LINE_PATTERN,
                        description="The token subject that sent the message.")
    envelope_id: str | None = Field(default=None, max_length=128, pattern=SINGLE_LINE_PATTERN)
    agent_id: str | None = Field(default=None, max_length=200, pattern=SINGLE_LINE_PATTERN)
    region: str | None = Field(default=None, max_length=64, pattern=SINGLE_LINE_PATTERN)
    endpoint: str | None = Field(default=None, max_length=2_000, pattern=SINGLE_LINE_PATTERN)
    attempt: int | None = Field(default=None, ge=0, le=1_000)
    result: str | None = Field(default=None, max_length=64, pattern=SINGLE_LINE_PATTERN,
                               description="success, failure, timeout, rejected, hop_limit_exceeded …")
    status: int | None = Field(default=None, ge=0, le=999)
    latency_ms: float | None = Field(default=None, ge=0, le=1e12)
    detail: str | None = Field(default=None, max_length=1_000, pattern=MULTI_LINE_PATTERN)
    extensions: dict[Annotated[str, Field(max_length=200)], JsonValue] | None = Field(
        default=None, max_length=64, description="The envelope's extensions, secret-looking values kept to their "
                                                 "last 4 characters (node.trust.mask_secrets).")


class RouteEvents(BaseModel):
    """A batch of route events a client sends about its direct calls."""

    model_config = ConfigDict(extra="forbid")

    events: list[RouteEvent] = Field(min_length=1, max_length=500)


class TraceEvent(RouteEvent):
    """A route event as a trace shows it, with who recorded it (set by the node when read, never posted)."""

    recorded_by: Literal["node", "client"] | None = Field(
        default=None, description="node: the node's own record (a decision, delivery, outcome, duplicate, refusal "
                                  "or callback); client: what a caller posted about its direct calls "
                                  "(POST /v1/traces), under its own name; null: kept by an older version, "
                                  "which held both in one list.")


class Trace(BaseModel):
    """The route decisions, deliveries and outcomes of one collaboration, oldest first."""

    model_config = ConfigDict(extra="forbid")

    trace_id: str
    region: str
    count: int
    events: list[TraceEvent]


class TraceResult(BaseModel):
    """The final answer of a proxied delivery (sync, or the result a callback carried), kept for the
    trace's lifetime for the caller that sent it (``GET /v1/traces/{trace_id}/result``)."""

    model_config = ConfigDict(extra="forbid")

    trace_id: str
    envelope_id: str
    caller: str
    delivery: Literal["sync", "callback"]
    agent_id: str | None = None
    status: int = Field(ge=0, le=999, description="The target's status (sync), or the callback's result's (200; "
                                                  "502 for a delivery that failed)")
    content_type: str
    at_ms: Millis
    size_bytes: int = Field(ge=0, description="The answer's size as received")
    result: JsonValue = Field(default=None, description="The answer as JSON, when it is JSON a payload may hold")
    text: str | None = Field(default=None, description="The answer as text, when it is text but not such JSON")
    body_base64: str | None = Field(default=None, description="The answer's bytes, when they are not UTF-8")
    too_large: bool = Field(default=False, description="Larger than proxy.result_max_bytes: kept without its body")


class SendAccepted(BaseModel):
    """The answer to an asynchronous send: the result will go to the caller's callback_endpoint."""

    model_config = ConfigDict(extra="forbid")

    accepted: bool = True
    id: str
    trace_id: str
    duplicate: bool = False
    callback_endpoint: str


class Policy(BaseModel):
    """What a region requires of agents, and who the presented token says the caller is."""

    model_config = ConfigDict(extra="forbid")

    region: str
    allowed_transports: list[str] | None = Field(description="None = any transport.")
    max_body_bytes: int
    max_hops: int
    ticket_ttl_ms: int
    egress_allow: list[str] = Field(default_factory=list,
                                    description="Loopback/private ranges agents may register (public ones always).")
    egress_deny: list[str] = Field(default_factory=list, description="Ranges agents may never register.")
    refused_payload_keys: list[str] = Field(default_factory=list,
                                            description="Keys a proxied envelope's payload or extensions may not hold.")
    caller: TokenClaims


def looks_like_envelope(body: object) -> bool:
    """Whether a decoded JSON body is an envelope (has an id and a type) rather than raw data."""
    return isinstance(body, dict) and "id" in body and "type" in body and "trace_id" in body


PASSTHROUGH = "passthrough"  # the transport of legacy agents: the raw payload, no envelope

def raw_payload(payload: Any) -> tuple[bytes, str]:
    """What passthrough sends: text and bytes as they are, anything else as JSON."""
    if isinstance(payload, bytes):
        return payload, "application/octet-stream"
    if isinstance(payload, str):
        return payload.encode(), "text/plain; charset=utf-8"
    return orjson.dumps(payload), "application/json"


__all__ = ["PASSTHROUGH", "raw_payload", "DEFAULT_MAX_HOPS", "HOP_HEADER", "Envelope", "EnvelopeExpired", "EnvelopeType", "HopLimitExceeded", "Policy", "RouteEvent", "RouteEventKind", "RouteEvents",
           "SendAccepted", "Trace", "TraceEvent", "epoch_ms", "looks_like_envelope", "new_message_id", "new_trace_id"]
