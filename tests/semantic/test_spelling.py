"""Spelling correction of queries (semantic.spelling): what is corrected, what is left alone, and
that the corrector follows the index through upserts and removals. No model, no socket."""

from __future__ import annotations

import pytest

from semantic.spelling import SpellingCorrector, read_vocabulary_file, vocabulary_words

pytestmark = pytest.mark.unit

# A dictionary as a word-piece vocabulary gives it: whole words, no typos, singulars only.
DICTIONARY = vocabulary_words(["[CLS]", "##ing", "translate", "menu", "into", "english", "receipt", "total",
                               "pizza", "order", "schedule", "meeting", "remind", "bin", "take", "tuesday",
                               "\u2581weather", "berlin", "vegan", "bakery", "2024"])
REGISTRY = {
    "lang.translate": "Translate text into another language; menus, letters",
    "fin.receipts": "Read the total of a receipt photo",
    "sched.meetings": "Schedule a meeting and remind attendees",
    "food.bakery": "Began baking bread",  # "began": one edit from "vegan", but another first letter
    "food.pizzeria": "Pizzas delivered",
}


def _corrector() -> SpellingCorrector:
    corrector = SpellingCorrector(DICTIONARY)
    for key, text in REGISTRY.items():
        corrector.upsert(key, text)
    return corrector


def test_vocabulary_words_keeps_whole_words_of_either_tokenizer_kind() -> None:
    assert {"translate", "weather", "english"} <= DICTIONARY
    assert not {"##ing", "ing", "[cls]", "cls", "2024"} & DICTIONARY


def test_typos_one_edit_from_an_indexed_word_are_corrected() -> None:
    corrector = _corrector()
    assert corrector.correct("transalte this menu into English") == "translate this menu into English"
    assert corrector.correct("recipt total") == "receipt total"  # deletion
    assert corrector.correct("shedule a meeting") == "schedule a meeting"  # insertion
    assert corrector.correct("rmeind me tuesday") == "remind me tuesday"  # swap of adjacent letters
    assert corrector.correct("schedulr a meeting") == "schedule a meeting"  # substitution


def test_known_short_or_far_words_are_left_alone() -> None:
    corrector = _corrector()
    assert corrector.correct("order a pizza") == "order a pizza"  # in the dictionary: not a typo
    assert corrector.correct("take the bins out") == "take the bins out"  # plural of a dictionary word
    assert corrector.correct("vegan bakery") == "vegan bakery"
    assert corrector.correct("menn") == "menn"  # shorter than five letters
    assert corrector.correct("trnaslaet") == "trnaslaet"  # more than one edit away
    assert corrector.correct("xeceipt") == "xeceipt"  # the first letter must match


def test_corrections_follow_the_index_and_need_a_dictionary() -> None:
    corrector = _corrector()
    corrector.remove("fin.receipts")
    assert corrector.correct("recipt") == "recipt"
    corrector.upsert("fin.receipts", "Receipt scanner")
    assert corrector.correct("recipt") == "receipt"
    corrector.upsert("fin.receipts", "Invoices scanned")  # replaces its text
    assert corrector.correct("recipt") == "recipt"
    assert not SpellingCorrector().enabled
    blind = SpellingCorrector()
    blind.upsert("lang.translate", REGISTRY["lang.translate"])
    assert blind.correct("transalte") == "transalte"  # without a dictionary a typo cannot be told


def test_vocabulary_file_is_read_or_reported_missing(tmp_path) -> None:
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\nhello\n##lo\nworld\n", encoding="utf-8")
    assert read_vocabulary_file(path) == frozenset({"hello", "world"})
    assert read_vocabulary_file(tmp_path / "missing.txt") is None


def test_words_past_the_length_bounds_are_neither_corrected_nor_ranked_nor_embedded() -> None:
    """What keeps a 2,000-letter word cheap (issue 25: it held the loop 0.5-0.9 s in the speller):
    no word past ``MAX_WORD_LENGTH`` is spell-corrected (its edits are never made), none past
    ``MAX_WORD_CHARS`` is a BM25 term, none past ``MAX_EMBEDDED_WORD_CHARS`` reaches an encoder,
    only the first ``MAX_QUERY_CHARS`` of a query are ranked and ``MAX_EMBEDDED_CHARS`` embedded."""
    from semantic.blend import MAX_EMBEDDED_CHARS, MAX_EMBEDDED_WORD_CHARS, MAX_QUERY_CHARS, bounded_query, embeddable
    from semantic.lexical import MAX_WORD_CHARS, tokenize
    from semantic.spelling import MAX_WORD_LENGTH

    long_word = "translate" * 4  # 36 letters, indexed below; one edit away from its typo
    corrector = SpellingCorrector(DICTIONARY | {long_word[:MAX_WORD_LENGTH]})
    corrector.upsert("lang.long", f"{long_word} {long_word[:MAX_WORD_LENGTH - 1]}")
    assert corrector.correct(long_word[:MAX_WORD_LENGTH - 1] + "x") == long_word[:MAX_WORD_LENGTH - 1]  # in reach
    assert corrector.correct(long_word + "x") == long_word + "x"  # past the bound: left alone
    flood = "q" * 2_000
    assert corrector.correct(flood) == flood
    assert tokenize("q" * MAX_WORD_CHARS) and not tokenize(flood)
    assert embeddable(f"translate {flood} this") == "translate this"
    assert embeddable("q" * MAX_EMBEDDED_WORD_CHARS) == "q" * MAX_EMBEDDED_WORD_CHARS
    huge = "translate " * 6_554  # 64 KiB
    assert bounded_query(huge) == huge[:MAX_QUERY_CHARS]
    embedded = embeddable(bounded_query(huge))
    assert embedded == ("translate " * (len(embedded) // 10 + 1)).strip() and len(embedded) <= MAX_EMBEDDED_CHARS
