"""What tracing adds to a request, off and on, next to what every request does anyway.

The node's request path gained, for OpenTelemetry: on ``POST /v1/send`` reading the
``traceparent`` (header, else the envelope's), carrying it in the envelope and the
``invoke_agent`` span; on ``POST /v1/resolve`` reading the header and the ``resolve`` span.
Without ``otel_traces_endpoint`` the spans are :data:`node.core.NO_SPANS`. This measures those
steps per request in this process — off, and on with OpenTelemetry's SDK exporting to nowhere
(a span processor that drops what it gets) — next to the baseline of parsing the same request's
body (an envelope, a route request), which each of those requests does before any routing.

    python -m bench.tracing [--rounds 200000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from node.core import NO_SPANS, TRACEPARENT, Envelope, SpanKind, Spans, TraceParent, carried, traceparent_of
from node.core.models import RouteRequest

PLAIN = {"Content-Type": "application/json"}  # nobody upstream traces: the common case
TRACED = {**PLAIN, TRACEPARENT: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
ENVELOPE_BODY = Envelope(operation="text.summarize", payload={"text": "The node calls the agent."}).to_json()
RESOLVE_BODY = b'{"capability": "translate.text", "version": "2"}'


def _per_call_us(function: Callable[[], object], rounds: int) -> float:
    for _ in range(min(rounds, 1000)):
        function()
    started = time.process_time()  # CPU time: another process's turn on a shared core is not counted
    for _ in range(rounds):
        function()
    return (time.process_time() - started) / rounds * 1e6


def _send_path(spans: Spans, envelope: Envelope, headers: dict[str, str]) -> Callable[[], object]:
    def step() -> object:
        carrying = carried(envelope, traceparent_of(envelope, headers))
        with spans.invoke_agent(carrying, kind=SpanKind.SERVER, parent=traceparent_of(carrying),
                                **{"agent_reach.region": "bench", "agent_reach.caller": "bench"}) as span:
            return carried(carrying, span.context)
    return step


def _resolve_path(spans: Spans, headers: dict[str, str]) -> Callable[[], object]:
    def step() -> object:
        context = TraceParent.parse(headers.get(TRACEPARENT))
        with spans.start("resolve translate.text", kind=SpanKind.SERVER, parent=context, trace_id=None,
                         attributes={"agent_reach.region": "bench", "agent_reach.caller": "bench"}) as span:
            return span
    return step


def _recording_spans() -> Spans:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    provider = TracerProvider()
    provider.add_span_processor(SpanProcessor())  # the base processor drops every span
    return Spans(provider.get_tracer("bench"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200_000)
    rounds = parser.parse_args().rounds
    envelope = Envelope.model_validate_json(ENVELOPE_BODY)
    baseline_send = _per_call_us(lambda: Envelope.model_validate_json(ENVELOPE_BODY), rounds)
    baseline_resolve = _per_call_us(lambda: RouteRequest.model_validate_json(RESOLVE_BODY), rounds)
    rows = [("send: parse the envelope (baseline)", baseline_send, baseline_send),
            ("send: off, no traceparent", _per_call_us(_send_path(NO_SPANS, envelope, PLAIN), rounds), baseline_send),
            ("send: off, a traceparent passed on", _per_call_us(_send_path(NO_SPANS, envelope, TRACED), rounds),
             baseline_send),
            ("resolve: parse the body (baseline)", baseline_resolve, baseline_resolve),
            ("resolve: off, no traceparent", _per_call_us(_resolve_path(NO_SPANS, PLAIN), rounds), baseline_resolve),
            ("resolve: off, a traceparent", _per_call_us(_resolve_path(NO_SPANS, TRACED), rounds), baseline_resolve)]
    try:
        recording = _recording_spans()
    except ImportError:
        print("(OpenTelemetry's SDK is not installed: the 'on' rows need the otel extra)")
    else:
        on_rounds = max(1, rounds // 10)
        rows += [("send: on (spans dropped)", _per_call_us(_send_path(recording, envelope, TRACED), on_rounds),
                  baseline_send),
                 ("resolve: on (spans dropped)", _per_call_us(_resolve_path(recording, TRACED), on_rounds),
                  baseline_resolve)]
    print(f"CPU per request, {rounds:,} rounds (on: a tenth of them), one process")
    for name, microseconds, baseline in rows:
        print(f"  {name:<38} {microseconds:7.2f} µs   {microseconds / baseline:5.2f} × its baseline")


if __name__ == "__main__":
    main()
