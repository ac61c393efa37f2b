"""Lexical index: Okapi BM25 over document texts, updated incrementally.

Exact words still matter in a registry ("ocr", "kyc", "sql", a product name), and the embedding
model does not know every acronym; BM25 supplies that signal to the hybrid ranking.

Terms: Latin-script words are lower-cased and stemmed with the Snowball stemmer (PyStemmer);
Chinese, Japanese and Korean text, written without spaces, is indexed as overlapping character
bigrams ("发票查验" -> 发票, 票查, 查验), the usual CJK analysis of search engines (Lucene's
``CJKBigramFilter``), so a Chinese description is found by a Chinese query without a dictionary;
an unseen query bigram holding a particle or pronoun does not count against coverage.

Postings are kept per term as ints, slot * 2**32 + term frequency: for a term of several
documents an ``array('Q')`` of them sorted by slot (8 B a posting, found by binary search; a dict
of {slot: frequency} cost ~45), for a term of one document its one posting in a table of such
terms that does not hold their strings (``semantic.terms``: an agent's number and the word pairs
around it cost ~140 B a term as dict keys). Each term's postings are also cached as two numpy arrays (rebuilt lazily
after that term changes), so a query costs a few vectorised operations per query term instead of
a Python loop over every posting. An index given ``text_of`` (the owner of the texts hands a
document's text back) keeps no term list per document: a removal works the terms out again.
"""

from __future__ import annotations

import bisect
import functools
import math
import re
import sys
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import Stemmer

from .errors import InvalidDocumentError
from .index import top_k_of_scores
from .terms import OneDocumentTerms, term_hash

__all__ = [
    "LexicalIndex",
    "LexicalScores",
    "tokenize",
    "stem",
    "DEFAULT_K1",
    "DEFAULT_B",
    "DEFAULT_BIGRAMS",
    "STEMMER_ALGORITHM",
    "index_terms",
    "mostly_cjk",
    "MAX_WORD_CHARS",
    "MAX_QUERY_TERMS",
]

DEFAULT_K1 = 1.2
# Longer runs of letters or digits are no words (a pasted hash, a flood): not terms, and never
# stemmed or cached (a 2,000-letter word would cost its stem and a cache entry per query).
MAX_WORD_CHARS = 64
# A query's distinct terms past this many are not scored (each costs a posting lookup; a 2,000-
# character Chinese query has ~2,000 bigrams).
MAX_QUERY_TERMS = 256
DEFAULT_B = 0.75
DEFAULT_BIGRAMS = True
_INITIAL_SLOTS = 1024
_ONE = 1 << 32  # a posting: slot * _ONE + frequency (a frequency is below 2**32)

# Snowball's "english" (Porter2). Measured with the default ranking, lexical ranking MRR on the
# tuning set (tests/data/semantic_eval.json): english 0.801, porter 0.797 (identical, query for
# query, to the hand-written Porter stemmer this replaced); hybrid 0.955 for all three. On the
# blind English set: english 0.747, porter 0.750; hybrid 0.898 vs 0.899.
STEMMER_ALGORITHM = "english"
_STEM_CACHE_WORDS = 100_000
# Texts whose counted terms are remembered: the texts of documents just indexed are read back to
# tell single postings apart (``_single_posting``), and many agents share one capability's text.
_COUNTED_CACHE_TEXTS = 2_048

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# Han (with extension A and compatibility ideographs), kana and Hangul: scripts written without
# spaces between words. Runs of them become character bigrams; other runs of letters and digits
# are words.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(f"(?P<word>[a-z0-9]+)|(?P<cjk>[{_CJK}]+)")
_CJK_CHARACTER = re.compile(f"[{_CJK}]")

# Function words and request boilerplate ("who can", "please", "I need") carry no capability
# meaning; dropping them also keeps the longest postings lists out of every query.
_STOPWORDS = frozenset(
    (
        "a about after all also am an and any are as at be been before being but by can could did do "
        "does doing for from had has have having he her here hers him his how i if in into is it its "
        "just me my myself no nor not of off on once only or other our ours out over own please same "
        "she should so some such than that the their theirs them then there these they this those "
        "through to too under until up us very was we were what when where which while who whom why "
        "will with would you your yours yourself s t d ll m re ve"
    ).split()
)


# Chinese particles and pronouns: grammar, not content (a query bigram holding one that no
# document has is left out of the coverage ceiling, see LexicalIndex.score). Measured on the
# Chinese set's zh->zh slice at the lexical threshold 0.07, the only Chinese data there is:
# answerable refused 43.3% -> 35.0%, unanswerable routed 7.7% both; the longer list with
# 帮请给个一下 (help, please, give, a, one, a bit) routed 30.8%.
_CJK_FUNCTION_CHARACTERS = frozenset("的了吗呢吧啊呀哦嘛我你您他她它们这那哪么把被")


# British spellings folded to American before stemming ("summarise" must meet "summarize",
# "analyse" "analyze", "colour" "color"); applied to documents and queries alike, so the odd
# false fold ("promise" -> "promize") is harmless.
_BRITISH_ENDINGS = re.compile(r"(?<=[a-z]{3})(is|ys)(e|es|ed|ing|ation|ations|er|ers)$")
_BRITISH_OUR = re.compile(r"(?<=[a-z]{3})our$")


_STEMMER = Stemmer.Stemmer(STEMMER_ALGORITHM)


def stem(word: str) -> str:
    """Snowball stem of a lower-case word, after folding British spellings; digits pass unchanged.

    Documents and queries go through the same function, so "translate", "translation",
    "translator" and "translating" all meet as "translat", and plurals fold.
    """
    # A word with a digit is not stemmed, and not remembered: agents' numbers and ids are words
    # of one document each, and as cache entries they cost ~90 B per agent and pushed real
    # words out of the cache.
    return _stemmed(word) if word.isalpha() else word


@functools.lru_cache(maxsize=_STEM_CACHE_WORDS)
def _stemmed(word: str) -> str:
    word = _BRITISH_ENDINGS.sub(lambda match: match.group(1)[0] + "z" + match.group(2), word)
    word = _BRITISH_OUR.sub("or", word)
    return _STEMMER.stemWord(word)


def _terms(text: str) -> list[tuple[str, bool]]:
    """(term, is_word) in text order: stemmed content words, and CJK character bigrams."""
    spaced = _CAMEL_BOUNDARY.sub(" ", text).lower()
    terms: list[tuple[str, bool]] = []
    for match in _TOKEN.finditer(spaced):
        word = match.group("word")
        if word is not None:
            if 1 < len(word) <= MAX_WORD_CHARS and word not in _STOPWORDS:
                terms.append((stem(word), True))
            continue
        run = match.group("cjk")
        if len(run) == 1:
            terms.append((run, False))
        else:
            terms.extend((run[start : start + 2], False) for start in range(len(run) - 1))
    return terms


def mostly_cjk(text: str) -> bool:
    """Whether at least half of the letters of ``text`` are Chinese, Japanese or Korean."""
    letters = sum(1 for character in text if character.isalpha())
    return letters > 0 and 2 * len(_CJK_CHARACTER.findall(text)) >= letters


def tokenize(text: str) -> list[str]:
    """Lower-cased, stemmed content words and CJK character bigrams; capability names split into words.

    ``translate.text``, ``image:search``, ``ocr_receipt`` and ``getWeather`` all split on their
    separators / camel case, so a query "translate text" meets the name ``translate.text``;
    "增值税发票" gives 增值, 值税, 税发, 发票 (a lone CJK character stays a unigram).
    """
    return [term for term, _ in _terms(text)]


@functools.lru_cache(maxsize=_COUNTED_CACHE_TEXTS)
def counted_terms(text: str, *, bigrams: bool) -> Mapping[str, int]:
    """:func:`index_terms` of ``text``, counted; remembered for the last texts (do not change it)."""
    return Counter(index_terms(text, bigrams=bigrams))


def index_terms(text: str, *, bigrams: bool) -> list[str]:
    """:func:`tokenize` plus, with ``bigrams``, pairs of adjacent words ("text>speech").

    Pairs make word order count: "text to speech" and "speech to text" share every word. CJK
    bigrams already carry their order and do not pair (with each other or with words).
    """
    terms = _terms(text)
    tokens = [term for term, _ in terms]
    if not bigrams:
        return tokens
    pairs = [
        f"{first}>{second}"
        for (first, first_is_word), (second, second_is_word) in zip(terms, terms[1:])
        if first_is_word and second_is_word
    ]
    return tokens + pairs


class _SlotIds(Sequence[str]):
    """Doc ids of an array of slots, resolved only for the rows actually read."""

    def __init__(self, slots: np.ndarray, doc_id_at: list[str | None]) -> None:
        self._slots = slots
        self._doc_id_at = doc_id_at

    def __len__(self) -> int:
        return len(self._slots)

    def __getitem__(self, row: int) -> str:  # type: ignore[override]
        return self._doc_id_at[self._slots[row]]  # type: ignore[return-value]


class LexicalScores:
    """BM25 scores of the documents that share at least one term with a query.

    ``ceiling`` is the score an ideal document would reach (every query term at saturating
    frequency): ``score / ceiling`` is an absolute "how much of the query is covered" in [0, 1).
    Reads the index's internals: valid until the index next changes.
    """

    def __init__(
        self,
        *,
        slots: np.ndarray,
        totals: np.ndarray,
        ceiling: float,
        doc_id_at: list[str | None],
    ) -> None:
        self.ceiling = ceiling
        self.scores = totals[slots]  # aligned with doc_ids
        self.doc_ids: Sequence[str] = _SlotIds(slots, doc_id_at)
        self._totals = totals

    def __len__(self) -> int:
        return len(self.scores)

    def normalized(self) -> np.ndarray:
        """Coverage of every hit, aligned with ``doc_ids``."""
        if self.ceiling <= 0.0:
            return np.zeros_like(self.scores)
        return self.scores / self.ceiling

    def coverage_of_slots(self, slots: np.ndarray) -> np.ndarray:
        """Coverage (float64) of the documents at ``slots`` (:meth:`LexicalIndex.slot_of`; -1: none)."""
        if self.ceiling <= 0.0 or not len(slots):
            return np.zeros(len(slots))
        present = (slots >= 0) & (slots < len(self._totals))
        totals = self._totals[np.where(present, slots, 0)].astype(np.float64)
        return np.where(present, totals / self.ceiling, 0.0)


def _drop_slot(postings: array[int], slot: int) -> None:
    """Remove ``slot``'s posting from ``postings`` (sorted: a binary search and a memmove)."""
    position = bisect.bisect_left(postings, slot * _ONE)
    if position == len(postings) or postings[position] // _ONE != slot:
        raise InvalidDocumentError(f"slot {slot} has no posting here: the index is inconsistent")
    del postings[position]


class LexicalIndex:
    """Incremental Okapi BM25 (``k1`` term-frequency saturation, ``b`` length normalisation).

    Not thread-safe: use from one thread (the event loop) only.
    """

    def __init__(self, *, k1: float = DEFAULT_K1, b: float = DEFAULT_B, bigrams: bool = DEFAULT_BIGRAMS,
                 text_of: Callable[[str], str] | None = None) -> None:
        if k1 < 0.0:
            raise ValueError(f"k1 must be >= 0, got {k1}")
        if not 0.0 <= b <= 1.0:
            raise ValueError(f"b must be within [0, 1], got {b}")
        self._k1 = k1
        self._b = b
        self._bigrams = bigrams
        self._slot_of: dict[str, int] = {}
        self._doc_id_at: list[str | None] = []
        self._free_slots: list[int] = []
        # Per slot its terms, interned, for remove(); not held when the owner of the texts can
        # give a document's text back (``text_of``): the terms are then worked out again.
        self._text_of = text_of
        self._terms_at: dict[int, dict[str, int]] = {}
        self._lengths = np.zeros(_INITIAL_SLOTS, dtype=np.float32)
        self._total_length = 0
        # term -> its postings, each slot * _ONE + frequency, sorted by slot, for a term of
        # several documents (a dict of {slot: frequency} cost ~45 B a posting, the array 8); a
        # term of one document (most are: numbers, names, the word pairs around them) is held
        # by its hash in _single, without its string.
        self._postings: dict[str, array[int]] = {}
        self._single = OneDocumentTerms()
        self._posting_arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._slot_of

    def slot_of(self, doc_id: str) -> int | None:
        """Where ``doc_id``'s score sits in :class:`LexicalScores` (until it is upserted or removed)."""
        return self._slot_of.get(doc_id)

    def upsert(self, doc_id: str, text: str) -> None:
        """Index ``text`` under ``doc_id``, replacing any previous text. O(terms of the doc) binary
        searches and memmoves of postings arrays."""
        self.remove(doc_id)
        terms = counted_terms(text, bigrams=self._bigrams)
        slot = self._free_slots.pop() if self._free_slots else self._new_slot()
        self._slot_of[doc_id] = slot
        self._doc_id_at[slot] = doc_id
        if self._text_of is None:
            self._terms_at[slot] = {sys.intern(term): frequency for term, frequency in terms.items()}
        length = sum(terms.values())
        self._lengths[slot] = length
        self._total_length += length
        postings = self._postings
        arrays = self._posting_arrays
        for term, frequency in terms.items():
            posting = slot * _ONE + frequency
            held = postings.get(term)
            if held is not None:
                bisect.insort(held, posting)
            else:
                hashed = term_hash(term)
                other = self._single_posting(term, hashed, besides=slot)
                if other is None:
                    self._single.add(hashed, posting)
                else:  # its second document
                    self._single.remove(hashed, other // _ONE, other % _ONE)
                    postings[sys.intern(term)] = array("Q", sorted((other, posting)))
            if term in arrays:
                del arrays[term]

    def remove(self, doc_id: str) -> bool:
        """Forget ``doc_id``; returns whether it was present. O(terms of the doc) binary searches
        and memmoves of postings arrays."""
        slot = self._slot_of.get(doc_id)
        if slot is None:
            return False
        if self._text_of is None:
            terms: Iterable[str] = self._terms_at.pop(slot)
        else:
            counted = counted_terms(self._text_of(doc_id), bigrams=self._bigrams)
            if sum(counted.values()) != self._lengths[slot]:
                raise InvalidDocumentError(f"the text given back for {doc_id!r} is not the text indexed")
            terms = counted
        del self._slot_of[doc_id]
        postings = self._postings
        for term in terms:
            held = postings.get(term)
            if held is None:
                try:
                    self._single.remove(term_hash(term), slot)
                except KeyError:
                    raise InvalidDocumentError(f"{doc_id!r} has no posting of {term!r}: the index is inconsistent") from None
            else:
                _drop_slot(held, slot)
                if len(held) == 1:  # one document left
                    self._single.add(term_hash(term), held[0])
                    del postings[term]
            self._posting_arrays.pop(term, None)
        self._total_length -= int(self._lengths[slot])
        self._lengths[slot] = 0.0
        self._doc_id_at[slot] = None
        self._free_slots.append(slot)
        return True

    def idf(self, term: str) -> float:
        """Okapi IDF with the +1 that keeps it positive for terms in most documents."""
        arrays = self._arrays(term)
        return self._idf(0 if arrays is None else len(arrays[0]))

    def _idf(self, frequency: int) -> float:
        count = len(self._slot_of)
        return math.log(1.0 + (count - frequency + 0.5) / (frequency + 0.5))

    def score(self, query: str) -> LexicalScores:
        """BM25 of every document sharing a term with ``query`` (unordered)."""
        terms = set(list(dict.fromkeys(index_terms(query, bigrams=self._bigrams)))[:MAX_QUERY_TERMS])
        count = len(self._slot_of)
        if not terms or count == 0:
            return LexicalScores(
                slots=np.zeros(0, dtype=np.int64), totals=np.zeros(0, dtype=np.float32), ceiling=0.0,
                doc_id_at=self._doc_id_at,
            )
        average_length = max(self._total_length / count, 1.0)
        totals = np.zeros(len(self._doc_id_at), dtype=np.float32)
        touched = np.zeros(len(self._doc_id_at), dtype=bool)
        ceiling = 0.0
        for term in terms:
            # Unseen query words count in the ceiling: a query half made of words no document
            # has is only half covered, whatever the other half scores. Not so an unseen CJK
            # bigram with a particle or pronoun in it (我的, 的快, 到哪): it straddles words of a
            # text written without spaces, the way English stopwords would, and names nothing.
            arrays = self._arrays(term)
            if arrays is None and _CJK_FUNCTION_CHARACTERS.intersection(term):
                continue
            idf = self._idf(0 if arrays is None else len(arrays[0]))
            ceiling += idf * (self._k1 + 1.0)
            if arrays is None:
                continue
            slots, frequencies = arrays
            lengths = self._lengths[slots]
            saturation = frequencies + self._k1 * (1.0 - self._b + self._b * lengths / average_length)
            totals[slots] += idf * frequencies * (self._k1 + 1.0) / saturation
            touched[slots] = True
        return LexicalScores(
            slots=np.flatnonzero(touched), totals=totals, ceiling=ceiling,
            doc_id_at=self._doc_id_at,
        )

    def top_k(
        self, query: str, k: int, allow: Callable[[str], bool] | None = None
    ) -> list[tuple[str, float]]:
        """The ``k`` best (doc_id, BM25) pairs with a positive score, best first."""
        result = self.score(query)
        return top_k_of_scores(result.doc_ids, result.scores, k, allow)

    def _arrays(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        arrays = self._posting_arrays.get(term)
        if arrays is None:
            held: array[int] | list[int] | None = self._postings.get(term)
            if held is None:
                single = self._single_posting(term, term_hash(term))
                if single is None:
                    return None
                held = [single]
            packed = np.array(held, dtype=np.uint64)  # a copy
            arrays = ((packed >> np.uint64(32)).astype(np.int64), (packed & np.uint64(_ONE - 1)).astype(np.float32))
            self._posting_arrays[term] = arrays
        return arrays

    def _single_posting(self, term: str, hashed: int, *, besides: int = -1) -> int | None:
        """The posting of ``term`` if one document alone holds it: of the postings held under its
        hash, the one whose document has the term (another term may have the same hash). Slot
        ``besides`` is not looked at: the document being indexed, whose text is not yet given back."""
        for posting in self._single.postings(hashed):
            slot, frequency = divmod(posting, _ONE)
            if slot == besides:
                continue  # another of its own terms, of the same hash
            if self._text_of is None:
                terms: Mapping[str, int] = self._terms_at[slot]
            else:
                text = self._text_of(self._doc_id_at[slot])  # type: ignore[arg-type]
                terms = counted_terms(text, bigrams=self._bigrams)
            if terms.get(term) == frequency:  # not another term of that document with the hash
                return posting
        return None

    def _new_slot(self) -> int:
        slot = len(self._doc_id_at)
        self._doc_id_at.append(None)
        if slot >= self._lengths.shape[0]:
            grown = np.zeros(self._lengths.shape[0] * 2, dtype=np.float32)
            grown[: self._lengths.shape[0]] = self._lengths
            self._lengths = grown
        return slot

    def terms(self, text: str) -> Sequence[str]:
        """The terms this index stores for ``text`` (for debugging relevance)."""
        return index_terms(text, bigrams=self._bigrams)
