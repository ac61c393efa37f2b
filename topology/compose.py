"""The composition root: builds a node and attaches what the deployment asks for."""

from __future__ import annotations

from node.config import NodeConfig
from node.service import RegistryNode


def build_node(config: NodeConfig, *, secret: bytes) -> RegistryNode:
    """A node for ``config`` (not started; use it as an async context manager)."""
    return RegistryNode(config, secret=secret)
