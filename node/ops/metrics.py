"""Prometheus metrics of one node, on a registry of its own (several nodes may share a process).

Families the node updates as things happen (counters, histograms) and families read when
``/metrics`` is scraped: :meth:`NodeMetrics.gauge` (a level) and :meth:`NodeMetrics.counter_from`
(a running count kept by a component, exposed as a counter with ``_total``, never as a gauge).
The registry also carries the process collector (CPU, memory, file descriptors, start time), the
Python platform collector and the garbage collector's counts. Attachments (federation) add their
own collectors to :attr:`NodeMetrics.registry`.

Names follow Prometheus' conventions, checked by ``tests/ops/test_metrics.py`` with ``promtool check
metrics`` (or the same rules in Python where promtool is missing): counters end in ``_total``,
durations are ``_seconds``, every family has help text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["HTTP_LATENCY_BUCKETS_S", "NodeMetrics"]

_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# HTTP answers range from a cached resolve (well under a millisecond) to a proxied send that
# waits on an agent (seconds); a long /v1/watch stream lands in +Inf.
HTTP_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A lexical search takes about a millisecond, a hybrid one embeds the query first (tens of ms).
_SEARCH_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _ScrapeCounter(Collector):
    """One counter whose running count lives in a component (its stats), read at scrape time."""

    def __init__(self, name: str, documentation: str, labels: dict[str, str], function: Callable[[], float],
                 *, by: tuple[str, ...] = (), counts: Callable[[], dict[tuple[str, ...], int]] | None = None) -> None:
        self._name = name
        self._documentation = documentation
        self._labels = labels
        self._function = function
        self._by = by  # labels of its own, with counts() giving a count per their values
        self._counts = counts

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self._name, self._documentation, labels=[*self._labels, *self._by])

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        if self._counts is None:
            family.add_metric(list(self._labels.values()), self._function())
        else:
            for values, count in list(self._counts().items()):
                family.add_metric([*self._labels.values(), *values], count)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield self._family()  # the name, for the registry's duplicate check; nothing is read


_HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"})


class NodeMetrics:
    """Counters, gauges and histograms the node updates; ``render()`` is the /metrics body."""

    def __init__(self, region: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        labels = {"region": region}
        self.requests = Counter("agent_reach_http_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=self.registry).labels
        self.http_seconds = Histogram("agent_reach_http_request_duration_seconds",
                                      "HTTP request latency inside the node (until the answer's head), by route, "
                                      "method and status", ["route", "method", "status"],
                                      buckets=HTTP_LATENCY_BUCKETS_S, registry=self.registry).labels
        self.resolves = Counter("agent_reach_resolves", "Resolve outcomes",
                                ["result", "match", "locality"], registry=self.registry).labels
        self.resolve_seconds = Histogram("agent_reach_resolve_seconds", "Resolve latency inside the node",
                                         buckets=_LATENCY_BUCKETS_S, registry=self.registry)
        self.search_seconds = Histogram("agent_reach_search_duration_seconds",
                                        "Natural-language search latency (GET /v1/search), by mode",
                                        ["mode"], buckets=_SEARCH_BUCKETS_S, registry=self.registry).labels
        self.registrations = Counter("agent_reach_registrations", "Registrations accepted",
                                     registry=self.registry)
        self.heartbeats = Counter("agent_reach_heartbeats", "Heartbeats by effect",
                                  ["effect"], registry=self.registry).labels
        self.session_renewals = Counter("agent_reach_session_renewals",
                                        "Lease renewals over sessions (GET /v1/session) by effect; HTTP heartbeats "
                                        "are agent_reach_heartbeats", ["effect"], registry=self.registry).labels
        self.load_reports = Counter("agent_reach_load_reports", "Load reports accepted (PUT …/load)",
                                    registry=self.registry)
        self.deregistrations = Counter("agent_reach_deregistrations", "Deregistrations", registry=self.registry)
        self.reports = Counter("agent_reach_outcome_reports", "Outcome reports by outcome",
                               ["outcome"], registry=self.registry).labels
        self.proxy_sends = Counter("agent_reach_proxy_sends", "Proxy-mode sends by result",
                                   ["result"], registry=self.registry).labels
        self.auth_refusals = Counter("agent_reach_auth_refusals", "Requests refused 401, by error code",
                                     ["code"], registry=self.registry).labels
        self.gauges: dict[str, Gauge] = {}
        self._labels = labels
        self._children: dict[tuple[object, ...], object] = {}
        self._request_children: dict[tuple[str, str, int], tuple[object, object]] = {}

    def count(self, family, *labels: str) -> None:
        """Increment ``family`` (e.g. ``self.requests``) for ``labels``; children are cached.

        prometheus-client's ``labels()`` takes a lock and builds a key on every call, which
        shows on the resolve hot path.
        """
        self._child(family, labels).inc()

    def observe(self, family, value: float, *labels: str) -> None:
        """Observe ``value`` in the histogram ``family`` (e.g. ``self.http_seconds``) for ``labels``."""
        self._child(family, labels).observe(value)

    def request_done(self, route: str, method: str, status: int, elapsed_s: float) -> None:
        """One HTTP request answered: its count by route and status, its latency by route, method
        and status (both children found with one lookup: every request comes here). A method
        outside HTTP's own (the parser also passes WebDAV's and others) is counted as ``OTHER``."""
        if method not in _HTTP_METHODS:
            method = "OTHER"
        key = (route, method, status)
        children = self._request_children.get(key)
        if children is None:
            children = self._request_children[key] = (self.requests(route, str(status)),
                                                       self.http_seconds(route, method, str(status)))
        children[0].inc()
        children[1].observe(elapsed_s)

    def _child(self, family, labels: tuple[str, ...]):
        key = (id(family.__self__), *labels)  # family is a bound metric's .labels
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family(*labels)
        return child

    def gauge(self, name: str, documentation: str, function: Callable[[], float]) -> None:
        """A gauge read from ``function`` at scrape time (a level: agents, open breakers …)."""
        gauge = Gauge(name, documentation, list(self._labels), registry=self.registry).labels(**self._labels)
        gauge.set_function(function)
        self.gauges[name] = gauge

    def counter_from(self, name: str, documentation: str, function: Callable[[], float]) -> None:
        """A counter (exposed as ``{name}_total``) whose running count ``function`` returns at scrape time."""
        self.registry.register(_ScrapeCounter(name, documentation, self._labels, function))

    def counters_from(self, name: str, documentation: str, labels: tuple[str, ...],
                      counts: Callable[[], dict[tuple[str, ...], int]]) -> None:
        """Counters by ``labels`` whose running counts ``counts`` returns at scrape time (values → count)."""
        self.registry.register(_ScrapeCounter(name, documentation, self._labels, lambda: 0, by=labels, counts=counts))

    def render(self) -> bytes:
        return generate_latest(self.registry)
