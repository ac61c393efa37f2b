"""Records read back from the region's own Redis: parsed by orjson, checked for shape, built compact.

Every record in the region's hash, its change stream and the federation replica was validated
by a node before it was written, so reading one back needs to know only that it is still a record
of this schema: the fields named exactly, each of its JSON type. :func:`read_record` checks that
much (about 3 µs) and builds the compact record (``node.compact``) without pydantic validating it
again (about 9 µs plus a 832-byte ``__dict__`` and a fields-set per record); a new capability,
load, probe or card is validated by its own model once. Anything else — a foreign writer's
value, another schema, JSON that does not parse — goes through ``AgentRecord.model_validate_json``,
whose error the store quarantines as before. Peers' snapshots are not read here: what crosses a
trust boundary is validated in full (``federation.snapshot_reader``).
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import orjson

from .compact import (
    build,
    capability_key,
    compact,
    share_capabilities,
    share_capability,
    share_load,
    share_parts,
    shared_capability,
    shared_load,
)
from .models import AgentRecord, Capability, CardListing, Load, Probe, Status

__all__ = ["WrittenRecords", "read_record"]

_NONE = type(None)
# Fields with a plain JSON value: the types it may have (exactly: a bool is no int here).
_PLAIN: dict[str, tuple[type, ...]] = {
    "agent_id": (str,), "display_name": (str,), "description": (str,), "callback_endpoint": (str, _NONE),
    "transport": (str,), "lease_ttl_ms": (int,), "weight": (int,), "max_concurrency": (int, _NONE),
    "semantic_fallback": (bool,), "region": (str,), "version": (int,), "registered_at_ms": (int,),
    "updated_at_ms": (int,), "lease_expires_at_ms": (int,), "live": (bool,), "ready": (bool,),
    "probe_error": (str, _NONE),
}
_PLAIN_TYPES = frozenset(itertools.product(*_PLAIN.values()))  # every combination the optional fields allow
_plain_values = operator.itemgetter(*_PLAIN)
_counts = operator.itemgetter("lease_ttl_ms", "weight", "version", "registered_at_ms", "updated_at_ms",
                              "lease_expires_at_ms")
_RECORD_FIELDS = frozenset(AgentRecord.model_fields)
_CAPABILITY_FIELDS = frozenset(Capability.model_fields)
_LOAD_FIELDS = frozenset(Load.model_fields)
_CAPABILITY_TYPES = {"name": str, "version": str, "description": str}
_LOAD_TYPES = {"queued": int, "inflight": int, "rps": float}
_STATUSES = {status.value: status for status in Status}


class _NotPlain(Exception):
    """The stored value is not this schema's plain record: pydantic reads it (and says why)."""


def read_record(raw: str | bytes) -> AgentRecord:
    """The record stored as ``raw``, compact; raises pydantic's ``ValidationError`` (a
    ``ValueError``) when it is not one."""
    try:
        return _built(orjson.loads(raw))
    except (_NotPlain, orjson.JSONDecodeError):
        return compact(AgentRecord.model_validate_json(raw))


def _built(data: Any) -> AgentRecord:
    if type(data) is not dict or data.keys() != _RECORD_FIELDS:
        raise _NotPlain
    if tuple(map(type, _plain_values(data))) not in _PLAIN_TYPES or min(_counts(data)) < 0:
        raise _NotPlain
    if data["max_concurrency"] is not None and data["max_concurrency"] < 0:
        raise _NotPlain
    status = data["status"]
    if type(status) is not str or status not in _STATUSES:
        raise _NotPlain
    data["status"] = _STATUSES[status]
    data["endpoints"] = _strings_by_name(data["endpoints"])
    if "primary" not in data["endpoints"]:
        raise _NotPlain
    data["labels"] = _strings_by_name(data["labels"])
    data["allowed_callers"] = _strings(data["allowed_callers"])
    data["capabilities"] = share_capabilities([_capability(item) for item in _list(data["capabilities"])])
    data["load"] = _load(data["load"])
    for name, model in (("liveness_probe", Probe), ("readiness_probe", Probe), ("a2a", CardListing)):
        if data[name] is not None:
            data[name] = model.model_validate(data[name])
    share_parts(data)
    return build(AgentRecord, data)


def _list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise _NotPlain
    return value


def _strings(value: Any) -> list[str]:
    for item in _list(value):
        if type(item) is not str:
            raise _NotPlain
    return value


def _strings_by_name(value: Any) -> dict[str, str]:
    if type(value) is not dict:
        raise _NotPlain
    for item in value.values():
        if type(item) is not str:
            raise _NotPlain
    return value


def _values(item: Any, fields: frozenset[str], plain: dict[str, type]) -> list[Any]:
    """The ``plain`` values of a JSON object naming exactly ``fields``, each of its type."""
    if type(item) is not dict or item.keys() != fields:
        raise _NotPlain
    values = []
    for name, kind in plain.items():
        value = item[name]
        if type(value) is not kind:
            raise _NotPlain
        values.append(value)
    return values


def _capability(item: Any) -> Capability:
    name, version, description = _values(item, _CAPABILITY_FIELDS, _CAPABILITY_TYPES)
    key = capability_key(name, version, description, _strings(item["tags"]), _strings(item["examples"]))
    held = shared_capability(key)
    return held if held is not None else share_capability(Capability.model_validate(item))


def _load(item: Any) -> Load:
    queued, inflight, rps = _values(item, _LOAD_FIELDS, _LOAD_TYPES)
    held = shared_load((queued, inflight, rps))
    if held is not None:
        return held
    if queued < 0 or inflight < 0 or not 0.0 <= rps <= 1e15:
        raise _NotPlain
    return share_load(Load.model_construct(queued=queued, inflight=inflight, rps=rps))


class WrittenRecords:
    """What this process wrote lately, by agent: the record JSON as sent and the record.

    The change stream hands the same JSON back (with its version spliced in first, see
    ``node.store_scripts``); :meth:`recall` then copies the record instead of reading the JSON
    again, for the readers of this process's own writes (the cache's tail, the publisher). The
    records are held compact: 10,000 of them held 38 MB as parsed.
    """

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._records: dict[str, tuple[str, AgentRecord]] = {}

    def remember(self, agent_id: str, body: str, record: AgentRecord) -> None:
        records = self._records
        records.pop(agent_id, None)
        records[agent_id] = (body, compact(record))
        if len(records) > self.limit:
            del records[next(iter(records))]

    def recall(self, agent_id: str, version: int, raw: str) -> AgentRecord:
        """The record a change entry's ``raw`` JSON holds: the one written here if it is that JSON, else read."""
        memo = self._records.get(agent_id)
        if memo is not None:
            body, record = memo
            # raw is '{"version":N,' + body[1:]
            if len(raw) - len(body) == len(str(version)) + 11 and raw.endswith(body[1:]):
                return build(AgentRecord, {**record.__dict__, "version": version})  # compact, like the memo
        return read_record(raw)
