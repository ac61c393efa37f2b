"""Capability versions and what a caller accepts of them (``1``, ``v1.2``, ``>=1.2,<3``).

This module does no I/O.
"""

from __future__ import annotations

from functools import lru_cache

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version


@lru_cache(maxsize=65_536)
def parse_version(text: str) -> Version:
    """Parse a capability version; ``v1`` and ``1`` are the same version.

    Cached: every record's capabilities are checked at each parse (a region reload parses them
    all), and a region has few distinct versions; a Version is immutable.
    """
    try:
        return Version(text.strip().lstrip("vV"))
    except InvalidVersion as exc:
        raise ValueError(f"{text!r} is not a version (use e.g. '1', 'v2' or '1.4.0')") from exc


class VersionConstraint:
    """What a caller accepts: ``1`` / ``v1.2`` (same major, at least that) or a PEP 440 set."""

    __slots__ = ("text", "_major", "_minimum", "_specifiers")

    def __init__(self, text: str) -> None:
        self.text = text
        self._major: int | None = None
        self._minimum: Version | None = None
        self._specifiers: SpecifierSet | None = None
        stripped = text.strip()
        if stripped[:1] in "<>=!~":
            try:
                self._specifiers = SpecifierSet(stripped)
            except InvalidSpecifier as exc:
                raise ValueError(f"{text!r} is not a version constraint (e.g. '1', '>=1.2,<3')") from exc
        else:
            self._minimum = parse_version(stripped)
            self._major = self._minimum.major

    def accepts(self, version: Version) -> bool:
        if self._specifiers is not None:
            return self._specifiers.contains(version, prereleases=True)
        return version.major == self._major and version >= self._minimum  # type: ignore[operator]


@lru_cache(maxsize=4096)
def version_constraint(text: str) -> VersionConstraint:
    """A parsed (and cached: constraints repeat across requests) version constraint."""
    return VersionConstraint(text)
