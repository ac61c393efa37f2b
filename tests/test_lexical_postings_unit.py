"""The BM25 index's postings (semantic.lexical): arrays of packed ints that shrink by moving their
last posting into a removed one's place, and an index that keeps no terms per document
(``text_of``). After any churn an index scores every document exactly as an index built afresh
from the documents left; a text handed back that is not the one indexed is refused."""

from __future__ import annotations

import random

import pytest

from semantic.errors import InvalidDocumentError
from semantic.lexical import LexicalIndex

pytestmark = pytest.mark.unit

WORDS = ["invoice", "receipt", "translate", "speech", "text", "image", "search", "weather", "agent", "scale"]
QUERIES = ["translate text", "invoice receipt agent", "speech to text", "agent", "image search weather", "scale 17"]


def text(rng: random.Random, number: int) -> str:
    # Common words (postings of hundreds: the numpy path) and a number of its own (one-int postings).
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) + f" agent {number}"


def scores(index: LexicalIndex, query: str) -> dict[str, float]:
    result = index.score(query)
    return {result.doc_ids[row]: float(result.scores[row]) for row in range(len(result))}


@pytest.mark.parametrize("keeps_terms", [True, False], ids=["terms kept", "text handed back"])
def test_scores_after_churn_equal_a_fresh_index(keeps_terms: bool) -> None:
    rng = random.Random(5)
    texts: dict[str, str] = {}
    index = LexicalIndex() if keeps_terms else LexicalIndex(text_of=texts.__getitem__)
    for step in range(3_000):
        doc_id = f"d{rng.randrange(400)}"
        if doc_id in texts and rng.random() < 0.4:
            assert index.remove(doc_id)
            del texts[doc_id]
        else:
            new_text = text(rng, step)
            index.upsert(doc_id, new_text)  # reads the previous text back before it is replaced
            texts[doc_id] = new_text
    fresh = LexicalIndex()
    for doc_id, held in texts.items():
        fresh.upsert(doc_id, held)
    assert len(index) == len(texts) > 100
    for query in QUERIES:
        assert scores(index, query) == scores(fresh, query)
        assert index.idf("agent") == fresh.idf("agent")
    for doc_id in list(texts):
        index.remove(doc_id)
        del texts[doc_id]
    assert scores(index, "agent translate") == {}


def test_a_text_handed_back_that_was_not_indexed_is_refused() -> None:
    texts = {"a": "translate text from english"}
    index = LexicalIndex(text_of=texts.__getitem__)
    index.upsert("a", texts["a"])
    texts["a"] = "translate"
    with pytest.raises(InvalidDocumentError, match="not the text indexed"):
        index.remove("a")
