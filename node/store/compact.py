"""Records as they sit in memory: what many records have in common is held once.

A region's records are read far more often than written, and they repeat themselves: the same
capability (name, version, description, tags, examples) on every instance of a pool, the same
load, labels, callers and lease length on most, the same region and transport on all. Parsed
from JSON, each record nevertheless carries its own copies, and each pydantic model its own
fields-set and its own ``__dict__`` (832 B for the 26 fields, more than the record's data).
:func:`compact` makes a record's compact equal before it enters an index
(``node.cache.AgentIndex.put``): equal capabilities, capability lists, loads, labels and caller
lists become one shared object, repeated strings and numbers one object, every record of a model
shares one fields-set naming all its fields, and the instance is built attribute by attribute in
field order, so CPython gives it a key-sharing ``__dict__`` (the keys are held once per class;
280 B per record instead of 832). The endpoints, a dict of their own per record (their URLs
differ), are one whose keys are held once per set of endpoint names: 100 B instead of 184 for
the one endpoint most agents have (:func:`key_shared`). :func:`build` makes such an instance
from field values directly (``node.store.stored_records`` reads stored JSON that way). Measured in
``bench/scale.py``.

Sharing is safe because records and their parts are not mutated in place: changes make new
records (``model_copy``, whose ``__dict__`` copy stays key-sharing); the attributes assigned in
place, ``lease_expires_at_ms`` and ``load``, are replaced, never changed, and are already in the
shared fields-set. Dumps do not use ``exclude_unset``.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from ..core.models import AgentRecord, Capability, Load

__all__ = ["MAX_KEY_SETS", "MAX_SHARED", "blank_fields", "build", "compact", "holding", "is_compact", "key_shared", "share_callers",
           "share_capabilities", "share_capability", "share_labels", "share_load", "share_parts", "share_value",
           "shared_load"]

MAX_SHARED = 100_000  # distinct values a table remembers; beyond it the table starts again

_capabilities: dict[tuple[object, ...], Capability] = {}
_capability_lists: dict[tuple[int, ...], list[Capability]] = {}
_loads: dict[tuple[object, ...], Load] = {}
_labels: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
_caller_lists: dict[tuple[str, ...], list[str]] = {}
_key_holders: dict[tuple[str, ...], type] = {}  # per set of dict keys, the class whose instances hold them
MAX_KEY_SETS = 1_000  # sets of endpoint names given key-sharing dicts; beyond, dicts stay as they are
_texts: dict[object, Any] = {}  # strings and numbers that repeat across records (_REPEATED)
_all_fields: dict[type[BaseModel], set[str]] = {}
# Per model, the __dict__ build() copies and the all-fields set.
_templates: dict[type[BaseModel], tuple[dict[str, Any], set[str]]] = {}
_set = object.__setattr__
# Record fields whose values repeat across records (no bools among them: True == 1 in a table).
_REPEATED = ("region", "transport", "description", "lease_ttl_ms", "weight", "max_concurrency")

M = TypeVar("M", bound=BaseModel)
V = TypeVar("V")


def _fields_of(model: type[BaseModel]) -> set[str]:
    fields = _all_fields.get(model)
    if fields is None:
        # Shared, and mutable because pydantic's __setattr__ adds to it: it already holds every name.
        fields = _all_fields[model] = set(model.model_fields)
    return fields


def build(model: type[M], values: dict[str, Any]) -> M:
    """An instance of ``model`` holding ``values`` (every field, no other key; trusted: nothing
    is validated), with a key-sharing ``__dict__`` and the shared all-fields set. Raises
    ``TypeError`` when ``values`` does not name exactly the model's fields."""
    fields = blank_fields(model)
    size = len(fields)
    fields.update(values)
    if len(values) != size or len(fields) != size:
        raise TypeError(f"{model.__name__} has the fields {list(model.model_fields)}, not {list(values)}")
    return holding(model, fields)


def blank_fields(model: type[BaseModel]) -> dict[str, Any]:
    """A fresh ``__dict__`` for a compact instance of ``model``: every field, in field order,
    its keys shared with every other; set its values (only those keys: a new one makes it a dict
    of its own), then :func:`holding`."""
    held = _templates.get(model)
    if held is None:
        held = _templates[model] = (_prototype(model).__dict__, _fields_of(model))
    return held[0].copy()  # a copy of a key-sharing dict shares its keys too


def holding(model: type[M], fields: dict[str, Any]) -> M:
    """An instance of ``model`` whose ``__dict__`` is ``fields`` (from :func:`blank_fields`), with
    the shared all-fields set."""
    instance = model.__new__(model)
    _set(instance, "__dict__", fields)
    _set(instance, "__pydantic_fields_set__", _templates[model][1])
    _set(instance, "__pydantic_extra__", None)
    _set(instance, "__pydantic_private__", None)
    return instance


def _prototype(model: type[M]) -> M:
    """An instance holding every field, set attribute by attribute in field order: the order of
    the class's shared ``__dict__`` keys, which :func:`build` copies (instances of a class given
    their attributes in another order first were seen to get a dict of their own, 1,584 B)."""
    instance = model.__new__(model)
    fields = instance.__dict__  # a fresh one, sharing the class's keys
    for name, field in model.model_fields.items():
        fields[name] = field.get_default(call_default_factory=True)
    _set(instance, "__pydantic_fields_set__", _fields_of(model))
    _set(instance, "__pydantic_extra__", None)
    _set(instance, "__pydantic_private__", None)
    return instance


def _remembered(table: dict[Any, V], key: Any, value: V) -> V:
    """What ``table`` holds for ``key``, or ``value`` from now on."""
    shared = table.get(key)
    if shared is None:
        if len(table) >= MAX_SHARED:
            table.clear()
        shared = table[key] = value
    return shared


def _capability_key(c: Capability) -> tuple[object, ...]:
    return (c.name, c.version, c.description, len(c.tags), *c.tags, len(c.examples), *c.examples, *c.allowed_callers)


def share_capability(capability: Capability) -> Capability:
    """The one instance of capabilities equal to ``capability`` (compact, built once)."""
    key = _capability_key(capability)
    shared = _capabilities.get(key)
    if shared is None:
        shared = _remembered(_capabilities, key, build(Capability, dict(capability.__dict__)))
    return shared


def share_capabilities(capabilities: list[Capability]) -> list[Capability]:
    """One list of equal lists of shared capabilities (pass shared ones: the key is their ids)."""
    if len(_capabilities) >= MAX_SHARED - len(capabilities):
        _capability_lists.clear()  # its keys are ids of capabilities the table is about to drop
    return _remembered(_capability_lists, tuple(map(id, capabilities)), capabilities)


def share_load(load: Load) -> Load:
    """The one instance of loads equal to ``load`` (compact, built once)."""
    key = (load.queued, load.inflight, load.rps)
    shared = _loads.get(key)
    if shared is None:
        shared = _remembered(_loads, key, build(Load, dict(load.__dict__)))
    return shared


def shared_load(key: tuple[int, int, float]) -> Load | None:
    """The shared load of ``(queued, inflight, rps)`` if one is held."""
    return _loads.get(key)


def share_value(value: V) -> V:
    """The one object of values equal to ``value``: a string or number that repeats across
    records (not a bool: ``True == 1`` in a table; not a float: ``1.0 == 1``)."""
    if len(_texts) >= MAX_SHARED:
        _texts.clear()
    return _texts.setdefault(value, value)  # type: ignore[return-value]


def share_labels(labels: dict[str, str]) -> dict[str, str]:
    return _remembered(_labels, tuple(labels.items()), labels)


def share_callers(callers: list[str]) -> list[str]:
    return _remembered(_caller_lists, tuple(callers), callers)


def key_shared(mapping: dict[str, V]) -> dict[str, V]:
    """A dict equal to ``mapping`` (same keys, order and values) whose keys are held once for
    every dict of the same keys: the ``__dict__`` of an instance of a class made for those keys
    (CPython's key-sharing dicts). A plain ``dict`` to every reader; one that is changed turns
    into an ordinary dict of its own. ``mapping`` itself when too many sets of keys were seen.
    (A copy of such a dict shares the keys too, but measured 337 B against 99 for one endpoint:
    it sizes its values for the class's whole table of keys.)"""
    names = tuple(mapping)
    holder = _key_holders.get(names)
    if holder is None:
        if len(_key_holders) >= MAX_KEY_SETS:
            return mapping
        holder = _key_holders[names] = type("KeyHolder", (), {"__module__": __name__})
    instance = object.__new__(holder)
    for name, value in mapping.items():  # always in the same order: the keys stay shared
        _set(instance, name, value)
    return instance.__dict__  # the instance goes; the dict holds the values from now on


for _model in (AgentRecord, Capability, Load):  # their keys' order is set here, before any other instance
    _templates[_model] = (_prototype(_model).__dict__, _fields_of(_model))


def is_compact(record: BaseModel) -> bool:
    """Whether ``record`` was built compact (a copy is not: pydantic gives it a fields-set of its own)."""
    return record.__pydantic_fields_set__ is _all_fields.get(type(record))


def compact(record: AgentRecord) -> AgentRecord:
    """A compact record equal to ``record`` (``record`` itself is left as it is, and returned if
    it is compact already)."""
    if is_compact(record):
        return record
    values = dict(record.__dict__)
    share_parts(values)
    values["capabilities"] = share_capabilities([share_capability(c) for c in record.capabilities])
    values["load"] = share_load(record.load)
    return build(AgentRecord, values)


def share_parts(values: dict[str, Any]) -> None:
    """Replace the plain parts of a record's ``values`` by their shared equals (in place)."""
    texts = _texts
    if len(texts) >= MAX_SHARED:
        texts.clear()
    for name in _REPEATED:
        value = values[name]
        values[name] = texts.setdefault(value, value)
    if values["updated_at_ms"] == values["registered_at_ms"]:
        values["updated_at_ms"] = values["registered_at_ms"]
    values["labels"] = share_labels(values["labels"])
    values["endpoints"] = key_shared(values["endpoints"])
    values["allowed_callers"] = share_callers(values["allowed_callers"])
