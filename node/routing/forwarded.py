"""Lookups of agents this region holds no record of: asked of the summary-only peers' nodes.

A region keeps full records only for its first ``replicate_depth`` peers; for the others it holds
summaries (:mod:`node.routing.spill`). Get by id and global search ask those peers' nodes through
the router's :class:`~node.routing.remote.PeerForwarder` — all of them at once, each within its
deadline — and answer from what came back: a peer that did not answer is named in the answer (a
404's message and ``details.unanswered``, a search's ``unanswered``), never a hang or a traceback.
A request that arrived forwarded (its token's ``fwd``) is answered from what this node holds: it is
never forwarded again, so a lookup costs at most one forward per summary-only peer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ..core import NodeError, NotFound, PeerUnreachable
from ..core.models import AgentRecord, Locality, SearchResponse, TokenClaims
from .router import Router

__all__ = ["SummaryOnlyLookups", "ask_summary_only"]

T = TypeVar("T")


async def ask_summary_only(regions: Sequence[str], asks: Sequence[Awaitable[T]]) -> tuple[dict[str, T], list[str]]:
    """Await every region's answer together: the answers by region, and the regions that did not
    answer in time (:class:`PeerUnreachable`). Other node errors count as no answer from a peer
    that did answer; anything else is re-raised."""
    answers = await asyncio.gather(*asks, return_exceptions=True)
    found: dict[str, T] = {}
    silent: list[str] = []
    for region, answer in zip(regions, answers):
        if isinstance(answer, PeerUnreachable):
            silent.append(region)
        elif isinstance(answer, NodeError):
            continue
        elif isinstance(answer, BaseException):
            raise answer
        else:
            found[region] = answer
    return found, silent


class SummaryOnlyLookups:
    """Get by id and global search of the summary-only peers, asked of their nodes.

    Reads the peers and the forwarder from ``router`` at each call (``router.remote`` and
    ``router.forwarder`` are attached by federation after the node is built; without them there
    are no summary-only peers). ``visible`` is the node's rule of which records a caller may see.
    """

    def __init__(self, router: Router, *, visible: Callable[[AgentRecord, TokenClaims], bool]) -> None:
        self.router = router
        self.visible = visible

    def regions(self, caller: TokenClaims) -> list[str]:
        """The peers this node holds summaries of but no records, to ask for ``caller`` (none without a
        forwarder, and none for a request that arrived forwarded)."""
        if self.router.forwarder is None or self.router.remote is None or caller.fwd is not None:
            return []
        return [peer.region for peer in self.router.remote.peers() if not peer.replicated]

    async def agent(self, agent_id: str, caller: TokenClaims) -> AgentRecord:
        """``agent_id`` asked of every summary-only peer's node at once, as ``caller``: a record
        ``caller`` may see; raises :class:`NotFound` naming the regions that did not answer."""
        regions, forwarder = self.regions(caller), self.router.forwarder
        found: dict[str, AgentRecord | None] = {}
        silent: list[str] = []
        if regions and forwarder is not None:
            found, silent = await ask_summary_only(
                regions, [forwarder.agent(region, agent_id, caller) for region in regions])
        for record in found.values():
            if record is not None and self.visible(record, caller):
                return record
        unanswered = f"; no answer from region {', '.join(silent)}" if silent else ""
        raise NotFound(f"no agent {agent_id} in region {self.router.region} or its peers{unanswered}",
                       field="agent_id", code="unknown_agent", details={"unanswered": silent} if silent else None)

    async def search(self, here: Awaitable[SearchResponse], query: str, *, k: int, routable_only: bool,
                     caller: TokenClaims) -> SearchResponse:
        """``here`` (this node's global search: its region and its replicas) and the same query asked
        of every summary-only peer's node at once, as ``caller`` (each peer applies its own
        ``allowed_callers``): the best ``k`` hits of all, by score, and the peers that did not answer.

        Scores come from each region's own index: the vector part is the same cosine everywhere, the
        lexical part weighs terms by each region's own statistics, so a merge by score is close to —
        not exactly — one index over every region.
        """
        regions, forwarder = self.regions(caller), self.router.forwarder
        if not regions or forwarder is None:
            return await here
        asks = [forwarder.search(region, query, k=k, routable_only=routable_only, caller=caller) for region in regions]
        response, (found, silent) = await asyncio.gather(here, ask_summary_only(regions, asks))
        hits = list(response.hits)
        for region, remote_hits in found.items():
            hits.extend(hit.model_copy(update={"locality": Locality.REMOTE})
                        for hit in remote_hits if hit.region == region)
        hits.sort(key=lambda hit: -hit.score)
        return response.model_copy(update={"hits": hits[:k], "unanswered": silent})
