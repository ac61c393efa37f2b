"""Spelling correction of queries against the words the registry actually uses.

People type "transalte", "reciept", "shedule", "subtitels". Neither BM25 (an unknown word is an
unknown term) nor a small embedding model (it splits the typo into unrelated word pieces) finds
the capability that says "translate", "receipt", "schedule" or "subtitles". Before a query is
ranked, each word that is a likely typo is replaced by a word of the indexed documents one edit
away (an insertion, deletion, substitution or swap of adjacent letters: Damerau-Levenshtein 1).

A word is a likely typo only when it is unknown twice over: the indexed documents do not use it,
and the dictionary does not hold it. The dictionary is the embedding model's word-piece
vocabulary (~20,000 whole English words for all-MiniLM-L6-v2), so "pizza" or "mortgage", words
no agent uses, stay as typed instead of being bent towards a registered near neighbour.
Without a dictionary nothing is corrected: a rare word cannot be told from a typo.

Two further rules keep corrections safe, both the usual ones of fuzzy search: words shorter than
``MIN_WORD_LENGTH`` are left alone (one edit changes a short word into too many others; words
longer than ``MAX_WORD_LENGTH`` are too, for cost), and the
first letter must match (typos there are rare, and it halves the false corrections).
"""

from __future__ import annotations

import re
import string
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["SpellingCorrector", "MIN_WORD_LENGTH", "MAX_WORD_LENGTH", "vocabulary_words", "read_vocabulary_file"]

MIN_WORD_LENGTH = 5
# Longer words are left as typed: the candidates of a word of n letters are ~54n strings of n
# letters (a 2,000-letter word: ~100,000 strings, 200 MB and most of a second).
MAX_WORD_LENGTH = 30
_SHARED_SETS_MAX = 100_000  # distinct word sets shared (beyond it the table starts again)
_LETTERS = string.ascii_lowercase
_WORD = re.compile(r"[A-Za-z]+")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _edits(word: str) -> set[str]:
    """Every string one insertion, deletion, substitution or adjacent swap away from ``word``."""
    splits = [(word[:cut], word[cut:]) for cut in range(len(word) + 1)]
    deletes = {head + tail[1:] for head, tail in splits if tail}
    swaps = {head + tail[1] + tail[0] + tail[2:] for head, tail in splits if len(tail) > 1}
    substitutions = {head + letter + tail[1:] for head, tail in splits if tail for letter in _LETTERS}
    inserts = {head + letter + tail for head, tail in splits for letter in _LETTERS}
    return deletes | swaps | substitutions | inserts


def vocabulary_words(tokens: Iterable[str]) -> frozenset[str]:
    """The whole words of a tokenizer vocabulary (WordPiece or SentencePiece), lower-cased.

    WordPiece marks continuation pieces with ``##`` and SentencePiece marks word starts with
    ``▁``; special tokens (``[CLS]``, ``<s>``) and pieces with digits or punctuation are dropped.
    """
    words = set()
    for token in tokens:
        if token.startswith("##"):
            continue
        word = token[1:] if token.startswith("\u2581") else token
        if word.isascii() and word.isalpha():
            words.add(word.lower())
    return frozenset(words)


def read_vocabulary_file(path: Path) -> frozenset[str] | None:
    """Whole words of a WordPiece ``vocab.txt`` (one token per line); None when there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    return vocabulary_words(text.splitlines())


def _surface_words(text: str) -> set[str]:
    return {word.lower() for word in _WORD.findall(_CAMEL_BOUNDARY.sub(" ", text))}


class SpellingCorrector:
    """Words of the indexed texts (with how many texts use each) and a dictionary of known words.

    ``upsert``/``remove`` follow the index, one text per key (an owner); :meth:`correct` rewrites
    a query. Not thread-safe: use from one thread (the event loop) only.
    """

    def __init__(self, dictionary: frozenset[str] | None = None, *,
                 text_of: Callable[[str], str] | None = None) -> None:
        self._dictionary = dictionary
        self._text_count: Counter[str] = Counter()
        # With ``text_of`` (a key's current text, "" for none: the search's documents) no word
        # set is kept per key; a replaced or removed text's words are read from it again.
        self._text_of = text_of
        self._words_of: dict[str, frozenset[str]] = {}
        self._shared_sets: dict[frozenset[str], frozenset[str]] = {}

    @property
    def enabled(self) -> bool:
        """Whether queries are corrected at all (a dictionary is needed to tell a typo)."""
        return bool(self._dictionary)

    def set_dictionary(self, dictionary: frozenset[str] | None) -> None:
        self._dictionary = dictionary

    def upsert(self, key: str, text: str) -> None:
        """Count the words of ``text`` under ``key`` (an owner), replacing its previous text.

        Each owner's word set is kept for :meth:`remove`; equal sets are one object and every word
        one string (``sys.intern``), so agents described alike cost a pointer each, not a set
        (about 1 KiB per agent at 30,000 agents before)."""
        self.remove(key)
        if self._text_of is not None:
            self._text_count.update(sys.intern(word) for word in _surface_words(text))
            return
        words = frozenset(sys.intern(word) for word in _surface_words(text))
        words = self._shared_sets.setdefault(words, words)
        if len(self._shared_sets) > _SHARED_SETS_MAX:
            self._shared_sets.clear()
        self._words_of[key] = words
        self._text_count.update(words)

    def remove(self, key: str) -> None:
        """Forget ``key``'s text (given ``text_of``: call this while it still gives that text)."""
        held = self._words_of.pop(key, ()) if self._text_of is None else _surface_words(self._text_of(key))
        for word in held:
            remaining = self._text_count[word] - 1
            if remaining > 0:
                self._text_count[word] = remaining
            else:
                del self._text_count[word]

    def correct(self, query: str) -> str:
        """``query`` with each likely typo replaced by the indexed word one edit away that most
        texts use (ties: alphabetical); unchanged when nothing looks misspelt."""
        if not self._dictionary or not self._text_count:
            return query
        return _WORD.sub(self._correct_match, query)

    def _correct_match(self, match: re.Match[str]) -> str:
        typed = match.group(0)
        word = typed.lower()
        if not MIN_WORD_LENGTH <= len(word) <= MAX_WORD_LENGTH or not self._looks_misspelt(word):
            return typed
        candidates = [candidate for candidate in _edits(word)
                      if candidate[0] == word[0] and candidate in self._text_count]
        if not candidates:
            return typed
        return max(candidates, key=lambda candidate: (self._text_count[candidate], candidate))

    def _looks_misspelt(self, word: str) -> bool:
        dictionary = self._dictionary or frozenset()
        if word in self._text_count or word in dictionary:
            return False
        # Word-piece vocabularies hold many plurals only as the singular ("bins", "payers").
        return not (word.endswith("s") and word[:-1] in dictionary)
