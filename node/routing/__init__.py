"""Who gets a call: candidates, weights and breakers, spill to peers, the semantic fallback, remote
catalogs, forwarded lookups, listing selectors, the decision log and the search port.
"""

from .candidates import DEFAULT_CAPACITY, STATUS_FACTORS, capability_of, tagged
from .decisions import WITHHELD, DecisionLog
from .forwarded import SummaryOnlyLookups
from .listing import AgentQuery, reachable_transports
from .remote import described_for
from .router import (
    DEFAULT_OVERPROVISIONING_FACTOR,
    DEFAULT_TICKET_TTL_MS,
    Decision,
    Matcher,
    PeerView,
    RemoteCatalog,
    Router,
    SemanticMatch,
    SemanticMatches,
)
from .search import DEFAULT_SEARCH_K, MAX_SEARCH_K, Searcher
from .settings import RoutingSettings

__all__ = [
    "AgentQuery",
    "DEFAULT_CAPACITY",
    "DEFAULT_OVERPROVISIONING_FACTOR",
    "DEFAULT_SEARCH_K",
    "DEFAULT_TICKET_TTL_MS",
    "Decision",
    "DecisionLog",
    "MAX_SEARCH_K",
    "Matcher",
    "PeerView",
    "RemoteCatalog",
    "Router",
    "WITHHELD",
    "RoutingSettings",
    "STATUS_FACTORS",
    "Searcher",
    "SemanticMatch",
    "SemanticMatches",
    "SummaryOnlyLookups",
    "capability_of",
    "described_for",
    "reachable_transports",
    "tagged",
]
