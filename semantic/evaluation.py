"""Relevance evaluation: load a labelled set of agents and queries, measure MRR and recall@k.

Used by the tests and by ``bench/semantic.py`` so both report the same numbers. The file format
is ``tests/data/semantic_eval.json``: agents written as A2A-style skills, and queries labelled
with the agent (and capability) that should answer them; ``agent_id: null`` marks a query that
no agent can serve (used to look at absolute scores and refusal, excluded from MRR/recall).

Refusal: a router trusts a top hit only at or above a threshold, that of the ranking which scored
it (``SearchResult.suggested_threshold``: a mostly-Chinese query is ranked lexically in hybrid
mode). :func:`evaluate` reports, for the default ranking, the share of unanswerable queries that
would still be routed and the share of answerable ones refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from .documents import Document
from .search import Ranking, SearchMode, SemanticSearch

__all__ = [
    "EvalCapability",
    "EvalAgent",
    "EvalQuery",
    "EvalSet",
    "EvalMetrics",
    "load_eval_set",
    "documents_for_agent",
    "index_eval_set",
    "evaluate",
]

MRR_CUTOFF = 10


class EvalCapability(BaseModel):
    """One A2A-style skill of an agent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: str
    description: str
    tags: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()


class EvalAgent(BaseModel):
    """An agent as registered: id, display name, description, capabilities."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent_id: str = Field(pattern=r"^[a-z0-9_-]+\.[a-z0-9_-]+\.[a-z0-9_-]+$")
    display_name: str
    description: str
    capabilities: tuple[EvalCapability, ...]


class EvalQuery(BaseModel):
    """A plain-language request and the agent/capability that should answer it (None: nobody)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    query: str
    agent_id: str | None
    capability: str | None = None


class EvalSet(BaseModel):
    """Agents and labelled queries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    about: str = ""
    agents: tuple[EvalAgent, ...]
    queries: tuple[EvalQuery, ...]

    @property
    def answerable(self) -> list[EvalQuery]:
        return [query for query in self.queries if query.agent_id is not None]

    @property
    def unanswerable(self) -> list[EvalQuery]:
        return [query for query in self.queries if query.agent_id is None]


def load_eval_set(path: str | Path) -> EvalSet:
    """Parse and validate an evaluation file; labels must name agents/capabilities in it."""
    eval_set = EvalSet.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))
    capabilities = {agent.agent_id: {cap.name for cap in agent.capabilities} for agent in eval_set.agents}
    for query in eval_set.answerable:
        names = capabilities.get(query.agent_id or "")
        if names is None or (query.capability is not None and query.capability not in names):
            raise ValueError(f"query {query.query!r} is labelled with unknown {query.agent_id}/{query.capability}")
    return eval_set


def documents_for_agent(agent: EvalAgent) -> list[Document]:
    """The documents a registry would index for ``agent``: its description and each capability."""
    documents = [
        Document.for_description(owner_id=agent.agent_id, title=agent.display_name, description=agent.description)
    ]
    documents.extend(
        Document.for_capability(
            owner_id=agent.agent_id,
            name=capability.name,
            description=capability.description,
            tags=capability.tags,
            examples=capability.examples,
        )
        for capability in agent.capabilities
    )
    return documents


async def index_eval_set(search: SemanticSearch, eval_set: EvalSet) -> None:
    """Upsert every agent of ``eval_set`` into ``search``."""
    await search.upsert_owners({agent.agent_id: documents_for_agent(agent) for agent in eval_set.agents})


@dataclass
class EvalMetrics:
    """Owner-level ranking quality over the answerable queries."""

    ranking: str
    queries: int
    mrr: float
    recall_at_1: float
    recall_at_5: float
    capability_at_1: float  # top hit is the right agent AND its matched capability is the labelled one
    misses: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (query, expected, top 3)
    correct_top_scores: list[float] = field(default_factory=list)
    answerable_top_scores: list[float] = field(default_factory=list)  # 0.0 when nothing was found
    unanswerable_top_scores: list[float] = field(default_factory=list)  # 0.0 when nothing was found
    threshold: float | None = None  # the refusal threshold of the default ranking (None: no refusal measured)
    unanswerable: int = 0
    # The threshold each top score above was held to (that of the ranking which scored the query).
    answerable_thresholds: list[float] = field(default_factory=list)
    unanswerable_thresholds: list[float] = field(default_factory=list)

    @property
    def routed_unanswerable(self) -> float | None:
        """Share of unanswerable queries whose top hit reaches the threshold (would be routed)."""
        if self.threshold is None or not self.unanswerable_top_scores:
            return None
        pairs = zip(self.unanswerable_top_scores, self.unanswerable_thresholds, strict=True)
        return sum(1 for score, threshold in pairs if score >= threshold) / len(self.unanswerable_top_scores)

    @property
    def refused_answerable(self) -> float | None:
        """Share of answerable queries whose top hit stays below the threshold (would be refused)."""
        if self.threshold is None or not self.answerable_top_scores:
            return None
        pairs = zip(self.answerable_top_scores, self.answerable_thresholds, strict=True)
        return sum(1 for score, threshold in pairs if score < threshold) / len(self.answerable_top_scores)

    def line(self) -> str:
        text = (
            f"{self.ranking:>8}: MRR={self.mrr:.3f} recall@1={self.recall_at_1:.3f} "
            f"recall@5={self.recall_at_5:.3f} capability@1={self.capability_at_1:.3f} (n={self.queries})"
        )
        refused, routed = self.refused_answerable, self.routed_unanswerable
        if refused is not None:
            text += f" refused={refused:.3f}"
        if routed is not None:
            text += f" routed-unanswerable={routed:.3f} (n={self.unanswerable})"
        return text


async def evaluate(
    search: SemanticSearch,
    queries: Sequence[EvalQuery],
    *,
    ranking: Ranking | None = None,
    threshold: float | None = None,
) -> EvalMetrics:
    """Search every query and score the rank of its labelled agent (MRR cut off at 10).

    Refusal shares are taken at ``threshold``; by default, when the ranking is the mode's default
    (hybrid, or lexical in lexical mode), at each result's ``suggested_threshold`` (that of the
    ranking which scored it), since the suggested thresholds are calibrated for those scores
    only (no refusal for the diagnostic rankings).
    """
    reciprocal_ranks: list[float] = []
    at_1 = at_5 = capability_hits = 0
    default_ranking = Ranking.HYBRID if search.mode is SearchMode.HYBRID else Ranking.LEXICAL
    per_result = threshold is None and (ranking is None or Ranking(ranking) is default_ranking)
    if per_result:
        threshold = search.suggested_threshold
    metrics = EvalMetrics(ranking="", queries=0, mrr=0.0, recall_at_1=0.0, recall_at_5=0.0, capability_at_1=0.0,
                          threshold=threshold)
    chosen: Ranking | None = None
    for labelled in queries:
        result = await search.search(labelled.query, k=MRR_CUTOFF, ranking=ranking)
        chosen = result.ranking
        owners = [hit.owner_id for hit in result.hits]
        top_score = result.hits[0].score if result.hits else 0.0
        held_to = (result.suggested_threshold if per_result else threshold) or 0.0
        if labelled.agent_id is None:
            metrics.unanswerable += 1
            metrics.unanswerable_top_scores.append(top_score)
            metrics.unanswerable_thresholds.append(held_to)
            continue
        metrics.answerable_top_scores.append(top_score)
        metrics.answerable_thresholds.append(held_to)
        rank = owners.index(labelled.agent_id) + 1 if labelled.agent_id in owners else None
        reciprocal_ranks.append(1.0 / rank if rank else 0.0)
        if rank == 1:
            at_1 += 1
            metrics.correct_top_scores.append(result.hits[0].score)
            if labelled.capability is None or result.hits[0].capability == labelled.capability:
                capability_hits += 1
        else:
            metrics.misses.append((labelled.query, labelled.agent_id, owners[:3]))
        if rank is not None and rank <= 5:
            at_5 += 1
    count = len(reciprocal_ranks)
    # The requested ranking names the row (a hybrid search may rank an unreadable query lexically).
    metrics.ranking = (Ranking(ranking) if ranking is not None else chosen or Ranking.HYBRID).value
    metrics.queries = count
    if count:
        metrics.mrr = sum(reciprocal_ranks) / count
        metrics.recall_at_1 = at_1 / count
        metrics.recall_at_5 = at_5 / count
        metrics.capability_at_1 = capability_hits / count
    return metrics
