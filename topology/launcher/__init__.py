"""A whole topology on this machine (:class:`LocalCluster`, what ``agent-reach up`` runs) and the
supervision that restarts a child — a node process, an embedded Redis or broker — that dies on its own;
waiting for a node that is starting (:mod:`.startup`) and the lines it says meanwhile (:func:`phase_line`);
the file that tells clients on this machine where it runs (:func:`published_cluster`).
"""

from ..errors import LauncherError
from .cluster import (
    DEFAULT_NODE_DRAIN_TIMEOUT_MS,
    DEFAULT_NODE_STOP_TIMEOUT_S,
    TOPIC_KINDS,
    ClusterState,
    LocalCluster,
    NodeProcess,
    busy_node_port,
)
from .published import published_cluster
from .startup import DEFAULT_START_PROGRESS_INTERVAL_S, phase_line
from .supervisor import (
    DEFAULT_INITIAL_BACKOFF_S,
    DEFAULT_MAX_BACKOFF_S,
    DEFAULT_STABLE_AFTER_S,
    Child,
    RestartPolicy,
    ServiceChild,
    Supervisor,
    keep_alive,
)

__all__ = [
    "DEFAULT_INITIAL_BACKOFF_S",
    "DEFAULT_MAX_BACKOFF_S",
    "DEFAULT_NODE_DRAIN_TIMEOUT_MS",
    "DEFAULT_NODE_STOP_TIMEOUT_S",
    "DEFAULT_STABLE_AFTER_S",
    "DEFAULT_START_PROGRESS_INTERVAL_S",
    "TOPIC_KINDS",
    "Child",
    "ClusterState",
    "LauncherError",
    "LocalCluster",
    "NodeProcess",
    "RestartPolicy",
    "ServiceChild",
    "Supervisor",
    "busy_node_port",
    "keep_alive",
    "phase_line",
    "published_cluster",
]
