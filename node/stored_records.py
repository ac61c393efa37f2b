"""Records read back from the region's own Redis: checked in one pass, built compact.

Every record in the region's hash, its change stream and the federation replica was validated
by a node before it was written, so reading one back checks that it is still a record of this
schema — the fields named exactly, each of its JSON type and within the model's patterns,
lengths and bounds — without running the model's Python validators again. :func:`read_record`
has pydantic-core check that against a strict mirror of the record (:class:`_Stored`, in Rust:
about 4.7 µs, 0.7 of it the patterns and bounds) and builds the compact record
(``node.compact``) from it, without validating the model (7–9 µs, plus an 832-byte
``__dict__`` and a fields-set per record). Not checked again: the forms of endpoint URLs and
the syntax of caller patterns (a foreign writer's well-typed URL is served as written; the
egress policy still judges every address the node contacts). A new capability, probe or card
is validated by its own model, once. Anything else — a foreign writer's value, another schema,
JSON that does not parse — goes through ``AgentRecord.model_validate_json``, which reads it as
it always did or raises the error the store quarantines. Peers' snapshots are not read here:
what crosses a trust boundary is validated in full (``federation.snapshot_reader``).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict

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
from .models import AgentRecord, Capability, CardListing, Load, Probe, Status, compat
from .models.fields import (
    LABEL_KEY_PATTERN,
    SINGLE_LINE_PATTERN,
    TRANSPORT_PATTERN,
    AgentId,
    Count,
    EndpointName,
    LongText,
    Millis,
    Region,
    ShortText,
)
from .models.records import MAX_LEASE_TTL_MS, MIN_LEASE_TTL_MS

__all__ = ["WrittenRecords", "read_record"]

_STRICT = ConfigDict(extra="forbid", strict=True)
_Count = Annotated[int, Field(ge=0)]
_Url = Annotated[str, Field(max_length=2_000)]


class _StoredCapability(TypedDict):
    __pydantic_config__ = _STRICT  # type: ignore[misc]
    name: str
    version: str
    description: str
    tags: list[str]
    examples: list[str]


class _StoredLoad(TypedDict):
    __pydantic_config__ = _STRICT  # type: ignore[misc]
    queued: _Count
    inflight: _Count
    rps: Annotated[float, Field(ge=0.0, le=1e15)]


class _Stored(TypedDict):
    """An :class:`~node.models.AgentRecord` as stored, by JSON type and with the model's patterns,
    lengths and bounds (tests check it names every field); what it leaves to the Python
    validators it skips — URL forms, caller-pattern syntax — is listed in the module doc."""

    __pydantic_config__ = _STRICT  # type: ignore[misc]
    agent_id: AgentId
    display_name: ShortText
    description: LongText
    capabilities: Annotated[list[_StoredCapability], Field(max_length=64)]
    endpoints: Annotated[dict[EndpointName, _Url], Field(min_length=1, max_length=16)]
    callback_endpoint: _Url | None
    transport: Annotated[str, Field(pattern=TRANSPORT_PATTERN)]
    liveness_probe: dict[str, Any] | None
    readiness_probe: dict[str, Any] | None
    lease_ttl_ms: Annotated[int, Field(ge=MIN_LEASE_TTL_MS, le=MAX_LEASE_TTL_MS)]
    labels: Annotated[dict[Annotated[str, Field(pattern=LABEL_KEY_PATTERN)], ShortText], Field(max_length=64)]
    weight: Annotated[int, Field(ge=0, le=10_000)]
    max_concurrency: Annotated[int, Field(ge=1, le=1_000_000)] | None
    allowed_callers: Annotated[list[Annotated[str, Field(max_length=200, pattern=SINGLE_LINE_PATTERN)]],
                               Field(max_length=64)]
    semantic_fallback: bool
    status: Status
    region: Region
    version: Count
    load: _StoredLoad
    registered_at_ms: Millis
    updated_at_ms: Millis
    lease_expires_at_ms: Millis
    live: bool
    ready: bool
    probe_error: str | None
    a2a: dict[str, Any] | None


_STORED = TypeAdapter(_Stored)
DEFAULT_WRITTEN_LIMIT = 2_000  # writes remembered (WrittenRecords): ~1.2 KiB each
_MODELS = (("liveness_probe", Probe), ("readiness_probe", Probe), ("a2a", CardListing))


def read_record(raw: str | bytes, *, lease_expires_at_ms: int | None = None) -> AgentRecord:
    """The record stored as ``raw``, compact; raises pydantic's ``ValidationError`` (a
    ``ValueError``) when it is not one. ``lease_expires_at_ms``: the lease to hold instead of the
    one in ``raw`` (the store's leases set is the truth)."""
    try:
        data: dict[str, Any] = _STORED.validate_json(raw)  # type: ignore[assignment]
    except ValidationError:
        data = {}
    if "primary" not in data.get("endpoints", ()) or type(data["load"]["rps"]) is not float:
        record = compact(compat.read_json(AgentRecord, raw))  # pydantic's reading, or its error
        if lease_expires_at_ms is not None:
            record.lease_expires_at_ms = lease_expires_at_ms
        return record
    if lease_expires_at_ms is not None:
        data["lease_expires_at_ms"] = lease_expires_at_ms
    data["capabilities"] = share_capabilities([_capability(item) for item in data["capabilities"]])
    load = data["load"]
    key = (load["queued"], load["inflight"], load["rps"])
    data["load"] = shared_load(key) or share_load(Load.model_construct(queued=key[0], inflight=key[1], rps=key[2]))
    for name, model in _MODELS:
        if data[name] is not None:
            data[name] = model.model_validate(data[name])
    share_parts(data)
    return build(AgentRecord, data)


def _capability(item: dict[str, Any]) -> Capability:
    key = capability_key(item["name"], item["version"], item["description"], item["tags"], item["examples"])
    held = shared_capability(key)
    return held if held is not None else share_capability(Capability.model_validate(item))


class WrittenRecords:
    """What this process wrote lately, by agent: the record JSON as sent and the record.

    The change stream hands the same JSON back (with its version spliced in first, see
    ``node.store_scripts``); :meth:`recall` then copies the record instead of reading the JSON
    again, for the readers of this process's own writes (the cache's tail, the publisher). The
    records are held compact: 10,000 of them held 38 MB as parsed, 12 MB compact with their JSON.
    The tail reads a write back within milliseconds; ``DEFAULT_WRITTEN_LIMIT`` covers the last
    half second of writes at 4,400 registrations/s, and a write read back later is read from its
    JSON (``read_record``), as any other.
    """

    def __init__(self, limit: int = DEFAULT_WRITTEN_LIMIT) -> None:
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
