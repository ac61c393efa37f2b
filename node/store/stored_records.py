"""Records read back from the region's own Redis: checked in one pass, built compact.

Every record in the region's hash, its change stream and the federation replica was validated
by a node before it was written, so reading one back checks that it is still a record of this
schema — the fields named exactly, each of its JSON type and within the model's patterns,
lengths and bounds — without running the model's Python validators again. :func:`read_record`
decodes the JSON with msgspec into a strict mirror of the record (:class:`_Stored`: field
names, JSON types, lengths and numeric bounds, checked in C while decoding: 1.5 µs a record
here, against pydantic-core's 6–9 µs for the same checks and pydantic's 15–23 µs with the
model's validators, on a busy machine); the patterns are checked after, each distinct value once: what repeats across
records (region, transport, description, capabilities, labels, callers, endpoint names) is
looked up among the values already checked, which are also the shared objects the compact record
holds (``node.store.compact``), and only the agent id and the display name are matched per record.
Not checked again: the forms of endpoint URLs and the syntax of caller patterns (a foreign
writer's well-typed URL is served as written; the egress policy still judges every address the
node contacts). A new capability is validated by its own model the first time it is seen, a
probe or a card by its own model whenever a record has one. Anything
else — a foreign writer's value, another schema, JSON that does not parse — goes through
``AgentRecord.model_validate_json``, which reads it as it always did or raises the error the
store quarantines. Peers' snapshots are not read here: what crosses a trust boundary is
validated in full (``federation.snapshot_reader``).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta, Struct
from pydantic import BaseModel, ValidationError

from ..core.models import (
    AGENT_ID_PATTERN,
    ENDPOINT_NAME_PATTERN,
    INT64_MAX,
    LABEL_KEY_PATTERN,
    MAX_LEASE_TTL_MS,
    MIN_LEASE_TTL_MS,
    MULTI_LINE_PATTERN,
    REGION_PATTERN,
    SINGLE_LINE_PATTERN,
    TRANSPORT_PATTERN,
    AgentRecord,
    Capability,
    CardListing,
    Load,
    Probe,
    Status,
    compat,
)
from .compact import (
    MAX_SHARED,
    blank_fields,
    build,
    compact,
    holding,
    key_shared,
    share_callers,
    share_capabilities,
    share_capability,
    share_labels,
    share_load,
    share_value,
    shared_load,
)

__all__ = ["WrittenRecords", "read_record", "stored_version"]

_Count = Annotated[int, Meta(ge=0, le=INT64_MAX)]
_Url = Annotated[str, Meta(max_length=2_000)]
_Line = Annotated[str, Meta(max_length=200)]  # and SINGLE_LINE_PATTERN, checked after decoding


class _StoredCapability(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """A capability by JSON type (hashable: the key of the capabilities checked before); its
    model validates it in full the first time it is seen."""

    name: str
    version: str
    description: str
    tags: tuple[str, ...]
    examples: tuple[str, ...]
    allowed_callers: tuple[str, ...] = ()  # absent from records written before capabilities had callers


class _StoredLoad(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    queued: _Count
    inflight: _Count
    rps: Annotated[float, Meta(ge=0.0, le=1e15)]


class _Stored(Struct, forbid_unknown_fields=True, gc=False):
    """An :class:`~node.core.models.AgentRecord` as stored, by JSON type, lengths and bounds, its
    fields in the model's order (tests check it names every field); the patterns are checked
    after decoding (:func:`_compact_record`); what it leaves to the Python validators — URL
    forms, caller-pattern syntax — is listed in the module doc."""

    agent_id: _Line
    display_name: _Line
    description: Annotated[str, Meta(max_length=4_000)]
    capabilities: Annotated[tuple[_StoredCapability, ...], Meta(max_length=64)]
    endpoints: Annotated[dict[str, _Url], Meta(min_length=1, max_length=16)]
    callback_endpoint: _Url | None
    transport: str
    liveness_probe: dict[str, Any] | None
    readiness_probe: dict[str, Any] | None
    lease_ttl_ms: Annotated[int, Meta(ge=MIN_LEASE_TTL_MS, le=MAX_LEASE_TTL_MS)]
    labels: Annotated[dict[str, _Line], Meta(max_length=64)]
    weight: Annotated[int, Meta(ge=0, le=10_000)]
    max_concurrency: Annotated[int, Meta(ge=1, le=1_000_000)] | None
    allowed_callers: Annotated[tuple[_Line, ...], Meta(max_length=64)]
    semantic_fallback: bool
    status: Status
    region: Annotated[str, Meta(max_length=63)]
    version: _Count
    load: _StoredLoad
    registered_at_ms: _Count
    updated_at_ms: _Count
    lease_expires_at_ms: _Count
    live: bool
    ready: bool
    probe_error: str | None
    a2a: dict[str, Any] | None


_decode = msgspec.json.Decoder(_Stored).decode
_values_of = msgspec.structs.asdict
_fields_in_order = msgspec.structs.astuple
_NAMES = _Stored.__struct_fields__  # the model's, in its order
DEFAULT_WRITTEN_LIMIT = 2_000  # writes remembered (WrittenRecords): ~1.2 KiB each


def _matcher(pattern: str) -> Callable[[str], object]:
    return re.compile(pattern).fullmatch  # fullmatch: "$" alone would also match before a final newline


_agent_id_form = _matcher(AGENT_ID_PATTERN)
_one_line = _matcher(SINGLE_LINE_PATTERN)
_region_form = _matcher(REGION_PATTERN)
_transport_form = _matcher(TRANSPORT_PATTERN)
_prose = _matcher(MULTI_LINE_PATTERN)
_label_key_form = _matcher(LABEL_KEY_PATTERN)
_endpoint_name_form = _matcher(ENDPOINT_NAME_PATTERN)

# The values checked before, by field, each the one object the records hold (bounded by MAX_SHARED).
_regions_seen: dict[str, str] = {}
_transports_seen: dict[str, str] = {}
_descriptions_seen: dict[str, str] = {}
_endpoint_names_seen: dict[tuple[str, ...], bool] = {}
_labels_seen: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
_callers_seen: dict[tuple[str, ...], list[str]] = {}
_capabilities_seen: dict[tuple[_StoredCapability, ...], list[Capability]] = {}
_TEXTS_SEEN = ((_regions_seen, _transports_seen, _descriptions_seen), (_region_form, _transport_form, _prose))
M = TypeVar("M", bound=BaseModel)


def read_record(raw: str | bytes, *, lease_expires_at_ms: int | None = None, load: Load | None = None) -> AgentRecord:
    """The record stored as ``raw``, compact; raises pydantic's ``ValidationError`` (a
    ``ValueError``) when it is not one. ``lease_expires_at_ms``: the lease to hold instead of the
    one in ``raw`` (the store's leases set is the truth); ``load``: the load to hold instead of
    the one in ``raw`` (the one reported since, ``node.store.loads``)."""
    try:
        record = _compact_record(_decode(raw), lease_expires_at_ms, load)
    except (msgspec.DecodeError, ValidationError):  # msgspec's ValidationError is a DecodeError
        record = None
    if record is None:
        record = compact(compat.read_json(AgentRecord, raw))  # pydantic's reading, or its error
        if lease_expires_at_ms is not None:
            record.lease_expires_at_ms = lease_expires_at_ms
        if load is not None:
            record.__dict__["load"] = share_load(load)
    return record


def _compact_record(stored: _Stored, lease_expires_at_ms: int | None, load: Load | None) -> AgentRecord | None:
    """The compact record of ``stored`` once the patterns hold, else None; a new capability,
    probe or card is validated by its model (raising its ``ValidationError``)."""
    if (_agent_id_form(stored.agent_id) is None or "primary" not in stored.endpoints
            or not (stored.display_name.isprintable() or _one_line(stored.display_name))):
        return None
    texts = []
    for value, table, form in zip((stored.region, stored.transport, stored.description), *_TEXTS_SEEN):
        held = table.get(value)
        if held is None:
            if form(value) is None:
                return None
            held = _admit(table, value, value)
        texts.append(held)
    region, transport, description = texts
    names = tuple(stored.endpoints)
    if names not in _endpoint_names_seen:
        if not all(map(_endpoint_name_form, names)):
            return None
        _admit(_endpoint_names_seen, names, True)
    labels = _labels_seen.get(label_items := tuple(stored.labels.items()))
    if labels is None and (labels := _checked_labels(label_items)) is None:
        return None
    callers = _callers_seen.get(stored.allowed_callers)
    if callers is None and (callers := _checked_callers(stored.allowed_callers)) is None:
        return None
    capabilities = _capabilities_seen.get(stored.capabilities)
    if capabilities is None:
        capabilities = _checked_capabilities(stored.capabilities)
    if load is None:
        q, i, rps = stored.load.queued, stored.load.inflight, stored.load.rps
        load = shared_load((q, i, rps)) or share_load(Load.model_construct(queued=q, inflight=i, rps=rps))
    else:
        load = share_load(load)
    registered = stored.registered_at_ms
    values = blank_fields(AgentRecord)  # the record's __dict__, filled in place, in the model's field order
    values.update(zip(_NAMES, (
        stored.agent_id, stored.display_name, description, capabilities, key_shared(stored.endpoints),
        stored.callback_endpoint, transport, _model_or_none(Probe, stored.liveness_probe),
        _model_or_none(Probe, stored.readiness_probe), share_value(stored.lease_ttl_ms), labels,
        share_value(stored.weight), share_value(stored.max_concurrency), callers, stored.semantic_fallback,
        stored.status, region, stored.version, load, registered,
        registered if stored.updated_at_ms == registered else stored.updated_at_ms,
        stored.lease_expires_at_ms if lease_expires_at_ms is None else lease_expires_at_ms,
        stored.live, stored.ready, stored.probe_error, _model_or_none(CardListing, stored.a2a)), strict=True))
    return holding(AgentRecord, values)


def _model_or_none(model: type[M], value: dict[str, Any] | None) -> M | None:
    return None if value is None else model.model_validate(value)


def _admit(table: dict[Any, Any], key: Any, value: Any) -> Any:
    if len(table) >= MAX_SHARED:
        table.clear()
    table[key] = value
    return value


def _checked_labels(items: tuple[tuple[str, str], ...]) -> dict[str, str] | None:
    if not all(_label_key_form(key) and (value.isprintable() or _one_line(value)) for key, value in items):
        return None
    return _admit(_labels_seen, items, share_labels(dict(items)))


def _checked_callers(callers: tuple[str, ...]) -> list[str] | None:
    if not all(caller.isprintable() or _one_line(caller) for caller in callers):
        return None
    return _admit(_callers_seen, callers, share_callers(list(callers)))


def _checked_capabilities(stored: tuple[_StoredCapability, ...]) -> list[Capability]:
    """The shared capabilities of ``stored``, each validated by its model (raises its error)."""
    capabilities = [share_capability(Capability.model_validate(_values_of(item))) for item in stored]
    return _admit(_capabilities_seen, stored, share_capabilities(capabilities))


# register/update splice the version first into every record they write: '{"version":N,...'.
_STORED_VERSION = re.compile(r'^\{"version":(\d+),')


def stored_version(raw: str) -> int | None:
    """The version of a record as the store wrote it, read off its JSON without parsing it."""
    match = _STORED_VERSION.match(raw)
    return int(match.group(1)) if match else None


class WrittenRecords:
    """What this process wrote lately, by agent: the record JSON as sent and the record.

    The change stream hands the same JSON back (with its version spliced in first, see
    ``node.store.scripts``); :meth:`recall` then copies the record instead of reading the JSON
    again, for the readers of this process's own writes (the cache's tail, the publisher). The
    records are held compact: 10,000 of them held 38 MB as parsed, 12 MB compact with their JSON.
    The tail reads a write back within milliseconds; ``DEFAULT_WRITTEN_LIMIT`` covers the last
    half second of writes at 4,400 registrations/s, and a write read back later is read from its
    JSON (``read_record``), as any other.
    """

    def __init__(self, limit: int = DEFAULT_WRITTEN_LIMIT) -> None:
        self.limit = limit
        # An OrderedDict: a plain dict finds its oldest key by stepping over every deleted slot
        # (1.2 µs a write at 2,000 against 0.25; node.routing.decisions says more).
        self._records: OrderedDict[str, tuple[str, AgentRecord]] = OrderedDict()

    def remember(self, agent_id: str, body: str, record: AgentRecord) -> None:
        records = self._records
        records[agent_id] = (body, compact(record))
        records.move_to_end(agent_id)
        if len(records) > self.limit:
            records.popitem(last=False)

    def recall(self, agent_id: str, version: int, raw: str) -> AgentRecord:
        """The record a change entry's ``raw`` JSON holds: the one written here if it is that JSON, else read."""
        memo = self._records.get(agent_id)
        if memo is not None:
            body, record = memo
            # raw is '{"version":N,' + body[1:]
            if len(raw) - len(body) == len(str(version)) + 11 and raw.endswith(body[1:]):
                return build(AgentRecord, {**record.__dict__, "version": version})  # compact, like the memo
        return read_record(raw)
