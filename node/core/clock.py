"""The wall clock every record, lease, event and envelope is stamped with: ms since the epoch.

One definition, imported by the server (``node.store.now_ms``, the router's default clock) and
by the model modules the SDK loads (``node.core.envelope.epoch_ms``): both names are this function.
This module does no I/O.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the Unix epoch, read from the wall clock (``time.time_ns``)."""
    return time.time_ns() // 1_000_000


__all__ = ["now_ms"]
