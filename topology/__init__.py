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

The names below are loaded when first used (PEP 562), so ``import topology.cli`` — which every
``agent-reach`` command does — runs neither the composition root nor federation with it.
(``node/__init__.py`` does the same for ``node``.)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .composition import attach_federation, build_node
    from .embedded import EmbeddedKafka, EmbeddedRedis, EmbeddedServiceError
    from .errors import TopologyError
    from .spec import Topology, load_topology

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

_MODULE_OF = {
    "Topology": "spec",
    "TopologyError": "errors",
    "load_topology": "spec",
    "build_node": "composition",
    "attach_federation": "composition",
    "EmbeddedRedis": "embedded",
    "EmbeddedKafka": "embedded",
    "EmbeddedServiceError": "embedded",
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULE_OF])
