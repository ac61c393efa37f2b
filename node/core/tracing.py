"""W3C Trace Context and OpenTelemetry spans, for the node, the SDK and the agent host.

A call's trace context travels as the W3C ``traceparent`` (``00-<trace id>-<span id>-<flags>``):
in the HTTP header of that name on every hop (caller → node, node → agent, caller → agent), and in
the envelope's ``extensions["traceparent"]`` (:data:`TRACEPARENT`), so that it survives hops
that are not one HTTP request (a callback delivery, an agent that calls on with
``envelope.child()``). The envelope's ``trace_id`` and the OpenTelemetry trace id are the same
32 hex digits: an envelope that names no ``trace_id`` takes the trace's (:func:`carried`), and
a span started for an envelope whose ``trace_id`` is 32 hex digits belongs to that trace.

:class:`Spans` starts spans when it holds an OpenTelemetry tracer and costs one attribute test
when it holds none (:data:`NO_SPANS`, a node without ``otel_traces_endpoint``): the context
passes through unchanged then, so the next hop still joins the caller's trace. The SDK and the
agent host take the application's tracer (:func:`application_spans`): spans when the program
set up an OpenTelemetry ``TracerProvider``, nothing otherwise — and ``opentelemetry`` is never
imported by this module unless the program imported it first.

Span names and attributes follow OpenTelemetry's GenAI agent conventions where they fit:
``invoke_agent {operation}``, ``gen_ai.operation.name``, ``gen_ai.agent.id``,
``gen_ai.conversation.id``; what is the reach layer's own is ``agent_reach.*``.
"""

from __future__ import annotations

import enum
import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any, NamedTuple

from .envelope import Envelope

__all__ = ["NO_SPANS", "TRACEPARENT", "Span", "SpanKind", "Spans", "TraceParent", "application_spans", "carried",
           "current_context", "invoke_agent_attributes", "traceparent_of"]

TRACEPARENT = "traceparent"
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_OTEL_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_SAMPLED = 1


class SpanKind(enum.Enum):
    """Who is on which side of a span (OpenTelemetry's kinds)."""

    INTERNAL = "INTERNAL"
    SERVER = "SERVER"
    CLIENT = "CLIENT"


class TraceParent(NamedTuple):  # a tuple: built on every traced request, and a frozen dataclass is slower to build
    """A W3C ``traceparent``, version 00."""

    trace_id: str
    span_id: str
    flags: int = _SAMPLED

    @classmethod
    def parse(cls, value: object) -> TraceParent | None:
        """The context ``value`` names, or None when it is not a valid version-00 ``traceparent``."""
        if not isinstance(value, str):
            return None
        match = _TRACEPARENT.match(value.strip())
        if match is None or match[1] == _ZERO_TRACE or match[2] == _ZERO_SPAN:
            return None
        return cls(match[1], match[2], int(match[3], 16))

    def header(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"


def traceparent_of(envelope: Envelope, headers: Mapping[str, str] | None = None) -> TraceParent | None:
    """The context a hop received: the ``traceparent`` header, else the envelope's extension."""
    if headers is not None:
        found = TraceParent.parse(headers.get(TRACEPARENT))
        if found is not None:
            return found
    return TraceParent.parse(envelope.extensions.get(TRACEPARENT))


def carried(envelope: Envelope, context: TraceParent | None) -> Envelope:
    """``envelope`` carrying ``context`` on to the next hop (its ``trace_id`` the trace's when it
    named none); ``envelope`` itself when there is no context or it carries this one already."""
    if context is None:
        return envelope
    header = context.header()
    update: dict[str, Any] = {}
    if envelope.extensions.get(TRACEPARENT) != header:
        update["extensions"] = {**envelope.extensions, TRACEPARENT: header}
    if "trace_id" not in envelope.model_fields_set and envelope.trace_id != context.trace_id:
        update["trace_id"] = context.trace_id
    return envelope.model_copy(update=update) if update else envelope


def invoke_agent_attributes(envelope: Envelope, **more: Any) -> dict[str, Any]:
    """The GenAI agent attributes of a span about ``envelope`` (and ``more``, None values left out)."""
    # The envelope's trace_id is the span's trace id; only one that cannot be (not 32 hex digits) is an attribute.
    foreign = None if _OTEL_TRACE_ID.match(envelope.trace_id) else envelope.trace_id
    attributes = {"gen_ai.operation.name": "invoke_agent", "agent_reach.trace_id": foreign,
                  "agent_reach.envelope_id": envelope.id, "agent_reach.operation": envelope.operation,
                  "gen_ai.agent.id": envelope.target_agent if envelope.target_agent and "*" not in
                  envelope.target_agent else None,
                  "gen_ai.conversation.id": envelope.extensions.get("conversation_id"), **more}
    return {name: value for name, value in attributes.items() if isinstance(value, (str, bool, int, float))}


class Span:
    """A span as its code sees it; this one, :data:`NO_SPANS`', records nothing and hands on the
    context it was given as its own (``context``: the parent of the next hop)."""

    __slots__ = ("context",)

    def __init__(self, context: TraceParent | None) -> None:
        self.context = context

    def __enter__(self) -> Span:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def set(self, name: str, value: Any) -> None:
        """An attribute (nothing here)."""

    def event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        """A timed event within the span (nothing here)."""

    def fail(self, description: str) -> None:
        """The span's status: error, with ``description`` (nothing here)."""


class _Recorded(Span):
    """An OpenTelemetry span; ``context`` is its own (the parent of the next hop)."""

    __slots__ = ("span",)

    def __init__(self, span: Any) -> None:
        own = span.get_span_context()
        super().__init__(TraceParent(f"{own.trace_id:032x}", f"{own.span_id:016x}", int(own.trace_flags)))
        self.span = span

    def set(self, name: str, value: Any) -> None:
        if value is not None:
            self.span.set_attribute(name, value)

    def event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        self.span.add_event(name, {k: v for k, v in (attributes or {}).items() if v is not None})

    def fail(self, description: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.span.set_status(Status(StatusCode.ERROR, description))


class Spans:
    """Starts spans on an OpenTelemetry tracer, or records nothing when ``tracer`` is None."""

    __slots__ = ("tracer",)

    def __init__(self, tracer: Any = None) -> None:
        self.tracer = tracer

    @property
    def recording(self) -> bool:
        return self.tracer is not None

    def start(self, name: str, *, kind: SpanKind, parent: TraceParent | None = None, trace_id: str | None = None,
              attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[Span]:
        """A span named ``name`` for the ``with`` block, current within it (a span started inside
        is its child). Its parent: ``parent``; else the current span when it is of ``trace_id``'s
        trace (or ``trace_id`` is not 32 hex digits); else ``trace_id``'s trace, as its root. An
        exception leaving the block marks the span failed and goes on. Without a tracer: nothing
        recorded, and ``parent`` handed on as the span's ``context``."""
        if self.tracer is None:
            return Span(parent)
        return self._recorded(name, kind, parent, trace_id, attributes)

    def invoke_agent(self, envelope: Envelope, *, kind: SpanKind, parent: TraceParent | None = None,
                     name: str | None = None, **attributes: Any) -> AbstractContextManager[Span]:
        """The ``invoke_agent {name or operation}`` span of a hop of ``envelope``, in its trace when it
        named one (:meth:`start`), with :func:`invoke_agent_attributes`."""
        if self.tracer is None:
            return Span(parent)
        return self._recorded(f"invoke_agent {name or envelope.operation or envelope.target_agent or 'agent'}", kind,
                              parent, envelope.trace_id if "trace_id" in envelope.model_fields_set else None,
                              invoke_agent_attributes(envelope, **attributes))

    @contextmanager
    def _recorded(self, name: str, kind: SpanKind, parent: TraceParent | None, trace_id: str | None,
                  attributes: Mapping[str, Any] | None) -> Iterator[Span]:
        from opentelemetry import trace

        context = _parent_context(trace, parent, trace_id)
        with self.tracer.start_as_current_span(name, context=context, kind=getattr(trace.SpanKind, kind.value),
                                               attributes=dict(attributes or {})) as span:
            yield _Recorded(span)


NO_SPANS = Spans()


def _parent_context(trace: Any, parent: TraceParent | None, trace_id: str | None) -> Any:
    """The OpenTelemetry context a new span starts in (None: the current one)."""
    if parent is None:
        current = trace.get_current_span().get_span_context()
        if trace_id is None or not _OTEL_TRACE_ID.match(trace_id) or trace_id == _ZERO_TRACE or (
                current.is_valid and f"{current.trace_id:032x}" == trace_id):
            return None
        # The envelope names a trace nobody started here: its spans join it as a remote context
        # (a span id of its own, which no exported span has: the trace's root is this span).
        parent = TraceParent(trace_id, os.urandom(8).hex())
    remote = trace.SpanContext(trace_id=int(parent.trace_id, 16), span_id=int(parent.span_id, 16), is_remote=True,
                               trace_flags=trace.TraceFlags(parent.flags))
    return trace.set_span_in_context(trace.NonRecordingSpan(remote))


def current_context() -> TraceParent | None:
    """The program's current OpenTelemetry span as a W3C context (None without one, or without
    ``opentelemetry`` imported): what the SDK's requests to the node carry."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    own = trace.get_current_span().get_span_context()
    if not own.is_valid:
        return None
    return TraceParent(f"{own.trace_id:032x}", f"{own.span_id:016x}", int(own.trace_flags))


def application_spans(instrumentation: str = "agent-reach") -> Spans:
    """Spans on the program's OpenTelemetry tracer provider, or :data:`NO_SPANS` when the program
    set none up (or never imported ``opentelemetry``): what the SDK and the agent host record with."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None or type(trace.get_tracer_provider()).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
        return NO_SPANS
    return Spans(trace.get_tracer(instrumentation))
