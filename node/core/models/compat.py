"""Reading what a newer version of this code wrote: fields it does not know are dropped, not fatal.

The models refuse unknown fields (``Strict``), and that stays the rule for what a caller or an
agent sends: a mistyped field is a 4xx naming it. Bytes written by *another version of this
code* are different: during a rolling upgrade a newer node replica writes records that older
replicas of the same region read, a newer region sends change events, snapshots and answers to
older peers, and a newer node answers older SDK clients. A field added there must not make the
older reader quarantine the record, skip the event or fail the call. So these readers go through
:func:`read_json` / :func:`read_python`: the strict reading first (the common case costs nothing
more); when the only problems are unknown fields, those fields are dropped and the rest is read
as strictly as before. Any other problem raises the original error.

Tokens and route credentials are not read this way: a claim an older node does not know may
restrict what its bearer may do, so they fail closed (``node.trust.tokens``, ``node.client.verifier``).

The rule for writers, in ``docs/events.md``: a field may be added within a schema version only if
a reader that ignores it stays correct; a field that restricts (who may see or call an agent)
comes with a new schema version, which older readers skip rather than misread.

:data:`DROPPED` counts what was dropped, by model and field path (bounded; :func:`dropped_total`
for ``/metrics``), and the first drop of each field is logged: an operator sees which version
wrote what.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

__all__ = ["DROPPED", "dropped_total", "read_json", "read_python"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

_MAX_PATHS = 256  # distinct (model, path) pairs counted by name; more only add to the total
DROPPED: Counter[tuple[str, str]] = Counter()
_total = [0]


def read_json(model: type[M], raw: str | bytes, **options: Any) -> M:
    """``model.model_validate_json(raw, **options)``, dropping fields unknown to ``model`` (see the module doc)."""
    try:
        return model.model_validate_json(raw, **options)
    except ValidationError as exc:
        unknown = _only_unknown(exc)
        try:
            pruned = None if unknown is None else _pruned(orjson.loads(raw), unknown)
        except orjson.JSONDecodeError:
            pruned = None
        if pruned is None:
            raise
        value = model.model_validate_json(orjson.dumps(pruned), **options)
    _count(model, unknown)
    return value


def read_python(model: type[M], data: object, **options: Any) -> M:
    """``model.model_validate(data, **options)``, dropping fields unknown to ``model``; ``data`` is not changed."""
    try:
        return model.model_validate(data, **options)
    except ValidationError as exc:
        unknown = _only_unknown(exc)
        pruned = None if unknown is None else _pruned(data, unknown)
        if pruned is None:
            raise
        value = model.model_validate(pruned, **options)
    _count(model, unknown)
    return value


def dropped_total() -> int:
    """Unknown fields dropped since the process started."""
    return _total[0]


def _only_unknown(exc: ValidationError) -> list[tuple[int | str, ...]] | None:
    """The locations of the unknown fields, or None when anything else is wrong too."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    if not errors or any(error["type"] != "extra_forbidden" for error in errors):
        return None
    return [tuple(error["loc"]) for error in errors]


def _pruned(data: object, locations: Sequence[tuple[int | str, ...]]) -> object | None:
    """``data`` without the fields at ``locations``, copying only the objects and lists on their
    paths; None when a location is not a plain path of keys and indexes (a union member's tag,
    say): the caller then raises the original error."""
    copies: dict[int, Any] = {}

    def copied(value: object) -> Any:
        if isinstance(value, dict):
            made = dict(value)
        elif isinstance(value, list):
            made = list(value)
        else:
            raise TypeError("not a JSON object or array")
        copies[id(made)] = made
        return made

    try:
        root = copied(data)
        for location in locations:
            holder = root
            for step in location[:-1]:
                child = holder[step]
                if id(child) not in copies:
                    child = holder[step] = copied(child)
                holder = child
            if not isinstance(holder, dict) or location[-1] not in holder:
                return None
            del holder[location[-1]]
    except (KeyError, IndexError, TypeError):
        return None
    return root


def _count(model: type[BaseModel], locations: Sequence[tuple[int | str, ...]]) -> None:
    for location in locations:
        path = ".".join("[]" if isinstance(step, int) else str(step) for step in location)
        key = (model.__name__, path)
        if key in DROPPED or len(DROPPED) < _MAX_PATHS:
            if key not in DROPPED:
                log.warning("dropped the field %s of a %s this version does not know (written by a newer one?)",
                            path, model.__name__)
            DROPPED[key] += 1
        _total[0] += 1
