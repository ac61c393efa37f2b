"""Natural-language search as the node sees it: a protocol the composition root fills.

The node never imports the ``semantic`` package; ``topology.composition.discovery`` implements
:class:`Searcher` (and the router's ``Matcher``) on top of it and attaches it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..core.models import AgentRecord, Scope, SearchResponse

DEFAULT_SEARCH_K = 10
MAX_SEARCH_K = 100


class Searcher(Protocol):
    """Finds agents (local and, with federation, remote) by a plain-language query."""

    async def search(self, query: str, *, k: int, scope: Scope, routable_only: bool,
                     visible: Callable[[AgentRecord], bool] | None = None) -> SearchResponse:
        """Up to ``k`` hits, best first, among the records ``visible`` admits (None: all)."""
        ...
