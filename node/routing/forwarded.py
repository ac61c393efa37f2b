"""Lookups of agents this region holds no record of: asked of the summary-only peers' nodes.

A region keeps full records only for its first ``replicate_depth`` peers; for the others it holds
summaries (``node.spill``). Get by id and global search ask those peers' nodes through the
attached :class:`~node.routing.remote.PeerForwarder` — all of them at once, each within its deadline — and
answer from what came back: a peer that did not answer is named in the answer (a 404's message
and ``details.unanswered``, a search's ``unanswered``), never a hang or a traceback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, TypeVar

from ..core import NodeError, NotFound, PeerUnreachable
from ..core.models import AgentRecord, Locality, SearchResponse, TokenClaims

if TYPE_CHECKING:
    from ..service import RegistryNode

__all__ = ["ask_summary_only", "lookup", "search", "summary_only_regions"]

T = TypeVar("T")


def summary_only_regions(node: RegistryNode) -> list[str]:
    """The peers this node holds summaries of but no records (none without a forwarder)."""
    if node.router.forwarder is None or node.router.remote is None:
        return []
    return [peer.region for peer in node.router.remote.peers() if not peer.replicated]


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


async def lookup(node: RegistryNode, agent_id: str, caller: TokenClaims) -> AgentRecord:
    """``node.get``, then the summary-only peers' nodes; raises :class:`NotFound` naming the
    regions that did not answer."""
    try:
        return node.get(agent_id, caller)
    except NotFound:
        regions = summary_only_regions(node)
        if not regions:
            raise
    forwarder = node.router.forwarder
    if forwarder is None:  # summary_only_regions is empty without one
        raise NotFound(f"no agent {agent_id}", field="agent_id", code="unknown_agent")
    found, silent = await ask_summary_only(regions, [forwarder.agent(region, agent_id, caller) for region in regions])
    for record in found.values():
        if record is not None and node.visible(record, caller):
            return record
    unanswered = f"; no answer from region {', '.join(silent)}" if silent else ""
    raise NotFound(f"no agent {agent_id} in region {node.region} or its peers{unanswered}", field="agent_id",
                   code="unknown_agent", details={"unanswered": silent} if silent else None)


async def search(node: RegistryNode, here: Awaitable[SearchResponse], query: str, *, k: int, routable_only: bool,
                 caller: TokenClaims) -> SearchResponse:
    """``here`` (this node's global search: its region and its replicas) and the same query asked
    of every summary-only peer's node at once, as ``caller`` (each peer applies its own
    ``allowed_callers``): the best ``k`` hits of all, by score, and the peers that did not answer.

    Scores come from each region's own index: the vector part is the same cosine everywhere, the
    lexical part weighs terms by each region's own statistics, so a merge by score is close to —
    not exactly — one index over every region.
    """
    regions = summary_only_regions(node)
    forwarder = node.router.forwarder
    if not regions or forwarder is None:
        return await here
    asks = [forwarder.search(region, query, k=k, routable_only=routable_only, caller=caller) for region in regions]
    response, (found, silent) = await asyncio.gather(here, ask_summary_only(regions, asks))
    hits = list(response.hits)
    for region, remote_hits in found.items():
        hits.extend(hit.model_copy(update={"locality": Locality.REMOTE}) for hit in remote_hits if hit.region == region)
    hits.sort(key=lambda hit: -hit.score)
    return response.model_copy(update={"hits": hits[:k], "unanswered": silent})
