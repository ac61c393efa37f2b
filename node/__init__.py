"""One regional registry node: models, Redis store, cache, router, probes, security, HTTP API, SDK.

Runs alone (single region, no Kafka, no torch); federation and semantic discovery attach
through :class:`RemoteCatalog` and :class:`Matcher` (see ``node.router``).
"""

from .config import NodeConfig
from .egress import EgressDenied, EgressPolicy
from .errors import (
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
from .models import (
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
from .quarantine import Quarantine
from .router import Decision, Matcher, PeerView, RemoteCatalog, Router, SemanticMatch
from .security import Signer, load_secret
from .service import RegistryNode
from .store import RegionStore

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
