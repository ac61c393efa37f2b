"""Prometheus families of the federation, read at scrape time from its components' state.

What ``GET /v1/federation/status`` says as JSON, as metrics on the node's registry (labels
``region``, and ``peer`` for what is per peer):

* per peer, on every replica: ``agent_reach_federation_peer_stale``, ``_beacon_age_seconds``,
  ``_capabilities_age_seconds`` (age of the peer's latest complete per-capability summary, by
  its clock; "summary" is a metric type, so it is not in the name),
  ``_versions_behind`` (the peer's last beacon watermark minus the version the replica read),
  ``_peer_agents``, ``_anti_entropy_runs_total``;
* per peer, on the leader (the consumer runs there): ``_consumer_lag_events`` (records on the
  peer's change topic not read yet) and ``_consumer_lag_seconds`` (0 when caught up, else how
  long ago the newest change read happened at the peer);
* the publisher, on the leader: ``_publisher_backlog_events`` (region versions not acknowledged
  by Kafka yet), ``_published_total``, ``_beacons_sent_total``, ``_tombstones_sent_total``,
  ``_publisher_failures_total``;
* the consumer and anti-entropy: ``_consumer_records_total``, ``_consumer_applied_total``,
  ``_records_skipped_total{reason}`` (invalid, newer_schema, tombstone), ``_gaps_total``,
  ``_beacon_mismatches_total``, ``_broker_data_losses_total``, ``_consumer_failures_total``,
  ``_anti_entropy_failures_total``.

Families of leader-only values have no sample on the other replicas (aggregate with ``max by``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from node.core import now_ms

from .publisher import PublisherState

if TYPE_CHECKING:
    from .service import Federation

__all__ = ["FederationCollector"]

_PEER = ["region", "peer"]
_REGION = ["region"]


class FederationCollector(Collector):
    """The federation's families; ``region_version`` is the node's current region version."""

    def __init__(self, federation: Federation, *, region_version: Callable[[], int]) -> None:
        self._federation = federation
        self._region_version = region_version

    def describe(self) -> Iterator[Metric]:
        return self._families(with_samples=False)

    def collect(self) -> Iterator[Metric]:
        return self._families(with_samples=True)

    def _families(self, *, with_samples: bool) -> Iterator[Metric]:
        families = [*self._peer_families(with_samples), *self._publisher_families(with_samples),
                    *self._consumer_families(with_samples)]
        yield from families

    def _peer_families(self, with_samples: bool) -> list[Metric]:
        federation = self._federation
        region, consumer, now = federation.config.region, federation.consumer, now_ms()
        stale = GaugeMetricFamily("agent_reach_federation_peer_stale", "1 while a peer region is stale (no beacon "
                                  "or change heard within stale_after_ms)", labels=_PEER)
        age = GaugeMetricFamily("agent_reach_federation_beacon_age_seconds", "Age of the peer's last beacon "
                                "(its send time, by its clock)", labels=_PEER)
        behind = GaugeMetricFamily("agent_reach_federation_versions_behind", "The peer's last beacon watermark "
                                   "minus the version this region's replica of it has read", labels=_PEER)
        agents = GaugeMetricFamily("agent_reach_federation_peer_agents", "Agents in the replica of a peer",
                                   labels=_PEER)
        runs = CounterMetricFamily("agent_reach_federation_anti_entropy_runs", "Anti-entropy reconciliations "
                                   "with a peer (snapshot pulls)", labels=_PEER)
        lag_events = GaugeMetricFamily("agent_reach_federation_consumer_lag_events", "Records on the peer's "
                                       "change topic not read yet (leader)", labels=_PEER)
        lag_seconds = GaugeMetricFamily("agent_reach_federation_consumer_lag_seconds", "0 when the replica of "
                                        "the peer is caught up, else how long ago the newest change read happened "
                                        "at the peer (leader)", labels=_PEER)
        summary_age = GaugeMetricFamily("agent_reach_federation_capabilities_age_seconds", "Age of the peer's latest "
                                        "complete summary (its send time, by its clock)", labels=_PEER)
        if with_samples:
            for replica in federation.catalog.peers():
                labels = [region, replica.region]
                if replica.latest_summary is not None:
                    summary_age.add_metric(labels, max(0, now - replica.latest_summary.sent_at_ms) / 1000)
                beacon = replica.beacon
                stale.add_metric(labels, float(replica.stale))
                agents.add_metric(labels, len(replica.index))
                runs.add_metric(labels, replica.anti_entropy_runs)
                versions = max(0, beacon.watermark - replica.seen_version) if beacon is not None else None
                if beacon is not None:
                    age.add_metric(labels, max(0, now - beacon.sent_at_ms) / 1000)
                    behind.add_metric(labels, versions)
                partition = consumer.change_partition.get(replica.region)
                highwater = consumer.highwaters.get(partition) if partition is not None else None
                if highwater is None:
                    continue  # not read by this replica (not the leader, or not yet)
                lag = max(0, highwater - consumer.next_offsets.get(partition, 0))
                lag_events.add_metric(labels, lag)
                newest = consumer.last_change_at_ms.get(replica.region)
                caught_up = lag == 0 and not versions
                lag_seconds.add_metric(labels, 0.0 if caught_up or newest is None else max(0, now - newest) / 1000)
        return [stale, age, summary_age, behind, agents, runs, lag_events, lag_seconds]

    def _publisher_families(self, with_samples: bool) -> list[Metric]:
        publisher, region = self._federation.publisher, [self._federation.config.region]
        stats = publisher.stats
        backlog = GaugeMetricFamily("agent_reach_federation_publisher_backlog_events", "Region versions not yet "
                                    "acknowledged by Kafka (leader)", labels=_REGION)
        counters = [
            ("agent_reach_federation_published", "Changes published to the region's change topic", stats.published),
            ("agent_reach_federation_beacons_sent", "Beacons published to the region's beacon topic", stats.beacons),
            ("agent_reach_federation_tombstones_sent", "Null-value tombstones published after deletions",
             stats.tombstones),
            ("agent_reach_federation_publisher_failures", "Publisher sessions that failed (Kafka or Redis)",
             stats.failures),
        ]
        families: list[Metric] = [backlog, *_region_counters(counters, region, with_samples)]
        if with_samples and publisher.state is not PublisherState.IDLE:
            backlog.add_metric(region, max(0, self._region_version() - stats.position))
        return families

    def _consumer_families(self, with_samples: bool) -> list[Metric]:
        federation, region = self._federation, [self._federation.config.region]
        stats = federation.consumer.stats
        counters = [
            ("agent_reach_federation_consumer_records", "Records read from peers' change topics", stats.records),
            ("agent_reach_federation_consumer_applied", "Peer changes applied to the replica", stats.applied),
            ("agent_reach_federation_gaps", "Version gaps seen on peers' change topics", stats.gaps),
            ("agent_reach_federation_beacon_mismatches", "Beacons that disagreed with the replica", stats.beacon_mismatches),
            ("agent_reach_federation_broker_data_losses", "Times a peer topic ended below the offset applied",
             stats.broker_data_losses),
            ("agent_reach_federation_consumer_failures", "Consumer sessions that failed (Kafka or Redis)",
             stats.failures),
            ("agent_reach_federation_anti_entropy_failures", "Anti-entropy runs that failed",
             federation.anti_entropy.stats.failures),
        ]
        families = _region_counters(counters, region, with_samples)
        skipped = CounterMetricFamily("agent_reach_federation_records_skipped", "Records of peers' topics skipped, "
                                      "by reason (invalid: quarantined; newer_schema: written by a newer node; "
                                      "tombstone: compaction markers)", labels=["region", "reason"])
        if with_samples:
            for reason, value in (("invalid", stats.invalid), ("newer_schema", stats.newer_schema),
                                  ("tombstone", stats.tombstones)):
                skipped.add_metric([*region, reason], value)
        families.append(skipped)
        return families


def _region_counters(counters: list[tuple[str, str, int]], region: list[str], with_samples: bool) -> list[Metric]:
    """One counter family per ``(name, documentation, value)``, labelled with the region."""
    families: list[Metric] = []
    for name, documentation, value in counters:
        family = CounterMetricFamily(name, documentation, labels=_REGION)
        if with_samples:
            family.add_metric(region, value)
        families.append(family)
    return families
