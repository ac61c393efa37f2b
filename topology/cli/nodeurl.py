"""Which node a client command talks to, decided the same way by every command.

``--node URL``, else ``$AGENT_REACH_URL``, else the local cluster's first node — the first node
URL of the packaged ``topology/local.toml`` (``http://127.0.0.1:7101``, us-east), which is where
``agent-reach up`` and a standalone ``agent-reach node`` listen by default. Commands that read an
agent TOML (``sidecar``, ``preflight``) take its ``[node] url`` after ``--node`` and before the
variable.

The packaged file's first URL is read from the file itself, not through :mod:`topology.spec`,
whose models import node's and federation's configuration: the operator commands name it in
their ``--help`` and fall back to it, and must start without those.
"""

from __future__ import annotations

import argparse
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

__all__ = ["URL_ENV", "add_node_option", "local_node_url", "node_url", "node_url_of"]


@lru_cache(maxsize=1)
def local_node_url() -> str:
    """The first node URL of the packaged local topology (where ``up`` serves its first region)."""
    with _PACKAGED_TOPOLOGY.open("rb") as file:
        return str(tomllib.load(file)["regions"][0]["node_urls"][0]).rstrip("/")


def add_node_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", metavar="URL", default=None,
                        help=f"the node's URL (default: ${URL_ENV}, else the local cluster's first node, "
                             f"{local_node_url()})")


def node_url(flag: str | None) -> str:
    """``--node``, else ``$AGENT_REACH_URL``, else the local cluster's first node."""
    return (flag or os.environ.get(URL_ENV, "").strip() or local_node_url()).rstrip("/")


def node_url_of(config: AgentConfig, flag: str | None) -> AgentConfig:
    """``config`` with its ``[node] url`` decided: ``--node``, the file's, ``$AGENT_REACH_URL``, the local one."""
    from node.client import NodeSection  # here: the operator commands use this module without the SDK

    url = flag or config.node.url or os.environ.get(URL_ENV, "").strip() or local_node_url()
    node = NodeSection.model_validate({**config.node.model_dump(), "url": url})
    return config.model_copy(update={"node": node})
