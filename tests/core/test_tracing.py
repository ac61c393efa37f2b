"""The W3C trace context the hops share (``node.core.tracing``): what a ``traceparent`` may be, how
an envelope carries it and takes its trace id, and spans that cost nothing when nobody traces."""

from __future__ import annotations

import pytest

from node.core import NO_SPANS, TRACEPARENT, Envelope, SpanKind, TraceParent, carried, traceparent_of

pytestmark = pytest.mark.unit

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def test_a_traceparent_is_version_00_lower_hex_with_non_zero_ids() -> None:
    assert TraceParent.parse(f"00-{TRACE}-{SPAN}-01") == TraceParent(TRACE, SPAN, 1)
    assert TraceParent(TRACE, SPAN, 0).header() == f"00-{TRACE}-{SPAN}-00"
    for refused in (f"01-{TRACE}-{SPAN}-01", f"00-{TRACE.upper()}-{SPAN}-01", f"00-{'0' * 32}-{SPAN}-01",
                    f"00-{TRACE}-{'0' * 16}-01", f"00-{TRACE}-{SPAN}", "", None, 7):
        assert TraceParent.parse(refused) is None, refused


def test_the_header_wins_over_the_envelope_s_extension() -> None:
    other = TraceParent("a" * 32, "b" * 16)
    envelope = Envelope(operation="x", extensions={TRACEPARENT: other.header()})
    assert traceparent_of(envelope, {TRACEPARENT: f"00-{TRACE}-{SPAN}-01"}) == TraceParent(TRACE, SPAN, 1)
    assert traceparent_of(envelope, {TRACEPARENT: "garbage"}) == other
    assert traceparent_of(Envelope(operation="x")) is None


def test_an_envelope_naming_no_trace_takes_the_context_s_and_a_named_one_keeps_its_own() -> None:
    context = TraceParent(TRACE, SPAN)
    fresh = carried(Envelope(operation="x"), context)
    assert fresh.trace_id == TRACE and fresh.extensions[TRACEPARENT] == context.header()
    named = carried(Envelope(operation="x", trace_id="my-own-trace"), context)
    assert named.trace_id == "my-own-trace" and named.extensions[TRACEPARENT] == context.header()
    unchanged = Envelope(operation="x")
    assert carried(unchanged, None) is unchanged and carried(fresh, context) is fresh


def test_without_a_tracer_a_span_records_nothing_and_hands_on_its_parent() -> None:
    context = TraceParent(TRACE, SPAN)
    assert not NO_SPANS.recording
    with NO_SPANS.invoke_agent(Envelope(operation="x"), kind=SpanKind.SERVER, parent=context) as span:
        span.set("a", 1)
        span.event("delivery", {"b": 2})
        span.fail("why")
        assert span.context is context
    with NO_SPANS.start("resolve x", kind=SpanKind.SERVER) as span:
        assert span.context is None
