"""Which node a client command talks to, decided the same way by every command.

``--node URL``, else ``$AGENT_REACH_URL``, else the first node of the cluster ``agent-reach up``
runs on this machine (the URLs it chose, free ports included, as it wrote them in
``~/.agent-reach/local.json``), else the local cluster's first node — the first node URL of the
packaged ``topology/local.toml`` (``http://127.0.0.1:7101``, us-east), which is where
``agent-reach up`` and a standalone ``agent-reach node`` listen by default. Commands that read an
agent TOML (``sidecar``, ``preflight``) take its ``[node] url`` after ``--node`` and before the
variable. The SDK decides the same way (``node.client.default_node_url``).

The packaged file's first URL is read from the file itself, not through :mod:`topology.spec`,
whose models import node's and federation's configuration, and ``up``'s file with the standard
library rather than its model (``node.client.LocalClusterFile``, pydantic): the operator commands
name the packaged URL in their ``--help`` and fall back to these, and must start without those.
"""

from __future__ import annotations

import argparse
import json
import os
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from .nodenames import URL_ENV

if TYPE_CHECKING:
    from node.client import AgentConfig

# topology.spec.DEFAULT_TOPOLOGY_FILE, which this module may not import (see above).
_PACKAGED_TOPOLOGY = Path(__file__).parents[1] / "local.toml"
LOCAL_CLUSTER_FILE = Path("~/.agent-reach/local.json")  # node.client.LOCAL_CLUSTER_FILE
_MAX_LOCAL_CLUSTER_FILE_BYTES = 64 * 1024  # the SDK's reader's bound too

__all__ = ["LOCAL_CLUSTER_FILE", "URL_ENV", "add_node_option", "default_node_url", "local_node_url", "node_url",
           "node_url_of", "running_cluster_url"]


@lru_cache(maxsize=1)
def local_node_url() -> str:
    """The first node URL of the packaged local topology (where ``up`` serves its first region)."""
    with _PACKAGED_TOPOLOGY.open("rb") as file:
        return str(tomllib.load(file)["regions"][0]["node_urls"][0]).rstrip("/")


def running_cluster_url(path: Path | None = None) -> str | None:
    """The first node of the cluster ``agent-reach up`` runs here, from its file; None when there
    is no file, it does not parse, or its ``up`` process is gone (what the SDK's reader says too)."""
    try:
        with (path or LOCAL_CLUSTER_FILE).expanduser().open("rb") as file:
            raw = file.read(_MAX_LOCAL_CLUSTER_FILE_BYTES + 1)
        written = json.loads(raw) if len(raw) <= _MAX_LOCAL_CLUSTER_FILE_BYTES else None
    except (OSError, ValueError):
        return None
    if not isinstance(written, dict):
        return None
    pid, url = written.get("pid"), written.get("url")
    if type(pid) is not int or pid <= 0 or not isinstance(url, str) or not url:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # another user's up: it runs
        pass
    return url.rstrip("/")


def default_node_url() -> str:
    """``$AGENT_REACH_URL``, else the running ``up``'s first node, else the packaged first node."""
    return (os.environ.get(URL_ENV, "").strip() or running_cluster_url() or local_node_url()).rstrip("/")


def add_node_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", metavar="URL", default=None,
                        help=f"the node's URL (default: ${URL_ENV}, else the cluster 'agent-reach up' runs here "
                             f"({LOCAL_CLUSTER_FILE}), else {local_node_url()})")


def node_url(flag: str | None) -> str:
    """``--node``, else ``$AGENT_REACH_URL``, else the running ``up``'s first node, else the packaged one."""
    return flag.rstrip("/") if flag else default_node_url()


def node_url_of(config: AgentConfig, flag: str | None) -> AgentConfig:
    """``config`` with its ``[node] url`` decided: ``--node``, the file's, then as :func:`default_node_url`."""
    from node.client import NodeSection  # here: the operator commands use this module without the SDK

    url = flag or config.node.url or default_node_url()
    node = NodeSection.model_validate({**config.node.model_dump(), "url": url})
    return config.model_copy(update={"node": node})
