"""The BM25 index's postings (semantic.lexical): a sorted array of packed ints per term of several
documents, a table holding a term of one document by its hash (semantic.terms); and an index
that keeps no terms per document (``text_of``). After any churn an index scores every document
exactly as an index built afresh from the documents left, also when every term has one hash; a
text handed back that is not the one indexed is refused. So for the spelling corrector's word
counts."""

from __future__ import annotations

import random

import pytest

import semantic.lexical
from semantic.errors import InvalidDocumentError
from semantic.lexical import LexicalIndex
from semantic.spelling import SpellingCorrector
from semantic.terms import OneDocumentTerms, term_hash

pytestmark = pytest.mark.unit

WORDS = ["invoice", "receipt", "translate", "speech", "text", "image", "search", "weather", "agent", "scale"]
QUERIES = ["translate text", "invoice receipt agent", "speech to text", "agent", "image search weather", "17", "agent 17", "17 agent 17"]


def text(rng: random.Random) -> str:
    # Common words (postings of hundreds) and a number that few texts share, once or twice (the
    # postings of one document: its id at frequency 1, an int otherwise; arrays when shared).
    number = f" agent {rng.randrange(1_000)}"
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) + number * rng.randint(1, 2)


def scores(index: LexicalIndex, query: str) -> dict[str, float]:
    result = index.score(query)
    return {result.doc_ids[row]: float(result.scores[row]) for row in range(len(result))}


@pytest.mark.parametrize("keeps_terms", [True, False], ids=["terms kept", "text handed back"])
@pytest.mark.parametrize("colliding", [False, True], ids=["hashes", "one hash for every term"])
def test_scores_after_churn_equal_a_fresh_index(keeps_terms: bool, colliding: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if colliding:  # every one-document term under one of three hashes: each is told apart by its text
        monkeypatch.setattr(semantic.lexical, "term_hash", lambda term: 5 + len(term) % 3)
    rng = random.Random(5)
    texts: dict[str, str] = {}
    index = LexicalIndex() if keeps_terms else LexicalIndex(text_of=texts.__getitem__)
    for _ in range(3_000):
        doc_id = f"d{rng.randrange(400)}"
        if doc_id in texts and rng.random() < 0.4:
            assert index.remove(doc_id)
            del texts[doc_id]
        else:
            new_text = text(rng)
            index.upsert(doc_id, new_text)  # reads the previous text back before it is replaced
            texts[doc_id] = new_text
    fresh = LexicalIndex()
    for doc_id, held in texts.items():
        fresh.upsert(doc_id, held)
    assert len(index) == len(texts) > 100
    assert len(index._single) > 50 and "agent>17" not in index._postings  # held by hash, not by string
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


def test_a_speller_reading_texts_back_corrects_as_one_keeping_word_sets() -> None:
    rng = random.Random(9)
    dictionary = frozenset(["the", "a"])  # every indexed word but these is "unknown": typos are judged
    texts: dict[str, str] = {}
    kept, reading = SpellingCorrector(dictionary), SpellingCorrector(dictionary, text_of=lambda key: texts.get(key, ""))
    words = ["receipt", "recipe", "receipts", "schedule", "scheduler", "translate", "translator"]
    for _ in range(2_000):
        key = f"k{rng.randrange(60)}"
        if key in texts and rng.random() < 0.4:
            kept.remove(key)
            reading.remove(key)
            del texts[key]
        else:
            new_text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 4)))
            kept.upsert(key, new_text)
            reading.upsert(key, new_text)  # reads the previous text back before it is replaced
            texts[key] = new_text
    fresh = SpellingCorrector(dictionary)
    for key, held in texts.items():
        fresh.upsert(key, held)
    # Ties between candidates one edit away are broken by how many texts use each: counts matter.
    for query in ["recipt", "receit", "shedule", "schedulr", "translatr", "receipt recipes"]:
        assert reading.correct(query) == kept.correct(query) == fresh.correct(query)
    assert reading._text_count == fresh._text_count


def test_the_one_document_table_holds_postings_by_hash_through_removals_and_growth() -> None:
    table = OneDocumentTerms()
    held: dict[int, list[int]] = {}
    rng = random.Random(3)
    for step in range(20_000):
        hashed = rng.choice([rng.randrange(2, 2**32), term_hash("shared"), 1 << 20])  # and collisions
        slot = rng.randrange(5_000)
        if held.get(hashed) and rng.random() < 0.5:
            posting = held[hashed].pop(rng.randrange(len(held[hashed])))
            assert table.remove(hashed, posting >> 32) >> 32 == posting >> 32
        elif slot << 32 not in [posting & ~0xFFFFFFFF for posting in held.get(hashed, [])]:
            table.add(hashed, (slot << 32) + step % 7 + 1)
            held.setdefault(hashed, []).append((slot << 32) + step % 7 + 1)
    assert len(table) == sum(map(len, held.values())) > 2_000
    for hashed, postings in held.items():
        assert sorted(table.postings(hashed)) == sorted(postings)
    assert table.postings(12_345) == held.get(12_345, [])
    with pytest.raises(KeyError):
        table.remove(424242, 1)
    assert all(2 <= term_hash(word) < 2**32 for word in WORDS)


def test_the_one_document_table_wraps_round_its_end_when_it_grows() -> None:
    table = OneDocumentTerms()
    tags = [1_023 + 1_024 * k for k in range(1, 1_500)]  # each one's place the last of 1,024, then 1,023 or 2,047
    for number, tag in enumerate(tags):
        table.add(tag, (number << 32) + 1)
    assert len(table) == len(tags) and len(table._tags) == 2_048  # grown once, half of them wrapped round
    assert all(table.postings(tag) == [(number << 32) + 1] for number, tag in enumerate(tags))
    for number, tag in enumerate(tags[::2]):
        assert table.remove(tag, 2 * number) == (2 * number << 32) + 1
    assert all(table.postings(tag) == [((2 * number + 1) << 32) + 1] for number, tag in enumerate(tags[1::2]))
