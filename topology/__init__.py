"""Topology files and the composition root: builds nodes with federation and semantic attached,
the ``agent-reach`` command line, the local cluster launcher and the embedded Redis/Kafka.

========================  =====================================================================
``topology.spec``         the topology file format (``local.toml`` is the packaged example)
``topology.errors``       ``TopologyError`` and the errors under it
``topology.composition``  the composition root (``build_node``) and semantic discovery glue
``topology.embedded``     embedded Redis and Kafka-protocol broker, their data dirs
``topology.launcher``     ``LocalCluster`` (what ``agent-reach up`` runs) and its supervisor
``topology.process``      child-process basics shared by the embedded servers and the launcher
``topology.cli``          the ``agent-reach`` command line, one module per subcommand
``topology.demo``         the demo agents ``agent-reach up --demo`` starts (SDK only)
========================  =====================================================================

Imports run one way: ``topology`` imports ``node``, ``federation`` and ``semantic``; nothing of
ours imports ``topology``.
"""

from .composition import attach_federation, build_node
from .embedded import EmbeddedKafka, EmbeddedRedis, EmbeddedServiceError
from .spec import Topology, TopologyError, load_topology

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
