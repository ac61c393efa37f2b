"""Semantic ranking on its own (no model, no servers): ``SemanticSearch`` with a small embedder
whose vectors are bags of concepts, so that meaning without shared words is controlled.

The real model's quality is measured in tests/semantic/test_search.py and bench/semantic.py; this checks
the ranking logic the model feeds: fusion of vector and lexical signals, one hit per agent,
filters, updates and removals, lexical mode.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from semantic import Document, Ranking, SearchMode, SemanticSearch

pytestmark = pytest.mark.unit

# Words that mean the same thing share a concept: the embedder's whole "knowledge".
CONCEPTS = {
    "translate": 0, "translation": 0, "render": 0, "convert": 0, "turn": 0,
    "english": 1, "chinese": 2, "mandarin": 2,
    "contract": 3, "agreement": 3, "document": 3, "clause": 3,
    "invoice": 4, "bill": 4, "receipt": 4,
    "total": 5, "amount": 5, "sum": 5,
    "image": 6, "picture": 6, "photo": 6, "similar": 7, "like": 7, "find": 7, "search": 7,
}
DIMENSION = 16


class ConceptEmbedder:
    """Texts -> unit vectors of the concepts their words name (unknown words spread thinly)."""

    dimension = DIMENSION
    model_id = "concepts"
    english_only = False

    def __init__(self) -> None:
        self.encoded = 0

    async def load(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def encode(self, texts: list[str], *, queries: bool = False) -> np.ndarray:
        self.encoded += len(texts)
        vectors = np.zeros((len(texts), DIMENSION), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"[a-z]+", text.lower()):
                concept = CONCEPTS.get(word)
                if concept is not None:
                    vectors[row, concept] += 1.0
                else:
                    vectors[row, 8 + hash(word) % 8] += 0.05
            norm = float(np.linalg.norm(vectors[row])) or 1.0
            vectors[row] /= norm
        return vectors


AGENTS = {
    "eu/lang.translate.zh_en": [Document.for_capability(owner_id="eu/lang.translate.zh_en", name="translate.text",
                                                        description="Translate Chinese text into English")],
    "eu/fin.invoice.reader": [Document.for_capability(owner_id="eu/fin.invoice.reader", name="invoice.extract",
                                                      description="Read the total amount of an invoice")],
    "eu/img.search.sim": [Document.for_capability(owner_id="eu/img.search.sim", name="image.search",
                                                  description="Find similar images")],
}


async def _search(*, semantic: bool = True) -> tuple[SemanticSearch, ConceptEmbedder]:
    embedder = ConceptEmbedder()
    search = SemanticSearch(embedder=embedder if semantic else None,  # type: ignore[arg-type]
                            semantic_enabled=semantic)
    await search.start()
    await search.upsert_owners(AGENTS)
    return search, embedder


async def test_meaning_without_shared_words_ranks_the_right_agent_first() -> None:
    search, _ = await _search()
    query = "render this mandarin agreement"  # no word of the translator's texts
    hybrid = await search.search(query, 3)
    assert hybrid.mode is SearchMode.HYBRID and hybrid.hits[0].owner_id == "eu/lang.translate.zh_en"
    assert hybrid.hits[0].capability == "translate.text" and hybrid.hits[0].vector_score > 0.5
    lexical = await search.search(query, 3, ranking=Ranking.LEXICAL)
    assert not lexical.hits or lexical.hits[0].lexical_score == 0.0  # words alone find nothing


async def test_exact_terms_still_count_and_one_hit_per_agent() -> None:
    search, _ = await _search()
    result = await search.search("invoice.extract total", 3)
    assert result.hits[0].owner_id == "eu/fin.invoice.reader"
    assert result.hits[0].lexical_score > 0 and result.hits[0].score >= result.hits[-1].score
    assert len({hit.owner_id for hit in result.hits}) == len(result.hits)


async def test_filters_updates_and_removals_change_what_is_found() -> None:
    search, embedder = await _search()
    query = "find a similar photo"
    first = await search.search(query, 3)
    assert first.hits[0].owner_id == "eu/img.search.sim"
    allowed = await search.search(query, 3, lambda owner: owner != "eu/img.search.sim")
    assert "eu/img.search.sim" not in {hit.owner_id for hit in allowed.hits}
    before = embedder.encoded
    await search.upsert_owners({"eu/img.search.sim": [Document.for_capability(
        owner_id="eu/img.search.sim", name="image.search", description="Sum the bill")]})
    assert embedder.encoded == before + 1  # only the changed text (the agent vector is the mean of its parts)
    moved = await search.search(query, 3)
    updated = next(hit for hit in moved.hits if hit.owner_id == "eu/img.search.sim")
    assert updated.vector_score < first.hits[0].vector_score  # the new description means less of the query
    assert search.remove_owner("eu/img.search.sim")
    gone = await search.search("image.search", 3)
    assert "eu/img.search.sim" not in {hit.owner_id for hit in gone.hits}


async def test_agent_level_text_finds_an_agent_by_its_description() -> None:
    search, _ = await _search()
    owner = "eu/legal.clauses"
    await search.upsert_owners({owner: [
        Document.for_description(owner_id=owner, title="Clause desk", description="Mandarin contract review"),
        Document.for_capability(owner_id=owner, name="review.run", description="Run a review"),
    ]})
    result = await search.search("mandarin contract", 3, ranking=Ranking.LEXICAL)
    assert result.hits[0].owner_id == owner and result.hits[0].capability == "review.run"
    described_only = "eu/described.only"
    await search.upsert_owners({described_only: [
        Document.for_description(owner_id=described_only, title="Sum desk", description="Sums every bill")]})
    found = await search.search("sum the bill", 5)
    hit = next(hit for hit in found.hits if hit.owner_id == described_only)
    assert hit.capability is None and hit.doc_id == f"{described_only}#"


async def test_lexical_mode_ranks_by_words_only() -> None:
    search, embedder = await _search(semantic=False)
    result = await search.search("invoice total", 3)
    assert result.mode is SearchMode.LEXICAL and result.hits[0].owner_id == "eu/fin.invoice.reader"
    assert result.hits[0].vector_score is None and embedder.encoded == 0  # no embedder at all
    with pytest.raises(ValueError):
        await search.search("x", 0)


async def test_cosine_is_the_agent_vector_blended_with_its_closest_text() -> None:
    owner = "eu/lang.legal.desk"
    documents = [
        Document.for_capability(owner_id=owner, name="translate.text", description="Translate English text",
                                examples=("render this Chinese contract clause",)),
        Document.for_capability(owner_id=owner, name="invoice.extract", description="Read the invoice total"),
    ]
    embedder = ConceptEmbedder()
    async with SemanticSearch(embedder=embedder) as search:  # type: ignore[arg-type]
        await search.upsert_owner(owner, documents)
        hit = (await search.search("chinese contract", k=1)).hits[0]
        vectors = await embedder.encode(search.embedding_texts(documents))
        query = (await embedder.encode(["chinese contract"]))[0]
    mean = vectors.mean(axis=0)
    agent_cosine = float(query @ (mean / np.linalg.norm(mean)))
    closest = float(max(vectors @ query))  # the example request is the closest text here
    assert closest > float(vectors[0] @ query)
    assert hit.vector_score == pytest.approx(0.7 * agent_cosine + 0.3 * closest, abs=1e-5)
    assert hit.capability == "translate.text"  # the example's capability is the one named


async def test_a_candidate_pool_ranks_as_every_owner_would_and_widens_past_a_filter() -> None:
    """With more owners than ``candidate_pool``, a hybrid query reads the single texts of the pool's
    owners alone (the best by agent vector and coverage); the hits are the same, and when ``allow``
    turns the pool down the query ranks every owner, asking ``allow`` once per owner still."""
    words = ["render", "bill", "photo", "clause", "sum", "mandarin", "similar", "english"]
    fillers = {f"eu/misc.filler.a{number}": [Document.for_capability(
        owner_id=f"eu/misc.filler.a{number}", name=f"misc.task{number}",
        description=f"{words[number % 8]} {words[number * 3 % 7]} chores", examples=(f"{words[number % 5]} for me",))]
        for number in range(40)}
    queries = ("translate chinese contract into english", "the sum of a bill", "find photos like this one")
    results = {}
    for pool in (None, 4):
        embedder = ConceptEmbedder()
        async with SemanticSearch(embedder=embedder, candidate_pool=pool) as search:  # type: ignore[arg-type]
            await search.upsert_owners({**AGENTS, **fillers})
            full = [[(hit.owner_id, hit.score) for hit in (await search.search(query, k=5)).hits] for query in queries]
            asked: list[str] = []

            def allow(owner_id: str) -> bool:
                asked.append(owner_id)
                return owner_id.endswith(("7", "9"))  # 8 of 43 owners; the pool of 4 holds few of them

            filtered = []
            for query in queries:
                asked.clear()
                filtered.append([hit.owner_id for hit in (await search.search(query, k=5, allow=allow)).hits])
                assert len(asked) == len(set(asked)), asked  # once per owner, the widened ranking included
            results[pool] = (full, filtered)
    assert results[4] == results[None]
    assert all(len(hits) == 5 for hits in results[4][1])
    with pytest.raises(ValueError, match="candidate_pool"):
        SemanticSearch(embedder=ConceptEmbedder(), candidate_pool=0)  # type: ignore[arg-type]
