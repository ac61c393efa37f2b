"""What one replica of a region does for all: leadership, the lease sweeper and the prober.
"""

from .leader import DEFAULT_LEADER_TTL_MS, LeaderLease, Leadership, new_node_id
from .prober import DEFAULT_MAX_CONCURRENT_PROBES, Prober
from .sweeper import DEFAULT_MAX_EXPIRE_FRACTION, DEFAULT_PROTECTION_MAX_HOLD_MS, DEFAULT_SWEEP_INTERVAL_MS, Sweeper

__all__ = [
    "DEFAULT_LEADER_TTL_MS",
    "DEFAULT_MAX_CONCURRENT_PROBES",
    "DEFAULT_MAX_EXPIRE_FRACTION",
    "DEFAULT_PROTECTION_MAX_HOLD_MS",
    "DEFAULT_SWEEP_INTERVAL_MS",
    "LeaderLease",
    "Leadership",
    "Prober",
    "Sweeper",
    "new_node_id",
]
