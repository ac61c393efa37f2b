"""What a node reads of the peer regions: the protocols the federation package fills.

``node`` runs alone; with federation attached, ``Router.remote`` holds a :class:`RemoteCatalog`
(``federation.PeerCatalog``). Everything the node calls on it is declared here, so the router,
the API (``GET /v1/regions``) and semantic discovery call it directly instead of probing for
optional methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from .cache import AgentIndex
from .follower import ChangeListener

__all__ = ["PeerView", "RemoteCatalog"]


class PeerView(Protocol):
    """A peer region as the federation replica knows it."""

    region: str
    index: AgentIndex

    @property
    def stale(self) -> bool:
        """Nothing was heard from the peer for its ``stale_after_ms`` (or ever): route there last."""
        ...


class RemoteCatalog(Protocol):
    """Peer regions, nearest first (attached by the federation package)."""

    def peers(self) -> Sequence[PeerView]:
        """Every peer region, nearest first; a stale peer stays in the list."""
        ...

    def describe(self) -> Sequence[Mapping[str, object]]:
        """One JSON-ready description per peer (freshness, lag, counts) for ``GET /v1/regions``."""
        ...

    def subscribe(self, listener: ChangeListener) -> Callable[[], None]:
        """Call ``listener`` synchronously for every applied remote change (it must be quick and
        must not block); returns the function that unsubscribes it."""
        ...
