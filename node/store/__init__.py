"""The region's truth in Redis: the key layout, one Lua script per mutation, write batching, the
wire, stored bytes read back, whole-region snapshots, quarantine, loads and the once-per-envelope
claims.
"""

from .compact import build, compact, holding, is_compact, share_load
from .loads import LoadFeed
from .once import Answer, DeliveryInProgress, OnceCache
from .quarantine import Quarantine
from .region import (
    DEFAULT_CHANGE_STREAM_MAXLEN,
    DEFAULT_KEY_PREFIX,
    HeartbeatResult,
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
    "LoadFeed",
    "OnceCache",
    "Quarantine",
    "RedisErrors",
    "RegionSnapshots",
    "RegionStore",
    "SnapshotData",
    "StoreSettings",
    "StoredVersions",
    "build",
    "compact",
    "holding",
    "is_compact",
    "read_record",
    "share_load",
    "stored_version",
]
