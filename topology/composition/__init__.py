"""The composition root: the only place that wires ``node``, ``federation`` and ``semantic`` together.

:func:`build_node` builds a node for a deployment (:mod:`.build`: federation when the topology
names peers); :func:`attach_discovery` attaches semantic search and the router's semantic
fallback (:mod:`.discovery`).
"""

from .build import attach_federation, build_node
from .discovery import SemanticDiscovery, attach_discovery, documents_of, fetch_vectors, owner_id

__all__ = [
    "SemanticDiscovery",
    "attach_discovery",
    "attach_federation",
    "build_node",
    "documents_of",
    "fetch_vectors",
    "owner_id",
]
