"""One regional registry node, in rooms: core, delivery, client (the agent SDK), store, view,
routing, trust, duties, http and ops; the node's service and configuration at the root.

Runs alone (single region, no Kafka, no torch); federation and semantic discovery attach
through :class:`RemoteCatalog` and :class:`Matcher` (see ``node.routing``). The agent SDK is the
package :mod:`node.client`.

The names below are loaded when first used (PEP 562, as aiohttp's ``__init__`` does), so
``from node.client import ReachClient`` does not pull in the server — Redis, Prometheus,
``aiohttp.web`` — with it; ``from node import RegistryNode`` works as ever.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import NodeConfig
    from .core import (
        BadRequest,
        Conflict,
        Forbidden,
        NoAgentAvailable,
        NodeError,
        NotFound,
        PayloadTooLarge,
        RateLimited,
        StoreUnavailable,
        Unauthorized,
        UnknownAgent,
        ValidationFailed,
    )
    from .core.models import (
        AgentRecord,
        Capability,
        ChangeEvent,
        Heartbeat,
        Load,
        Probe,
        Registration,
        RouteRequest,
        RouteTicket,
        Scope,
        Status,
        TokenRole,
    )
    from .routing import Decision, Matcher, PeerView, RemoteCatalog, Router, SemanticMatch, SemanticMatches
    from .service import RegistryNode
    from .store import Quarantine, RegionStore
    from .trust import EgressDenied, EgressPolicy, Signer, load_secret

__all__ = [
    "RegistryNode",
    "NodeConfig",
    "EgressPolicy",
    "EgressDenied",
    "Quarantine",
    "RegionStore",
    "Router",
    "Decision",
    "RemoteCatalog",
    "PeerView",
    "Matcher",
    "SemanticMatch",
    "SemanticMatches",
    "Signer",
    "load_secret",
    "Registration",
    "AgentRecord",
    "Capability",
    "Probe",
    "Load",
    "Heartbeat",
    "Status",
    "ChangeEvent",
    "RouteRequest",
    "RouteTicket",
    "Scope",
    "TokenRole",
    "NodeError",
    "BadRequest",
    "ValidationFailed",
    "PayloadTooLarge",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "UnknownAgent",
    "NoAgentAvailable",
    "Conflict",
    "RateLimited",
    "StoreUnavailable",
]

# Which module of this package defines each exported name (the imports above, for checkers).
_MODULES: dict[str, tuple[str, ...]] = {
    "service": ("RegistryNode",),
    "config": ("NodeConfig",),
    "trust": ("EgressPolicy", "EgressDenied", "Signer", "load_secret"),
    "store": ("Quarantine", "RegionStore"),
    "routing": ("Router", "Decision", "RemoteCatalog", "PeerView", "Matcher", "SemanticMatch", "SemanticMatches"),
    "core.models": ("Registration", "AgentRecord", "Capability", "Probe", "Load", "Heartbeat", "Status", "ChangeEvent",
                    "RouteRequest", "RouteTicket", "Scope", "TokenRole"),
    "core": ("NodeError", "BadRequest", "ValidationFailed", "PayloadTooLarge", "Unauthorized", "Forbidden",
             "NotFound", "UnknownAgent", "NoAgentAvailable", "Conflict", "RateLimited", "StoreUnavailable"),
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
