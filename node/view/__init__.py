"""Memory kept current with Redis: the region cache (snapshot, then the change stream), the stream
follower it and the federation replica share, and the fan-out of changes to watchers.
"""

from .cache import (
    DEFAULT_LEASE_SYNC_INTERVAL_MS,
    DEFAULT_PRESERVE_FRACTION,
    DEFAULT_PRESERVE_MIN_AGENTS,
    AgentIndex,
    CacheState,
    RegionCache,
)
from .follower import ChangeListener, FollowerState, StreamFollower
from .watch import DEFAULT_STREAMS_PER_CALLER, DEFAULT_WRITE_TIMEOUT_MS, WatchHub

__all__ = [
    "AgentIndex",
    "CacheState",
    "ChangeListener",
    "DEFAULT_LEASE_SYNC_INTERVAL_MS",
    "DEFAULT_PRESERVE_FRACTION",
    "DEFAULT_PRESERVE_MIN_AGENTS",
    "DEFAULT_STREAMS_PER_CALLER",
    "DEFAULT_WRITE_TIMEOUT_MS",
    "FollowerState",
    "RegionCache",
    "StreamFollower",
    "WatchHub",
]
