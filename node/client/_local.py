"""Which node a client on this machine talks to when nobody says: the cluster ``agent-reach up``
runs here, as it wrote it down in :data:`LOCAL_CLUSTER_FILE`.

``up`` writes the file (mode 0600) once its nodes answer and removes it when it stops; a file
whose ``pid`` no longer runs (``up`` was killed) is stale and read as absent. So after a plain
``make up`` — on the packaged ports, or on free ones when those were taken — the SDK and the
command line find the first region's node without ``$AGENT_REACH_URL``, and an explicit URL or
the variable still wins. The command line reads the same file without this module (which
imports pydantic): ``topology.cli.nodeurl``.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ._config import URL_ENV

__all__ = ["DEFAULT_NODE_URL", "LOCAL_CLUSTER_FILE", "LocalClusterFile", "default_node_url", "running_local_cluster"]

# Where `agent-reach up` and a standalone `agent-reach node` listen by default (topology/local.toml's first URL).
DEFAULT_NODE_URL = "http://127.0.0.1:7101"
LOCAL_CLUSTER_FILE = Path("~/.agent-reach/local.json")
_MAX_FILE_BYTES = 64 * 1024


class LocalClusterFile(BaseModel):
    """What ``agent-reach up`` says about the cluster it runs: its process, its nodes' URLs (the
    first region's first), where its secret comes from and an admin token signed with it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    pid: int = Field(gt=0, description="the `agent-reach up` process; the file is stale once it is gone")
    topology: str
    url: str = Field(description="the first region's node: where clients on this machine go by default")
    nodes: dict[str, str] = Field(description="every region's node URL, by region")
    secret: str = Field(description="where the cluster secret comes from (a file, or $AGENT_REACH_SECRET)")
    admin_token: str

    def running(self) -> bool:
        """Whether the ``up`` that wrote this still runs (a process of another user counts)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def running_local_cluster(path: Path | None = None) -> LocalClusterFile | None:
    """The cluster ``agent-reach up`` runs on this machine, or None: no file, a file that does not
    parse, or one whose ``up`` is gone. ``path`` defaults to :data:`LOCAL_CLUSTER_FILE`."""
    file = (path or LOCAL_CLUSTER_FILE).expanduser()
    try:
        with file.open("rb") as opened:
            raw = opened.read(_MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if len(raw) > _MAX_FILE_BYTES:
        return None
    try:
        cluster = LocalClusterFile.model_validate_json(raw)
    except ValidationError:
        return None
    return cluster if cluster.running() else None


def default_node_url() -> str:
    """The node a client talks to when it names none: ``$AGENT_REACH_URL``, else the first node of
    the cluster ``agent-reach up`` runs on this machine (:data:`LOCAL_CLUSTER_FILE`), else
    :data:`DEFAULT_NODE_URL`."""
    explicit = os.environ.get(URL_ENV, "").strip()
    if explicit:
        return explicit.rstrip("/")
    cluster = running_local_cluster()
    return (cluster.url if cluster is not None else DEFAULT_NODE_URL).rstrip("/")
