"""Prometheus metrics of one node, on a registry of its own (several nodes may share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class NodeMetrics:
    """Counters, gauges and histograms the node updates; ``render()`` is the /metrics body."""

    def __init__(self, region: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"region": region}
        self.requests = Counter("agent_reach_http_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=self.registry).labels
        self.resolves = Counter("agent_reach_resolves", "Resolve outcomes",
                                ["result", "match", "locality"], registry=self.registry).labels
        self.resolve_seconds = Histogram("agent_reach_resolve_seconds", "Resolve latency inside the node",
                                         buckets=_LATENCY_BUCKETS_S, registry=self.registry)
        self.registrations = Counter("agent_reach_registrations", "Registrations accepted",
                                     registry=self.registry)
        self.heartbeats = Counter("agent_reach_heartbeats", "Heartbeats by effect",
                                  ["effect"], registry=self.registry).labels
        self.deregistrations = Counter("agent_reach_deregistrations", "Deregistrations", registry=self.registry)
        self.reports = Counter("agent_reach_outcome_reports", "Outcome reports by outcome",
                               ["outcome"], registry=self.registry).labels
        self.proxy_sends = Counter("agent_reach_proxy_sends", "Proxy-mode sends by result",
                                   ["result"], registry=self.registry).labels
        self.gauges: dict[str, Gauge] = {}
        self._labels = labels
        self._children: dict[tuple[str, ...], Counter] = {}

    def count(self, family, *labels: str) -> None:
        """Increment ``family`` (e.g. ``self.requests``) for ``labels``; children are cached.

        prometheus-client's ``labels()`` takes a lock and builds a key on every call, which
        shows on the resolve hot path.
        """
        key = (id(family.__self__), *labels)  # family is a bound Counter.labels
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family(*labels)
        child.inc()

    def gauge(self, name: str, documentation: str, function) -> None:  # function: Callable[[], float]
        """A gauge read from ``function`` at scrape time."""
        gauge = Gauge(name, documentation, list(self._labels), registry=self.registry).labels(**self._labels)
        gauge.set_function(function)
        self.gauges[name] = gauge

    def render(self) -> bytes:
        return generate_latest(self.registry)
