"""The errors of ``topology``; every one is a :class:`TopologyError`, and its message says how to fix it::

    TopologyError              a topology file is missing, unreadable or invalid (topology.spec)
    ├── DataDirError           a data dir cannot be created or written, or is in use (topology.embedded.datadir)
    ├── EmbeddedServiceError   an embedded Redis or broker cannot be found, started or stopped (topology.embedded)
    └── LauncherError          a node or embedded service of a local cluster did not start (topology.launcher)
"""

from __future__ import annotations

__all__ = ["DataDirError", "EmbeddedServiceError", "LauncherError", "TopologyError"]


class TopologyError(Exception):
    """A topology file is missing, unreadable or invalid; the message names the file and field."""


class DataDirError(TopologyError):
    """A data directory cannot be created or written, or another process is using it."""


class EmbeddedServiceError(TopologyError):
    """An embedded Redis server or Kafka broker could not be found, started or stopped."""


class LauncherError(TopologyError):
    """A node or an embedded service of a local cluster could not be started."""
