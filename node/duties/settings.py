"""How the singleton duties run: the leader's lease, the sweeper's pace and self-preservation, the
prober's concurrency (:class:`DutySettings`; ``NodeConfig`` inherits them).

Self-preservation's floor, ``protect_min_agents``, is the view's setting (the cache and the
sweeper both apply it): :class:`~node.view.ViewSettings`.
"""

from __future__ import annotations

from pydantic import Field

from ..core import Settings
from .leader import DEFAULT_LEADER_TTL_MS
from .prober import DEFAULT_MAX_CONCURRENT_PROBES, DEFAULT_PROBE_HISTORY
from .sweeper import DEFAULT_MAX_EXPIRE_FRACTION, DEFAULT_PROTECTION_MAX_HOLD_MS, DEFAULT_SWEEP_INTERVAL_MS

__all__ = ["DutySettings"]


class DutySettings(Settings):
    """Settings of :class:`~node.duties.Leadership`, :class:`~node.duties.Sweeper` and
    :class:`~node.duties.Prober`."""

    leader_ttl_ms: int = Field(default=DEFAULT_LEADER_TTL_MS, ge=300,
                               description="Lease of the singleton duties (sweeper, prober, publisher, consumer); a "
                                           "dead leader is replaced within about this long.")
    sweep_interval_ms: int = Field(default=DEFAULT_SWEEP_INTERVAL_MS, ge=10,
                                   description="How often the leader expires passed leases.")
    max_expire_fraction: float = Field(default=DEFAULT_MAX_EXPIRE_FRACTION, gt=0, le=1,
                                       description="Self-preservation: a sweep that would expire more than this share "
                                                   "of the agents is held back.")
    protection_max_hold_ms: int = Field(default=DEFAULT_PROTECTION_MAX_HOLD_MS, ge=0,
                                        description="How long self-preservation may hold expiry back before sweeping "
                                                    "anyway.")
    max_concurrent_probes: int = Field(default=DEFAULT_MAX_CONCURRENT_PROBES, ge=1,
                                       description="Liveness/readiness probes in flight at once (leader).")
    probe_history: int = Field(default=DEFAULT_PROBE_HISTORY, ge=0, le=1_000,
                               description="Results the leader keeps of each probe, for GET /v1/agents/{agent_id}/probes "
                                           "and the console (0: none).")
