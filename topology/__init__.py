"""Topology files and the composition root: builds nodes with federation and semantic attached,
the ``agent-reach`` command line, the local cluster launcher and the embedded Redis/Kafka.
"""

from .compose import attach_federation, build_node
from .embedded import EmbeddedKafka, EmbeddedRedis, EmbeddedServiceError
from .topology import Topology, TopologyError, load_topology

__all__ = [
    "Topology",
    "TopologyError",
    "load_topology",
    "build_node",
    "attach_federation",
    "EmbeddedRedis",
    "EmbeddedKafka",
    "EmbeddedServiceError",
]
