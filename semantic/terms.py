"""Terms that one document alone holds, kept without their strings (``semantic.lexical``).

Most distinct terms of a registry belong to one document each: an agent's number or id and the
word pairs around it. Held as dict keys, each cost its string, its entry in the interpreter's
table of interned strings and its dict entry — about 140 B a term, 420 B per agent in
``bench/scale.py``. :class:`OneDocumentTerms` holds such a term as a pair (the term's hash, its
posting) in two arrays: an open-addressing table kept at most two thirds full, 16 B an entry.

A hash does not name a term: two terms may share one. The table therefore answers "which
postings were added under this hash" (:meth:`OneDocumentTerms.postings`), and its user checks a
candidate against the document's own terms before taking it for the term (``LexicalIndex``),
so two terms of one hash stay two terms.
"""

from __future__ import annotations

from array import array

__all__ = ["OneDocumentTerms", "term_hash"]

_EMPTY = 0
_REMOVED = 1  # a removed entry: a search goes on past it, an insertion may take it
_SLOT_SHIFT = 32  # a posting is slot * 2**32 + frequency (semantic.lexical)
_FREQUENCY = (1 << _SLOT_SHIFT) - 1
_MIN_CAPACITY = 1024


def term_hash(term: str) -> int:
    """The key a term is held under (never one of the two marks of an unused entry)."""
    hashed = hash(term)
    return hashed + 2 if 0 <= hashed <= _REMOVED else hashed


class OneDocumentTerms:
    """A multimap from a term's hash to the postings held under it (linear probing).

    Not thread-safe: use from one thread (the event loop) only.
    """

    __slots__ = ("_hashes", "_postings", "_mask", "_live", "_used")

    def __init__(self, capacity: int = _MIN_CAPACITY) -> None:
        if capacity < 1 or capacity & (capacity - 1):
            raise ValueError(f"capacity must be a power of two, got {capacity}")
        self._empty(capacity)

    def _empty(self, capacity: int) -> None:
        self._hashes = array("q", bytes(8 * capacity))
        self._postings = array("Q", bytes(8 * capacity))
        self._mask = capacity - 1
        self._live = 0
        self._used = 0  # live and removed entries: what ends a search

    def __len__(self) -> int:
        return self._live

    def postings(self, hashed: int) -> list[int]:
        """The postings added under ``hashed`` (:func:`term_hash`) and not removed; usually none or one."""
        hashes = self._hashes
        mask = self._mask
        index = hashed & mask
        found: list[int] = []
        while True:
            held = hashes[index]
            if held == _EMPTY:
                return found
            if held == hashed:
                found.append(self._postings[index])
            index = (index + 1) & mask

    def add(self, hashed: int, posting: int) -> None:
        """Hold ``posting`` under ``hashed`` (another under the same hash stays)."""
        if 3 * (self._used + 1) > 2 * (self._mask + 1):
            self._rebuild()
        hashes = self._hashes
        mask = self._mask
        index = hashed & mask
        while hashes[index] > _REMOVED or hashes[index] < 0:
            index = (index + 1) & mask
        if hashes[index] == _EMPTY:
            self._used += 1
        hashes[index] = hashed
        self._postings[index] = posting
        self._live += 1

    def remove(self, hashed: int, slot: int, frequency: int | None = None) -> int:
        """Drop a posting of document ``slot`` (at ``frequency`` if given) held under ``hashed``
        and return it; raises ``KeyError`` when there is none. Two of one document under one
        hash (two terms of one hash) are told apart by their frequency or not at all."""
        hashes = self._hashes
        postings = self._postings
        mask = self._mask
        index = hashed & mask
        while True:
            held = hashes[index]
            if held == _EMPTY:
                raise KeyError(f"no posting of slot {slot} under hash {hashed}")
            if held == hashed and postings[index] >> _SLOT_SHIFT == slot and (
                    frequency is None or postings[index] & _FREQUENCY == frequency):
                hashes[index] = _REMOVED
                self._live -= 1
                return postings[index]
            index = (index + 1) & mask

    def _rebuild(self) -> None:
        """Into a table twice the live entries' need (or as small as it may be), without removed entries."""
        live = [(hashed, posting) for hashed, posting in zip(self._hashes, self._postings) if hashed > _REMOVED or hashed < 0]
        capacity = _MIN_CAPACITY
        while 3 * (len(live) + 1) > capacity:  # at most a third full after the rebuild
            capacity *= 2
        self._empty(capacity)
        for hashed, posting in live:
            self.add(hashed, posting)
