"""The node's own spans, exported over OTLP/HTTP (OpenTelemetry) when ``otel_traces_endpoint`` is set.

What the node records (``node.core.tracing`` has the trace context and the names): a ``POST
/v1/send`` as ``invoke_agent {operation}`` (server side; each delivery attempt an event of it,
``delivery``), a ``POST /v1/resolve`` as ``resolve {capability}``, and each liveness/readiness
probe as ``probe {kind}``. Without the setting the node records nothing and passes the callers'
context on as it came. The exporter is OpenTelemetry's SDK and its OTLP/HTTP (protobuf) exporter,
the ``otel`` extra (``pip install 'agent-reach[otel]'``), imported only when the setting is set;
spans leave in batches every :data:`EXPORT_DELAY_MS` on the SDK's own thread, and closing the
node sends what is left.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

from pydantic import Field, field_validator

from ..core import NO_SPANS, Settings, Spans

__all__ = ["EXPORT_DELAY_MS", "NodeTracing", "TelemetrySettings"]

EXPORT_DELAY_MS = 1000
DEFAULT_SERVICE_NAME = "agent-reach-node"
_NEEDED = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter")


class TelemetrySettings(Settings):
    """Where the node's spans go (:class:`NodeTracing`)."""

    otel_traces_endpoint: str | None = Field(
        default=None, pattern=r"^https?://\S+$",
        description="OTLP/HTTP traces endpoint the node exports its spans to (send, resolve, probe), e.g. "
                    "http://127.0.0.1:4318/v1/traces; needs the otel extra. Unset: no spans (the W3C traceparent "
                    "is passed on all the same).")
    otel_service_name: str = Field(default=DEFAULT_SERVICE_NAME, min_length=1, max_length=200,
                                   description="service.name of the node's spans (the region and node id are "
                                               "resource attributes beside it).")

    @field_validator("otel_traces_endpoint")
    @classmethod
    def _exporter_installed(cls, endpoint: str | None) -> str | None:
        if endpoint is not None and not all(_installed(module) for module in _NEEDED):
            raise ValueError("exporting spans needs OpenTelemetry's SDK and OTLP/HTTP exporter: "
                             "pip install 'agent-reach[otel]'")
        return endpoint


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


class NodeTracing:
    """The node's :class:`~node.core.Spans` (``spans``): OpenTelemetry's, exporting to
    ``otel_traces_endpoint``, or :data:`~node.core.NO_SPANS` without it. ``aclose`` sends what is
    left (bounded by the exporter's timeout) and is idempotent."""

    def __init__(self, settings: TelemetrySettings, *, region: str, node_id: str) -> None:
        self.spans: Spans = NO_SPANS
        self._provider: Any = None
        if settings.otel_traces_endpoint is None:
            return
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({"service.name": settings.otel_service_name, "service.instance.id": node_id,
                                    "agent_reach.region": region})
        # The node's own provider, not the process's global one: a program that embeds a node
        # keeps its tracing as it set it up.
        self._provider = TracerProvider(resource=resource)
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otel_traces_endpoint),
                                                             schedule_delay_millis=EXPORT_DELAY_MS))
        self.spans = Spans(self._provider.get_tracer("agent-reach.node"))

    async def aclose(self) -> None:
        provider, self._provider = self._provider, None
        self.spans = NO_SPANS
        if provider is not None:
            await asyncio.to_thread(provider.shutdown)
