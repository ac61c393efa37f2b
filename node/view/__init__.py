"""Memory kept current with Redis: the region cache (snapshot, then the change stream), the stream
follower it and the federation replica share, the fan-out of changes to watchers, the agents whose
session dropped (suspect: ``SuspectList``), and their settings (``ViewSettings``).
"""

from .cache import DEFAULT_PRESERVE_MIN_AGENTS, AgentIndex, CacheState, RegionCache
from .follower import ChangeListener, FollowerState, StreamFollower
from .settings import ViewSettings
from .suspects import HTTP_HOLDER, SuspectList
from .watch import WatchHub

__all__ = [
    "DEFAULT_PRESERVE_MIN_AGENTS",
    "HTTP_HOLDER",
    "AgentIndex",
    "CacheState",
    "ChangeListener",
    "FollowerState",
    "RegionCache",
    "StreamFollower",
    "SuspectList",
    "ViewSettings",
    "WatchHub",
]
