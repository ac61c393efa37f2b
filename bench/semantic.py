"""Semantic search benchmark: relevance on the eval sets, indexing throughput, query latency.

Run with the project's virtualenv from the repository root (as a module, so that ``import
semantic`` finds the package, not this file)::

    .venv/bin/python -m bench.semantic [--queries 400] [--sizes 1000,10000] [--model DIR]

Prints numbers only (no pass/fail): for each evaluation set (the landed tuning set and the two
blind ones, the Chinese one by slice) and each way of scoring (default, each level alone, a
blend), the vector, lexical and hybrid rankings' MRR, recall@1/@5, capability@1, and for the
default ranking the refusal shares at the suggested threshold. Query latency includes encoding the query (the vector
cache is bypassed for queries, so every query pays a forward pass) and is split into
encode vs rank (cosine over the matrix + BM25 + fusion + grouping).

``--model`` measures another sentence-transformers model (a directory, an installed package that
ships one, or a locally cached name; the node's ``[semantic] model``). The packaged weights and
thresholds were chosen for all-MiniLM-L6-v2, so for another model the blend weights
(``vector_weight`` x ``agent_vector_weight``) and the hybrid refusal threshold are chosen again,
on the tuning set alone, and the other sets report at those (the threshold as a node's
``semantic_threshold`` would apply it: to every result). The model's files on disk and the
process's resident memory before and after loading it are printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from semantic import (
    DEFAULT_AGENT_VECTOR_WEIGHT,
    DEFAULT_VECTOR_WEIGHT,
    SUGGESTED_MIN_SCORE_HYBRID,
    SUGGESTED_MIN_SCORE_LEXICAL,
    Document,
    Embedder,
    MemoryVectorCache,
    Ranking,
    SemanticSearch,
)
from semantic.embedder import model_location, packaged_model_path
from semantic.evaluation import (
    EvalMetrics,
    EvalSet,
    documents_for_agent,
    evaluate,
    index_eval_set,
    load_eval_set,
)

_ROOT = Path(__file__).resolve().parent.parent
_DATA = _ROOT / "tests" / "data"
EVAL_PATH = _DATA / "semantic_eval.json"
DEFAULT_SIZES = (1_000, 10_000)
DEFAULT_QUERIES = 400
WARMUP_QUERIES = 20
SEED = 20240601

_QUALIFIERS = (
    "optimised for high volume", "with an audit trail", "for regulated industries", "tuned for mobile apps",
    "with a human review step", "for small businesses", "in near real time", "as a nightly batch job",
    "for internal teams", "with per-tenant isolation", "for the retail sector", "for hospitals and clinics",
)
_SUFFIXES = ("lite", "pro", "eu", "us", "apac", "v2", "beta", "edge", "batch", "stream")


class _QueryBypassCache:
    """Memory cache that can be bypassed, so benchmark queries always pay for encoding."""

    def __init__(self) -> None:
        self.inner = MemoryVectorCache(max_entries=200_000)
        self.bypass = False

    async def get_many(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        return {} if self.bypass else await self.inner.get_many(keys)

    async def set_many(self, mapping: Mapping[str, np.ndarray]) -> None:
        if not self.bypass:
            await self.inner.set_many(mapping)


def synthesize_agents(eval_set: EvalSet, capability_count: int, *, seed: int = SEED) -> dict[str, list[Document]]:
    """Distractor agents whose capabilities remix the eval set's vocabulary (unique texts)."""
    rng = random.Random(seed)
    capabilities = [(agent, capability) for agent in eval_set.agents for capability in agent.capabilities]
    all_tags = sorted({tag for _, capability in capabilities for tag in capability.tags})
    agents: dict[str, list[Document]] = {}
    made = 0
    agent_number = 0
    while made < capability_count:
        agent_number += 1
        owner_id = f"synthetic.group{agent_number % 97}.agent_{agent_number}"
        count = min(rng.randint(1, 3), capability_count - made)
        base_agent = rng.choice(eval_set.agents)
        documents = [
            Document.for_description(
                owner_id=owner_id,
                title=f"{base_agent.display_name} {rng.choice(_SUFFIXES)} #{agent_number}",
                description=f"{base_agent.description} {rng.choice(_QUALIFIERS).capitalize()}.",
            )
        ]
        for _ in range(count):
            _, base = rng.choice(capabilities)
            _, other = rng.choice(capabilities)
            documents.append(
                Document.for_capability(
                    owner_id=owner_id,
                    name=f"{base.name}_{rng.choice(_SUFFIXES)}{made}",
                    description=f"{base.description} {rng.choice(_QUALIFIERS).capitalize()}, "
                    f"also handling {rng.choice(other.tags)} (variant {made}).",
                    tags=tuple(rng.sample(all_tags, 3)) + base.tags[:2],
                    examples=base.examples[:1] + other.examples[-1:],
                )
            )
            made += 1
        agents[owner_id] = documents
    return agents


def _percentile(values: list[float], percent: float) -> float:
    return float(np.percentile(np.asarray(values), percent))


@dataclass(frozen=True)
class EvalSuiteEntry:
    """One evaluation file and its named slices (0-based query index ranges, end excluded)."""

    name: str
    path: Path
    slices: tuple[tuple[str, int, int], ...] = ()


# The landed set tunes (weights, formats, thresholds); the blind and held-out sets only report.
EVAL_SUITE = (
    EvalSuiteEntry("landed (tuning)", _DATA / "semantic_eval.json"),
    EvalSuiteEntry("blind English", _DATA / "semantic_eval_blind.json"),
    # Written before issue 11's ranking changes and scored only after them: the check on choices
    # that looked at the blind set's misses (spelling correction).
    EvalSuiteEntry("held-out English", _DATA / "semantic_eval_heldout.json"),
    # Slices as the file's `about` gives them.
    EvalSuiteEntry("blind Chinese", _DATA / "semantic_eval_zh.json",
                   (("zh->zh", 0, 60), ("zh->en", 60, 83), ("en->zh", 83, 93), ("unanswerable", 93, 106))),
)

# Ways of forming an owner's score, each printed with its vector, lexical and hybrid rankings:
# the default, the default less one of its query-side steps or the example lift (which names the
# matched capability only), and each level alone in the cosine: the closest capability or example
# request, the agent vector (the coverage is the agent document's in all).
VARIANTS: dict[str, dict[str, object]] = {
    "default": {},
    "no spelling fix": {"correct_spelling": False},
    "no opening strip": {"strip_request_openings": False},
    "no example lift": {"example_weight": 0.0},
    "closest part only": {"agent_vector_weight": 0.0},
    "agent level only": {"agent_vector_weight": 1.0},
}
RANKINGS = (Ranking.VECTOR, Ranking.LEXICAL, Ranking.HYBRID)
LEXICAL_MODE = "lexical mode"  # semantic_enabled=False: what a node without torch serves


async def relevance(embedder: Embedder, suite: Sequence[EvalSuiteEntry] = EVAL_SUITE,
                    variants: Mapping[str, Mapping[str, object]] = VARIANTS,
                    *, hybrid_threshold: float | None = None,
                    ) -> dict[tuple[str, str, str, str], EvalMetrics]:
    """Print and return metrics keyed by (set, slice or "all", variant, ranking).

    ``hybrid_threshold``: hold every result of the hybrid ranking to this score for the refusal
    shares (as a node's ``semantic_threshold`` does); None: each result's suggested threshold."""
    table: dict[tuple[str, str, str, str], EvalMetrics] = {}
    for entry in suite:
        eval_set = load_eval_set(entry.path)
        print(f"\n== {entry.name}: {entry.path.relative_to(_ROOT)}: {len(eval_set.agents)} agents, "
              f"{len(eval_set.answerable)} answerable queries, {len(eval_set.unanswerable)} nobody can serve ==")
        runs: list[tuple[str, dict[str, object], tuple[Ranking, ...]]] = [
            (name, {"embedder": embedder, **settings}, RANKINGS) for name, settings in variants.items()]
        runs.append((LEXICAL_MODE, {"semantic_enabled": False}, (Ranking.LEXICAL,)))
        for name, settings, rankings in runs:
            async with SemanticSearch(**settings) as search:  # type: ignore[arg-type]
                await index_eval_set(search, eval_set)
                for ranking in rankings:
                    slices = [("all", 0, len(eval_set.queries)), *entry.slices]
                    for slice_name, start, stop in slices:
                        threshold = hybrid_threshold if ranking is Ranking.HYBRID else None
                        metrics = await evaluate(search, eval_set.queries[start:stop], ranking=ranking,
                                                 threshold=threshold)
                        table[(entry.name, slice_name, name, ranking.value)] = metrics
                        indent = "  " if slice_name == "all" else f"      [{slice_name}] "
                        print(f"{indent}{name:>22} {metrics.line().strip()}")
    return table


REFUSAL_CURVE = (0.16, 0.18, 0.19, 0.20, 0.205, 0.21, 0.22)
MAX_REFUSED = 0.05  # the share of answerable queries a threshold may refuse on the tuning set
THRESHOLD_STEP = 0.005


def _share(scores: Sequence[float], threshold: float, *, below: bool) -> float:
    return sum(1 for score in scores if (score < threshold) == below) / max(len(scores), 1)


def refusal_threshold(answerable: Sequence[float], unanswerable: Sequence[float], *,
                      max_refused: float = MAX_REFUSED, step: float = THRESHOLD_STEP) -> float:
    """The threshold (a multiple of ``step``) that routes the fewest ``unanswerable`` top scores
    while refusing at most ``max_refused`` of the ``answerable`` ones; the lowest such one."""
    best_threshold, best_routed = 0.0, float("inf")
    for multiple in range(round(1.0 / step) + 1):
        threshold = round(multiple * step, 6)
        if _share(answerable, threshold, below=True) > max_refused:
            break  # refusal only grows with the threshold
        routed = _share(unanswerable, threshold, below=False)
        if routed < best_routed:
            best_threshold, best_routed = threshold, routed
    return best_threshold


def print_thresholds(table: Mapping[tuple[str, str, str, str], EvalMetrics], *,
                     hybrid_threshold: float | None = None) -> None:
    """Top-hit scores of the default ranking: what the refusal thresholds were chosen from, and
    the trade-off of other hybrid thresholds (refused answerable / routed unanswerable).
    ``hybrid_threshold``: the one :func:`relevance` held every hybrid result to, if any."""
    held_to = (f"hybrid {SUGGESTED_MIN_SCORE_HYBRID}, lexical {SUGGESTED_MIN_SCORE_LEXICAL}" if hybrid_threshold is None
               else f"{hybrid_threshold} for every default-ranking result, lexical mode {SUGGESTED_MIN_SCORE_LEXICAL}")
    print(f"\n== refusal: thresholds {held_to} (chosen on the tuning set) ==")
    for (set_name, slice_name, variant, ranking), metrics in table.items():
        if slice_name != "all" or metrics.threshold is None or variant not in ("default", LEXICAL_MODE):
            continue
        answerable, nobody = metrics.answerable_top_scores, metrics.unanswerable_top_scores
        print(f"  {set_name:>16} {variant:>12}: top score of answerable p10={_percentile(answerable, 10):.3f} "
              f"median={statistics.median(answerable):.3f}; of unanswerable median={statistics.median(nobody):.3f} "
              f"max={max(nobody):.3f}; refused {metrics.refused_answerable:.3f} of answerable, routed "
              f"{metrics.routed_unanswerable:.3f} of unanswerable")
        if variant == "default":
            print("  " + " " * 16 + f" the threshold this set picks (fewest routed, <= {MAX_REFUSED:.0%} refused): "
                  f"{refusal_threshold(answerable, nobody):.3f}")
            print("  " + " " * 16 + " other thresholds (refused/routed): " + "  ".join(
                f"{threshold:.3f}: {_share(answerable, threshold, below=True):.3f}/"
                f"{_share(nobody, threshold, below=False):.3f}" for threshold in REFUSAL_CURVE))


# The grid another model's blend is chosen from, on the tuning set alone (the packaged model's
# values, 0.6 and 0.7, are in it).
VECTOR_WEIGHT_GRID = (0.5, 0.6, 0.7, 0.8, 0.9)
AGENT_VECTOR_WEIGHT_GRID = (0.5, 0.7, 0.9)


async def tune_for_model(embedder: Embedder) -> tuple[dict[str, object], float]:
    """Blend weights and hybrid refusal threshold for ``embedder``'s model, chosen on the tuning
    set alone: the grid point of highest hybrid MRR (ties: higher recall@5, then the packaged
    weights, then the grid's first), then the threshold :func:`refusal_threshold` picks from that
    point's top scores."""
    entry = EVAL_SUITE[0]
    tuning = load_eval_set(entry.path)
    print(f"\n== blend weights for {embedder.model_id}, chosen on {entry.name} (hybrid MRR / recall@5) ==")
    best: tuple[tuple[float, float, bool], dict[str, object], EvalMetrics] | None = None
    for vector_weight in VECTOR_WEIGHT_GRID:
        cells = []
        for agent_vector_weight in AGENT_VECTOR_WEIGHT_GRID:
            settings: dict[str, object] = {"vector_weight": vector_weight, "agent_vector_weight": agent_vector_weight}
            async with SemanticSearch(embedder=embedder, **settings) as search:  # type: ignore[arg-type]
                await index_eval_set(search, tuning)
                metrics = await evaluate(search, tuning.queries, ranking=Ranking.HYBRID)
            packaged = (vector_weight, agent_vector_weight) == (DEFAULT_VECTOR_WEIGHT, DEFAULT_AGENT_VECTOR_WEIGHT)
            key = (round(metrics.mrr, 6), round(metrics.recall_at_5, 6), packaged)
            if best is None or key > best[0]:
                best = (key, settings, metrics)
            cells.append(f"agent {agent_vector_weight}: {metrics.mrr:.3f} / {metrics.recall_at_5:.3f}")
        print(f"  vector {vector_weight}: " + "   ".join(cells))
    if best is None:
        raise ValueError("the weight grids are empty")
    _, settings, metrics = best
    threshold = refusal_threshold(metrics.answerable_top_scores, metrics.unanswerable_top_scores)
    print(f"  chosen: {settings}; hybrid refusal threshold {threshold:.3f} (fewest unanswerable routed with "
          f"at most {MAX_REFUSED:.0%} of the answerable refused)")
    return settings, threshold


def _resident_mb() -> float | None:
    """This process's resident memory (Linux ``VmRSS``), None where /proc is not there."""
    try:
        status = Path("/proc/self/status").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return None


def _files_mb(location: str) -> float | None:
    path = Path(location)
    if not path.is_dir():
        return None
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file()) / 1e6


def _memory_line(label: str, before_mb: float | None) -> str:
    now = _resident_mb()
    if now is None or before_mb is None:
        return f"  resident memory {label}: not measurable here"
    return f"  resident memory {label}: {now:.0f} MB (+{now - before_mb:.0f} MB over before the load)"


async def _latency(search: SemanticSearch, cache: _QueryBypassCache, queries: list[str], count: int) -> None:
    cache.bypass = True
    try:
        for index in range(WARMUP_QUERIES):
            await search.search(queries[index % len(queries)], k=10)
        totals, encodes, ranks = [], [], []
        for index in range(count):
            started = time.perf_counter()
            result = await search.search(queries[index % len(queries)], k=10)
            totals.append((time.perf_counter() - started) * 1000.0)
            encodes.append(result.timings.encode_ms)
            ranks.append(result.timings.rank_ms)
    finally:
        cache.bypass = False
    print(f"  query latency over {count} queries (k=10, query encode included, cache bypassed):")
    for label, values in (("total", totals), ("encode", encodes), ("rank", ranks)):
        print(f"    {label:>6}: p50={_percentile(values, 50):6.2f} ms  p99={_percentile(values, 99):6.2f} ms  "
              f"max={max(values):6.2f} ms")


async def main(sizes: Sequence[int], query_count: int, model: str | None = None) -> None:
    import sentence_transformers  # imported before the memory baseline, so the delta is the model's
    import torch

    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), {os.cpu_count()} CPUs")
    eval_set = load_eval_set(EVAL_PATH)
    cache = _QueryBypassCache()
    embedder = Embedder(model=model, cache=cache)
    location = str(packaged_model_path()) if model is None else model_location(model)
    files_mb = _files_mb(location)
    before_mb = _resident_mb()
    started = time.perf_counter()
    await embedder.load()
    print(f"model {embedder.model_id} (dimension {embedder.dimension}, sentence-transformers "
          f"{sentence_transformers.__version__}) loaded in {time.perf_counter() - started:.1f} s from {location}"
          + (f" ({files_mb:.0f} MB of files)" if files_mb is not None else "")
          + (", English only" if embedder.english_only else ""))
    print(_memory_line("after the load", before_mb))

    settings: dict[str, object] = {}
    hybrid_threshold: float | None = None
    if model is not None:
        settings, hybrid_threshold = await tune_for_model(embedder)
    variants = {name: {**settings, **variant} for name, variant in VARIANTS.items()}
    table = await relevance(embedder, variants=variants, hybrid_threshold=hybrid_threshold)
    print_thresholds(table, hybrid_threshold=hybrid_threshold)
    print(_memory_line("after the relevance runs", before_mb))

    queries = [query.query for query in eval_set.queries]
    largest = max(sizes)
    synthetic = synthesize_agents(eval_set, largest)
    for size in sorted(sizes, reverse=True):
        # The largest index is built first, on a cold cache (encode-bound); smaller ones reuse its
        # vectors (index-bound), which is what a restart with a warm Redis cache looks like.
        agents = {agent.agent_id: documents_for_agent(agent) for agent in eval_set.agents}
        remaining = size - sum(len(documents) - 1 for documents in agents.values())
        for owner_id, documents in synthetic.items():
            if remaining <= 0:
                break
            kept = [documents[0]] + documents[1 : 1 + remaining]
            agents[owner_id] = kept
            remaining -= len(kept) - 1
        capability_docs = sum(1 for documents in agents.values() for document in documents if document.capability)
        total_docs = sum(len(documents) for documents in agents.values())
        async with SemanticSearch(embedder=embedder, **settings) as search:  # type: ignore[arg-type]
            encoded_before = embedder.stats.texts_encoded
            started = time.perf_counter()
            await search.upsert_owners(agents)
            elapsed = time.perf_counter() - started
            encoded = embedder.stats.texts_encoded - encoded_before
            print(f"\n== {capability_docs} capabilities ({total_docs} documents incl. descriptions, "
                  f"{len(agents)} agents) ==")
            print(f"  indexing: {total_docs / elapsed:8.0f} docs/s  ({elapsed:.2f} s, {encoded} texts encoded, "
                  f"{total_docs - encoded} from cache)")
            started = time.perf_counter()
            await search.upsert_owners(agents)
            elapsed = time.perf_counter() - started
            print(f"  re-index, all vectors cached: {total_docs / elapsed:8.0f} docs/s ({elapsed:.2f} s)")
            await _latency(search, cache, queries, query_count)
            print(_memory_line(f"with {capability_docs} capabilities indexed", before_mb))
    await embedder.aclose()


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=DEFAULT_QUERIES, help="timed queries per index size")
    parser.add_argument("--sizes", default=",".join(str(size) for size in DEFAULT_SIZES),
                        help="comma-separated capability counts to index")
    parser.add_argument("--model", default=None,
                        help="another sentence-transformers model: a directory, an installed package that ships "
                             "one or a locally cached name (default: the packaged all-MiniLM-L6-v2)")
    arguments = parser.parse_args()
    arguments.sizes = [int(size) for size in arguments.sizes.split(",") if size]
    if arguments.queries < 1 or not arguments.sizes or min(arguments.sizes) < 1:
        parser.error("--queries and every --sizes entry must be >= 1")
    return arguments


if __name__ == "__main__":
    options = _parse()
    asyncio.run(main(options.sizes, min(options.queries, 100_000), options.model))
