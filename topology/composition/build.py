"""The composition root: builds a node and attaches what the deployment asks for.

The node's own parts come from :func:`node.parts.build_parts` (store, cache, router, duties,
keys, metrics ... wired to one another) and are handed to :class:`RegistryNode`. ``node`` runs
alone; with a topology that names other regions, :func:`build_node` attaches the
federation (``federation.Federation``: replica of the peers, Kafka publisher and consumer,
anti-entropy), and always semantic discovery (:mod:`topology.composition.discovery`:
``/v1/search`` and the router's semantic fallback), through the node's own hooks.
"""

from __future__ import annotations

from federation import Federation
from node.config import NodeConfig
from node.parts import build_parts
from node.service import RegistryNode

from ..spec import Topology
from .discovery import attach_discovery

__all__ = ["attach_federation", "build_node"]


def build_node(config: NodeConfig, *, secret: bytes, topology: Topology | None = None,
               bootstrap_servers: str | None = None) -> RegistryNode:
    """A node for ``config`` (not started; use it as an async context manager).

    With a ``topology`` listing peer regions, federation is attached; ``bootstrap_servers``
    overrides the topology's Kafka (raises TopologyError if neither names one).
    """
    node = RegistryNode(config, parts=build_parts(config, secret=secret))
    if topology is not None and len(topology.regions) > 1:
        attach_federation(node, topology, secret=secret, bootstrap_servers=bootstrap_servers)
    # After federation: discovery indexes the peers' agents through the remote catalog.
    peer_urls = {peer.name: peer.node_urls[0] for peer in topology.peers_of(node.region)} if topology else {}
    attach_discovery(node, semantic_enabled=config.semantic_enabled, model=config.semantic_model,
                     encoders=config.semantic_encoders, peer_urls=peer_urls, secret=secret)
    return node


def attach_federation(node: RegistryNode, topology: Topology, *, secret: bytes,
                      bootstrap_servers: str | None = None) -> Federation:
    """Attach cross-region replication for ``node``'s region (before ``node.start()``)."""
    config = topology.federation_config(node.region, bootstrap_servers=bootstrap_servers)
    if node.config.key_prefix != config.key_prefix:
        config = config.model_copy(update={"key_prefix": node.config.key_prefix})
    federation = Federation(config, store=node.store, secret=secret,
                            peer_ssl_context=node.config.client_ssl_context())  # peers' https: the node's ca_file
    federation.attach(node)
    return federation
