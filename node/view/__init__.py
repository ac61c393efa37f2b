"""Memory kept current with Redis: the region cache (snapshot, then the change stream), the stream
follower it and the federation replica share, the fan-out of changes to watchers, and their
settings (``ViewSettings``).
"""

from .cache import DEFAULT_PRESERVE_MIN_AGENTS, AgentIndex, CacheState, RegionCache
from .follower import ChangeListener, FollowerState, StreamFollower
from .settings import ViewSettings
from .watch import WatchHub

__all__ = [
    "DEFAULT_PRESERVE_MIN_AGENTS",
    "AgentIndex",
    "CacheState",
    "ChangeListener",
    "FollowerState",
    "RegionCache",
    "StreamFollower",
    "ViewSettings",
    "WatchHub",
]
