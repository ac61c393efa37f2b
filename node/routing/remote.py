"""What a node reads of the peer regions: the protocols the federation package fills.

``node`` runs alone; with federation attached, ``Router.remote`` holds a :class:`RemoteCatalog`
(``federation.PeerCatalog``). Everything the node calls on it is declared here, so the router,
the API (``GET /v1/regions``) and semantic discovery call it directly instead of probing for
optional methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from ..core.models import AgentRecord, RouteRequest, SearchHit, SummaryView, TokenClaims, TokenRole
from ..view import AgentIndex, ChangeListener

__all__ = ["PeerForwarder", "PeerView", "RemoteCatalog", "described_for"]


class PeerView(Protocol):
    """A peer region as the federation replica knows it."""

    region: str
    index: AgentIndex
    # False for a summary-only peer (beyond the replicate depth): ``index`` stays empty, its
    # lookups are forwarded to its node (:class:`PeerForwarder`) and routing goes by ``summary``.
    replicated: bool

    @property
    def stale(self) -> bool:
        """Nothing was heard from the peer for its ``stale_after_ms`` (or ever): route there last."""
        ...

    @property
    def summary(self) -> SummaryView | None:
        """The peer's latest per-capability summary, or None when none arrived within its
        ``stale_after_ms`` (then routing weighs its replicated records instead)."""
        ...


class PeerForwarder(Protocol):
    """Asks a peer region's node, as the caller, within a deadline (attached by the federation
    package as ``Router.forwarder``), with a token marked as forwarded (``TokenClaims.fwd``), so
    the peer applies its own checks to the caller and never forwards the request again. Every
    method raises :class:`node.core.errors.PeerUnreachable` when no node of the region answered in
    time, and for a caller whose request arrived forwarded (nothing is sent)."""

    async def agent(self, region: str, agent_id: str, caller: TokenClaims) -> AgentRecord | None:
        """The record as that region's node shows it to ``caller`` (None: it has no such agent)."""
        ...

    async def resolve(self, region: str, request: RouteRequest, caller: TokenClaims) -> dict[str, object]:
        """The route ticket that region's node issues for ``request`` with ``scope=local`` (so it
        cannot be forwarded again); raises :class:`node.core.errors.NoAgentAvailable` with its answer."""
        ...

    async def search(self, region: str, query: str, *, k: int, routable_only: bool,
                     caller: TokenClaims) -> list[SearchHit]:
        """That region's own hits for ``query`` (``scope=local`` there)."""
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


def described_for(peers: Sequence[Mapping[str, object]], caller: TokenClaims) -> list[Mapping[str, object]]:
    """``RemoteCatalog.describe()`` as ``caller`` may read it: a summary names every capability
    of its region, restricted agents' too, so only admins and peers see them by name."""
    if caller.role in (TokenRole.ADMIN, TokenRole.PEER):
        return list(peers)
    return [{**peer, "summary": {key: value for key, value in summary.items() if key != "capabilities"}}
            if isinstance(summary := peer.get("summary"), dict) else peer for peer in peers]
