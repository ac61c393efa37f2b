"""The answer of a natural-language search (``GET /v1/search``). This module does no I/O."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .fields import AgentId, Region, Strict
from .routing import Locality, Scope


class SearchHit(Strict):
    """One agent found by a natural-language search, with why it matched."""

    agent_id: AgentId
    region: Region
    locality: Locality
    capability: str | None = Field(description="The capability that matched; null when the description did.")
    score: float = Field(description="The final (fused) score used for ranking and thresholds.")
    vector_score: float | None = Field(description="Cosine similarity; null in lexical mode.")
    lexical_score: float
    routable: bool
    display_name: str = ""


class SearchResponse(Strict):
    query: str
    mode: Literal["hybrid", "lexical"]
    scope: Scope
    hits: list[SearchHit]
    took_ms: float
    corrected_query: str | None = Field(default=None, description=(
        "What was ranked when spelling correction rewrote the query (a word one edit away from an indexed "
        "word, e.g. 'transalte' -> 'translate'); null when the query was ranked as given."))
    unanswered: list[Region] = Field(default_factory=list, description=(
        "Summary-only peer regions (asked by their nodes, not searched here) that did not answer in time: "
        "their agents may be missing from the hits."))
