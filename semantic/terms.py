"""Terms that one document alone holds, kept without their strings (``semantic.lexical``).

Most distinct terms of a registry belong to one document each: an agent's number or id and the
word pairs around it. Held as dict keys, each cost its string, its entry in the interpreter's
table of interned strings and its dict entry — about 140 B a term, 420 B per agent in
``bench/scale.py``. :class:`OneDocumentTerms` holds such a term as its posting and 32 bits of
its hash (the tag, which also picks its place), in two arrays: an open-addressing table (linear
probing) kept between 3/8 and 3/4 full, 12 B an entry, 16–32 B a term.

A hash does not name a term, let alone 32 bits of one: two terms may share them. The table
therefore answers "which postings were added under this hash" (:meth:`OneDocumentTerms.postings`,
which may name a few more), and its user checks a candidate against the document's own terms
before taking it for the term (``LexicalIndex``), so two terms of one hash stay two terms.
"""

from __future__ import annotations

from array import array

import numpy as np

__all__ = ["OneDocumentTerms", "term_hash"]

_EMPTY = 0
_REMOVED = 1  # a removed entry: a search goes on past it, an insertion may take it
_SLOT_SHIFT = 32  # a posting is slot * 2**32 + frequency (semantic.lexical)
_FREQUENCY = (1 << _SLOT_SHIFT) - 1
_MIN_CAPACITY = 1024


def term_hash(term: str) -> int:
    """The tag a term is held under: 32 bits of its hash, never a mark of an unused entry."""
    tag = hash(term) & 0xFFFF_FFFF
    return tag + 2 if tag <= _REMOVED else tag


class OneDocumentTerms:
    """A multimap from a term's tag (:func:`term_hash`) to the postings held under it.

    Not thread-safe: use from one thread (the event loop) only.
    """

    __slots__ = ("_tags", "_postings", "_mask", "_live", "_used")

    def __init__(self, capacity: int = _MIN_CAPACITY) -> None:
        if capacity < 1 or capacity & (capacity - 1):
            raise ValueError(f"capacity must be a power of two, got {capacity}")
        self._empty(capacity)

    def _empty(self, capacity: int) -> None:
        self._tags = array("I", bytes(4 * capacity))
        if self._tags.itemsize != 4:
            raise RuntimeError("array('I') is not 32 bits on this platform")
        self._postings = array("Q", bytes(8 * capacity))
        self._mask = capacity - 1
        self._live = 0
        self._used = 0  # live and removed entries: what ends a search

    def __len__(self) -> int:
        return self._live

    def postings(self, tag: int) -> list[int]:
        """The postings added under ``tag`` (:func:`term_hash`) and not removed; usually none or one."""
        tags = self._tags
        mask = self._mask
        index = tag & mask
        found: list[int] = []
        while True:
            held = tags[index]
            if held == _EMPTY:
                return found
            if held == tag:
                found.append(self._postings[index])
            index = (index + 1) & mask

    def add(self, tag: int, posting: int) -> None:
        """Hold ``posting`` under ``tag`` (another under the same tag stays)."""
        if 4 * (self._used + 1) > 3 * (self._mask + 1):
            self._rebuild()
        tags = self._tags
        mask = self._mask
        index = tag & mask
        while tags[index] > _REMOVED:
            index = (index + 1) & mask
        if tags[index] == _EMPTY:
            self._used += 1
        tags[index] = tag
        self._postings[index] = posting
        self._live += 1

    def remove(self, tag: int, slot: int, frequency: int | None = None) -> int:
        """Drop a posting of document ``slot`` (at ``frequency`` if given) held under ``tag``
        and return it; raises ``KeyError`` when there is none. Two of one document under one
        tag (two terms of one tag) are told apart by their frequency or not at all."""
        tags = self._tags
        postings = self._postings
        mask = self._mask
        index = tag & mask
        while True:
            held = tags[index]
            if held == _EMPTY:
                raise KeyError(f"no posting of slot {slot} under tag {tag}")
            if held == tag and postings[index] >> _SLOT_SHIFT == slot and (
                    frequency is None or postings[index] & _FREQUENCY == frequency):
                tags[index] = _REMOVED
                self._live -= 1
                return postings[index]
            index = (index + 1) & mask

    def _rebuild(self) -> None:
        """Into a table at most half full (or as small as it may be), without removed entries.

        Vectorised (a Python loop over a million entries held the event loop about a second):
        entries sorted by their new place take, as linear probing would, the first free place
        from there on, ``place[i] = max(home[i], place[i - 1] + 1)``, a running maximum; the few
        that run past the end wrap round to the first free places from the start.
        """
        tags = np.frombuffer(self._tags, dtype=np.uint32)
        keep = tags > _REMOVED
        live_tags = tags[keep]
        live_postings = np.frombuffer(self._postings, dtype=np.uint64)[keep]
        capacity = _MIN_CAPACITY
        while 2 * (len(live_tags) + 1) > capacity:
            capacity *= 2
        homes = (live_tags & np.uint32(capacity - 1)).astype(np.int64)
        order = np.argsort(homes)
        steps = np.arange(len(order), dtype=np.int64)
        places = np.maximum.accumulate(homes[order] - steps) + steps if len(order) else steps
        new_tags = np.zeros(capacity, dtype=np.uint32)
        new_postings = np.zeros(capacity, dtype=np.uint64)
        inside = places < capacity
        new_tags[places[inside]] = live_tags[order[inside]]
        new_postings[places[inside]] = live_postings[order[inside]]
        self._tags = array("I", new_tags.tobytes())
        self._postings = array("Q", new_postings.tobytes())
        self._mask = capacity - 1
        self._live = self._used = int(inside.sum())
        for row in order[~inside]:  # past the end: on from the start
            self.add(int(live_tags[row]), int(live_postings[row]))
