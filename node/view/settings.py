"""What the view may cost and how current it stays: the cache's lease sync and self-preservation,
the watchers' limits (:class:`ViewSettings`; ``NodeConfig`` inherits them)."""

from __future__ import annotations

from pydantic import Field

from ..core import Settings
from .cache import DEFAULT_LEASE_SYNC_INTERVAL_MS, DEFAULT_PRESERVE_FRACTION, DEFAULT_PRESERVE_MIN_AGENTS
from .watch import DEFAULT_STREAMS_PER_CALLER, DEFAULT_WRITE_TIMEOUT_MS

__all__ = ["ViewSettings"]


class ViewSettings(Settings):
    """Settings of the region cache (:class:`~node.view.RegionCache`) and of the watch hub
    (:class:`~node.view.WatchHub`)."""

    protect_min_agents: int = Field(default=DEFAULT_PRESERVE_MIN_AGENTS, ge=1,
                                    description="Self-preservation applies only to regions with at least this many "
                                                "agents.")
    lease_sync_interval_ms: int = Field(default=DEFAULT_LEASE_SYNC_INTERVAL_MS, ge=10,
                                        description="How often each replica re-reads the leases about to end "
                                                    "(heartbeats through other replicas).")
    preserve_fraction: float = Field(default=DEFAULT_PRESERVE_FRACTION, gt=0, le=1,
                                     description="The cache suspends lazy expiry when more than this share of leases "
                                                 "pass at once.")
    watch_streams_per_caller: int = Field(default=DEFAULT_STREAMS_PER_CALLER, ge=1,
                                          description="Open /v1/watch streams one caller (token subject) may hold; "
                                                      "one more is answered 429 too_many_watches.")
    watch_write_timeout_ms: int = Field(default=DEFAULT_WRITE_TIMEOUT_MS, ge=1,
                                        description="A /v1/watch stream whose watcher takes no write within this "
                                                    "long (it stopped reading) is cut, its token's expiry or not.")
