"""Seeing the node run: Prometheus metrics, the event-loop watch and memory, the logs, and its spans
over OpenTelemetry (:mod:`.otel`).
"""

from .logs import ACCESS_LOGGER, FIELDS, LOG_FORMATS, access_line, formatter
from .loopwatch import FreezeOnGrowth, LoopWatch, collector_paused, freeze_long_lived, tune_gc
from .metrics import NodeMetrics
from .otel import NodeTracing, TelemetrySettings

__all__ = [
    "ACCESS_LOGGER",
    "FIELDS",
    "FreezeOnGrowth",
    "LOG_FORMATS",
    "LoopWatch",
    "NodeMetrics",
    "NodeTracing",
    "TelemetrySettings",
    "access_line",
    "collector_paused",
    "formatter",
    "freeze_long_lived",
    "tune_gc",
]
