"""The Porter (1980) stemming algorithm, for the BM25 tokenizer.

A plain suffix list cannot fold both "translation"->"translate" and "recommendation"->"recommend";
Porter's measure-based conditions do. Implemented from the published description (with the
widely used BLI->BLE and LOGI->LOG amendments), pure Python, no state.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["porter_stem"]

_VOWELS = frozenset("aeiou")


def _is_consonant(word: str, index: int) -> bool:
    letter = word[index]
    if letter in _VOWELS:
        return False
    if letter == "y":
        return index == 0 or not _is_consonant(word, index - 1)
    return True


def _measure(stem: str) -> int:
    """Number of vowel-consonant sequences: m in [C](VC)^m[V]."""
    count = 0
    previous_vowel = False
    for index in range(len(stem)):
        consonant = _is_consonant(stem, index)
        if consonant and previous_vowel:
            count += 1
        previous_vowel = not consonant
    return count


def _has_vowel(stem: str) -> bool:
    return any(not _is_consonant(stem, index) for index in range(len(stem)))


def _ends_double_consonant(word: str) -> bool:
    return len(word) >= 2 and word[-1] == word[-2] and _is_consonant(word, len(word) - 1)


def _ends_cvc(word: str) -> bool:
    if len(word) < 3:
        return False
    last = len(word) - 1
    return (
        _is_consonant(word, last - 2)
        and not _is_consonant(word, last - 1)
        and _is_consonant(word, last)
        and word[last] not in "wxy"
    )


def _replace_if_measure(word: str, rules: tuple[tuple[str, str], ...], minimum: int) -> str:
    # Only the longest matching suffix is considered; a failed condition ends the step.
    for suffix, replacement in rules:
        if word.endswith(suffix):
            stem = word[: -len(suffix)]
            return stem + replacement if _measure(stem) > minimum else word
    return word


_STEP2 = (
    ("ational", "ate"), ("tional", "tion"), ("enci", "ence"), ("anci", "ance"), ("izer", "ize"),
    ("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous"),
    ("ization", "ize"), ("ation", "ate"), ("ator", "ate"), ("alism", "al"), ("iveness", "ive"),
    ("fulness", "ful"), ("ousness", "ous"), ("aliti", "al"), ("iviti", "ive"), ("biliti", "ble"),
    ("logi", "log"),
)
_STEP3 = (
    ("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"),
    ("ful", ""), ("ness", ""),
)
_STEP4 = (
    "al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "ion",
    "ou", "ism", "ate", "iti", "ous", "ive", "ize",
)


def _sorted_longest_first(rules: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(rules, key=lambda rule: -len(rule[0])))


_STEP2_ORDERED = _sorted_longest_first(_STEP2)
_STEP3_ORDERED = _sorted_longest_first(_STEP3)
_STEP4_ORDERED = tuple(sorted(_STEP4, key=len, reverse=True))


def _step1(word: str) -> str:
    if word.endswith(("sses", "ies")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]

    stripped = False
    if word.endswith("eed"):
        if _measure(word[:-3]) > 0:
            word = word[:-1]
    elif word.endswith("ed") and _has_vowel(word[:-2]):
        word, stripped = word[:-2], True
    elif word.endswith("ing") and _has_vowel(word[:-3]):
        word, stripped = word[:-3], True
    if stripped:
        if word.endswith(("at", "bl", "iz")):
            word += "e"
        elif _ends_double_consonant(word) and word[-1] not in "lsz":
            word = word[:-1]
        elif _measure(word) == 1 and _ends_cvc(word):
            word += "e"

    if word.endswith("y") and _has_vowel(word[:-1]):
        word = word[:-1] + "i"
    return word


def _step4(word: str) -> str:
    for suffix in _STEP4_ORDERED:
        if word.endswith(suffix):
            stem = word[: -len(suffix)]
            if _measure(stem) <= 1:
                return word
            if suffix == "ion" and not stem.endswith(("s", "t")):
                return word
            return stem
    return word


def _step5(word: str) -> str:
    if word.endswith("e"):
        stem = word[:-1]
        measure = _measure(stem)
        if measure > 1 or (measure == 1 and not _ends_cvc(stem)):
            word = stem
    if word.endswith("ll") and _measure(word) > 1:
        word = word[:-1]
    return word


@lru_cache(maxsize=65_536)
def porter_stem(word: str) -> str:
    """Porter stem of a lower-case word (words of 1-2 letters are returned unchanged)."""
    if len(word) <= 2:
        return word
    word = _step1(word)
    word = _replace_if_measure(word, _STEP2_ORDERED, 0)
    word = _replace_if_measure(word, _STEP3_ORDERED, 0)
    word = _step4(word)
    return _step5(word)
