"""Records as they sit in memory: what many records have in common is held once.

A region's records are read far more often than written, and they repeat themselves: the same
capability (name, version, description, tags, examples) on every instance of a pool, the same
load on most, the same region and transport on all. Parsed from JSON, each record nevertheless
carries its own copies, and each pydantic model carries its own set of the fields that were
given (2 KiB for a 25-field record, more than the record's data). :func:`compact` rewrites a
record in place before it enters an index (``node.cache.AgentIndex.put``): equal capabilities
and loads become one shared object, repeated strings one interned string, and every record of a
model shares one fields-set naming all its fields. About 5.7 KiB → 2 KiB per record (measured
in ``bench/scale.py``).

Sharing is safe because records and their parts are not mutated in place: changes make new
records (``model_copy``), whose fields-set is a copy; the one attribute assigned in place,
``lease_expires_at_ms``, is already in the shared set. Dumps do not use ``exclude_unset``.
"""

from __future__ import annotations

import sys
from typing import TypeVar

from pydantic import BaseModel

from .models import AgentRecord, Capability, Load

__all__ = ["MAX_SHARED", "WrittenRecords", "compact", "shared_load"]

MAX_SHARED = 100_000  # distinct capabilities / loads remembered; beyond it the tables start again

_capabilities: dict[tuple[object, ...], Capability] = {}
_loads: dict[tuple[object, ...], Load] = {}
_all_fields: dict[type[BaseModel], set[str]] = {}


def _fields_of(model: type[BaseModel]) -> set[str]:
    fields = _all_fields.get(model)
    if fields is None:
        fields = _all_fields[model] = set(model.model_fields)
    return fields


def _share_fields(instance: BaseModel) -> None:
    object.__setattr__(instance, "__pydantic_fields_set__", _fields_of(type(instance)))


S = TypeVar("S", bound=BaseModel)


def _shared(table: dict[tuple[object, ...], S], key: tuple[object, ...], value: S) -> S:
    """The instance ``table`` holds for ``key``, or ``value`` (made compact) from now on."""
    shared = table.get(key)
    if shared is None:
        if len(table) >= MAX_SHARED:
            table.clear()
        _share_fields(value)
        shared = table[key] = value
    return shared


def compact(record: AgentRecord) -> AgentRecord:
    """``record``, its parts shared with equal ones already seen (in place; returns it)."""
    fields = record.__dict__
    _share_fields(record)
    capabilities = record.capabilities
    for position, c in enumerate(capabilities):
        capabilities[position] = _shared(_capabilities, (c.name, c.version, c.description, *c.tags, "\0", *c.examples), c)
    fields["load"] = shared_load(record.load)
    fields["region"] = sys.intern(record.region)
    fields["transport"] = sys.intern(record.transport)
    return record


def shared_load(load: Load) -> Load:
    """The one instance of loads equal to ``load`` (``load`` itself the first time)."""
    return _shared(_loads, (load.queued, load.inflight, load.rps), load)


class WrittenRecords:
    """What this process wrote lately, by agent: the record JSON as sent and the record.

    The change stream hands the same JSON back (with its version spliced in first, see
    ``node.store_scripts``); :meth:`recall` then copies the record instead of validating the JSON
    again, for the readers of this process's own writes (the cache's tail, the publisher).
    """

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._records: dict[str, tuple[str, AgentRecord]] = {}

    def remember(self, agent_id: str, body: str, record: AgentRecord) -> None:
        records = self._records
        records.pop(agent_id, None)
        records[agent_id] = (body, record)
        if len(records) > self.limit:
            del records[next(iter(records))]

    def recall(self, agent_id: str, version: int, raw: str) -> AgentRecord:
        """The record a change entry's ``raw`` JSON holds: the one written here if it is that JSON, else parsed."""
        memo = self._records.get(agent_id)
        if memo is not None:
            body, record = memo
            # raw is '{"version":N,' + body[1:]
            if len(raw) - len(body) == len(str(version)) + 11 and raw.endswith(body[1:]):
                return record.model_copy(update={"version": version})
        return AgentRecord.model_validate_json(raw)
