"""``NodeParts``: the collaborators of one region's node, built together from its configuration.

:func:`build_parts` is the node's half of composition: it builds the store, cache, router,
duties, keys, revocation list, ACL rules, rate budgets, decision log, metrics, spans and watch
hub from a :class:`NodeConfig` and wires them to one another (the sweeper and prober as the leader's duties, the watch hub fed
by the cache, the gauges read from each part). What a deployment adds — federation, semantic
discovery — is attached by the composition root (``topology.composition.build_node``), which
calls this and hands the parts to :class:`~node.service.RegistryNode`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .config import NodeConfig
from .core import now_ms
from .core.models import compat
from .delivery import OutcomeTracker
from .duties import Leadership, Prober, Sweeper, new_node_id
from .ops import LoopWatch, NodeMetrics, NodeTracing
from .routing import DecisionLog, Router
from .store import RegionStore
from .trust import RateBudgets, RegionAcl, RegionKeys, RevocationList, Signer
from .view import RegionCache, WatchHub

__all__ = ["NodeParts", "build_parts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeParts:
    """What a :class:`~node.service.RegistryNode` serves with; the node starts and closes them."""

    node_id: str
    signer: Signer
    store: RegionStore
    cache: RegionCache
    outcomes: OutcomeTracker
    keys: RegionKeys
    router: Router
    leadership: Leadership
    sweeper: Sweeper
    prober: Prober
    watch: WatchHub
    metrics: NodeMetrics
    revocations: RevocationList
    acl: RegionAcl
    decisions: DecisionLog
    loop_watch: LoopWatch
    tracing: NodeTracing
    budgets: RateBudgets


def build_parts(config: NodeConfig, *, secret: bytes) -> NodeParts:
    """The parts of ``config``'s node, wired and not started (no I/O until the node starts);
    ``secret`` signs and verifies the region's tokens and tickets."""
    node_id = config.node_id or new_node_id()
    signer = Signer(secret)
    store = RegionStore.from_url(config.redis_url, region=config.region, key_prefix=config.key_prefix,
                                 change_stream_maxlen=config.change_stream_maxlen, connect=config)
    cache = RegionCache(store, lease_sync_interval_ms=config.lease_sync_interval_ms,
                        preserve_fraction=config.preserve_fraction, preserve_min_agents=config.protect_min_agents)
    outcomes = OutcomeTracker(failure_threshold=config.breaker_failures, window_ms=config.breaker_window_ms,
                              cooldown_ms=config.breaker_cooldown_ms)
    keys = RegionKeys.of(store, ticket_ttl_ms=config.ticket_ttl_ms,
                         key_file=Path(config.signing_key_file) if config.signing_key_file else None,
                         publish_interval_ms=config.key_publish_interval_ms, max_age_ms=config.signing_key_max_age_ms,
                         reuse_ms=config.credential_reuse_ms)
    router = Router(cache, signer, outcomes, ticket_ttl_ms=config.ticket_ttl_ms,
                    overprovisioning_factor=config.overprovisioning_factor,
                    semantic_threshold=config.semantic_threshold,
                    semantic_lexical_threshold=config.lexical_threshold, credentials=keys)
    acl = RegionAcl.of(store, poll_interval_ms=config.acl_poll_interval_ms)
    router.acl = acl
    leadership = Leadership.of(store, node_id=node_id, ttl_ms=config.leader_ttl_ms)
    sweeper = Sweeper(store, interval_ms=config.sweep_interval_ms, max_expire_fraction=config.max_expire_fraction,
                      protect_min_agents=config.protect_min_agents,
                      protection_max_hold_ms=config.protection_max_hold_ms)
    tracing = NodeTracing(config, region=config.region, node_id=node_id)
    prober = Prober(store, cache, max_concurrent=config.max_concurrent_probes, egress=config.egress, tls=config,
                    spans=tracing.spans, history=config.probe_history)
    leadership.add_duty("sweeper", sweeper.run)
    leadership.add_duty("prober", prober.run)
    watch = WatchHub(streams_per_caller=config.watch_streams_per_caller, write_timeout_ms=config.watch_write_timeout_ms)
    cache.subscribe(watch.publish)
    metrics = NodeMetrics(config.region)
    parts = NodeParts(
        node_id=node_id, signer=signer, store=store, cache=cache, outcomes=outcomes, keys=keys, router=router,
        leadership=leadership, sweeper=sweeper, prober=prober, watch=watch, metrics=metrics,
        revocations=RevocationList.of(store, poll_interval_ms=config.revocation_poll_interval_ms), acl=acl,
        decisions=DecisionLog(config.decision_log, region=config.region), loop_watch=LoopWatch(metrics.registry),
        tracing=tracing, budgets=RateBudgets.of(store, config))
    _register_gauges(parts)
    return parts


def _register_gauges(parts: NodeParts) -> None:
    gauge, counter = parts.metrics.gauge, parts.metrics.counter_from
    cache, store, sweeper = parts.cache, parts.store, parts.sweeper
    gauge("agent_reach_agents", "Agents registered in this region (cache)", lambda: len(cache.index))
    gauge("agent_reach_region_version", "Region version this node's cache is at", lambda: cache.index.version)
    gauge("agent_reach_leader", "1 if this replica holds the singleton duties", lambda: int(parts.leadership.is_leader))
    counter("agent_reach_sweeper_held_back", "Sweeps held back by self-preservation", lambda: sweeper.stats.held_back)
    counter("agent_reach_leases_expired", "Leases expired by this node's sweeper (missed heartbeats)",
            lambda: sweeper.stats.expired)
    gauge("agent_reach_self_preservation", "1 while lazy lease expiry is suspended", lambda: int(cache.preserving))
    gauge("agent_reach_breakers_open", "Agents whose circuit breaker is open or half-open",
          lambda: parts.outcomes.open_count(now_ms=now_ms()))
    counter("agent_reach_probe_flips", "Probe verdict changes", lambda: parts.prober.flips)
    parts.metrics.counters_from("agent_reach_rate_limited", "Requests refused 429 by a rate budget, by the token's "
                                "role and the budget (caller: its own; capability: its routes by one capability)",
                                ("role", "budget"), lambda: parts.budgets.refused)
    counter("agent_reach_rate_budget_syncs", "Syncs of this process's rate budgets with the region's (Redis)",
            lambda: parts.budgets.syncs)
    counter("agent_reach_cache_reloads", "Snapshot reloads of the cache", lambda: cache.reloads)
    gauge("agent_reach_quarantined", "Stored records and events that do not parse, skipped (open entries)",
          lambda: len(store.quarantine))
    counter("agent_reach_quarantined_values", "Stored values quarantined since start", lambda: store.quarantine.total)
    counter("agent_reach_unknown_fields_dropped", "Fields a newer version wrote that this one dropped when reading "
            "(records, events, answers: node.core.models.compat; logged once per field)", compat.dropped_total)
    for kind, coalescer in store.write_batches.items():  # register: registrations; update: the rest
        counter(f"agent_reach_store_{kind}_scripts", f"{kind.upper()} scripts sent to Redis (coalesced writes)",
                lambda coalescer=coalescer: coalescer.batches)
        counter(f"agent_reach_store_{kind}_writes", f"Writes those {kind.upper()} scripts carried "
                "(divided by the scripts: the mean batch)", lambda coalescer=coalescer: coalescer.items)
