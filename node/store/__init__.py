"""The region's truth in Redis: how it is reached (a server, a cluster node, a Sentinel-managed
primary) and the wire, the key layout, one Lua script per mutation, write batching, stored bytes
read back, whole-region snapshots, quarantine, loads and the once-per-envelope claims.
"""

from .compact import build, compact, holding, is_compact, share_load
from .connect import RedisConnectSettings, RedisTarget, RedisUrlError, parse_redis_url, redis_client
from .loads import LoadFeed
from .once import Answer, DeliveryInProgress, OnceCache
from .quarantine import Quarantine
from .region import (
    DEFAULT_CHANGE_STREAM_MAXLEN,
    DEFAULT_KEY_PREFIX,
    HeartbeatResult,
    HeldChange,
    RedisErrors,
    RegionStore,
    StoreSettings,
    stored_version,
)
from .snapshots import RegionSnapshots, SnapshotData, StoredVersions
from .stored_records import read_record

__all__ = [
    "Answer",
    "DEFAULT_CHANGE_STREAM_MAXLEN",
    "DEFAULT_KEY_PREFIX",
    "DeliveryInProgress",
    "HeartbeatResult",
    "HeldChange",
    "LoadFeed",
    "OnceCache",
    "Quarantine",
    "RedisConnectSettings",
    "RedisErrors",
    "RedisTarget",
    "RedisUrlError",
    "RegionSnapshots",
    "RegionStore",
    "SnapshotData",
    "StoreSettings",
    "StoredVersions",
    "build",
    "compact",
    "holding",
    "is_compact",
    "parse_redis_url",
    "read_record",
    "redis_client",
    "share_load",
    "stored_version",
]
