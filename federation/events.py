"""What travels between regions over Kafka: change events and region beacons (the contract).

Two topics per home region, each with ONE partition (``docs/events.md`` is the contract for
third-party consumers):

* ``{prefix}.changes.{region}``: the region's changes in version order, key = the agent_id, value
  = a :class:`FederationMessage` carrying a ``change``; a deletion (deregistration, expiry,
  quarantine) is followed by a tombstone, key = the agent_id and a null value, so the topic can be
  compacted on real Kafka and a compacted replay keeps exactly the live agents. The versions are
  consecutive, so a consumer tells a gap (``n`` then ``n + 2``) from a duplicate.
* ``{prefix}.beacons.{region}``: the region's beacons, key = the region (a compacted topic keeps
  the latest), value = a :class:`FederationMessage` carrying a ``beacon``. A beacon for watermark
  ``W`` is sent only once every change up to ``W`` was acknowledged on the change topic.
* ``{prefix}.revocations.{region}``: the bearer tokens the region revoked
  (:class:`RegionRevocations`), key = the region, value = a :class:`FederationMessage` carrying
  ``revocations``; every region refuses them until they expire (``federation.revocations``).
* ``{prefix}.acl.{region}``: the ACL rules set or deleted in the region (:class:`RegionAclRules`),
  key = the region, value = a :class:`FederationMessage` carrying ``acl``; every region applies
  them, the later entry of a rule winning (``federation.acl``).
* ``{prefix}.summaries.{region}``: the region's per-capability summaries
  (:class:`node.core.models.RegionSummary`), key = ``{region}/{part}``, value = a
  :class:`FederationMessage` carrying a ``summary``; one generation may be split into parts, each
  well under a Kafka message's 1 MB, and a reader applies a generation once all its parts arrived.

Every value carries ``schema_version`` (:data:`SCHEMA_VERSION`; values written before it existed
read as version 1, the same shape) and every record with a value a ``content-type`` header
(:data:`CHANGE_CONTENT_TYPE`, :data:`BEACON_CONTENT_TYPE`). A reader skips a value of a newer
schema version than it knows (:class:`NewerSchema`) instead of failing: versions only grow when
the shape changes incompatibly, and a node learns the newer ones when it is upgraded.

A beacon carries the region's digest (``federation.digest``). This module does no I/O.
"""

from __future__ import annotations

import orjson
from pydantic import Field, ValidationError, model_validator

from node.core import first_problem
from node.core.models import (
    MAX_ACL_RULES,
    MAX_TOKEN_EXPIRY_S,
    TOKEN_ID_PATTERN,
    AclEntry,
    ChangeEvent,
    Region,
    RegionSummary,
    Strict,
    compat,
)

from .errors import InvalidMessage, NewerSchema

SCHEMA_VERSION = 2  # 1: no schema_version field, beacons on the change topic; 2: this layout
CONTENT_TYPE_HEADER = "content-type"
CHANGE_CONTENT_TYPE = f"application/vnd.agent-reach.change+json; version={SCHEMA_VERSION}"
BEACON_CONTENT_TYPE = f"application/vnd.agent-reach.beacon+json; version={SCHEMA_VERSION}"
SUMMARY_CONTENT_TYPE = f"application/vnd.agent-reach.summary+json; version={SCHEMA_VERSION}"
REVOCATIONS_CONTENT_TYPE = f"application/vnd.agent-reach.revocations+json; version={SCHEMA_VERSION}"
ACL_CONTENT_TYPE = f"application/vnd.agent-reach.acl+json; version={SCHEMA_VERSION}"
MAX_ACL_ENTRIES_PER_MESSAGE = MAX_ACL_RULES  # ~400 bytes each: a message stays far under Kafka's 1 MB
MAX_REVOCATIONS_PER_MESSAGE = 5_000  # ~80 bytes each: a message stays far under Kafka's 1 MB


class RegionBeacon(Strict):
    """A region's periodic statement: at ``watermark``, it holds ``live_count`` agents with ``digest``.

    The digest is left out while some records' leases have passed but their expiry has not been
    swept into the change stream yet: the snapshot served for anti-entropy leaves those records
    out, the replicas still hold them until the deletes arrive, so comparing would only pull
    snapshots for nothing. The watermark is still compared.
    """

    region: Region
    watermark: int = Field(ge=0, description="Region version every earlier record on the topic covers.")
    live_count: int = Field(ge=0)
    digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$",
                               description="None while leases have passed but the sweeper has not removed them yet.")
    sent_at_ms: int = Field(ge=0)


class RevokedToken(Strict):
    """A bearer token every region refuses until ``until_ms`` (its own expiry)."""

    jti: str = Field(pattern=TOKEN_ID_PATTERN)
    until_ms: int = Field(ge=0, le=MAX_TOKEN_EXPIRY_S * 1000, description="ms since the epoch")


class RegionRevocations(Strict):
    """Tokens ``region`` revoked; ``full`` when these are every one it holds (sent whenever its relay
    starts, so a peer that missed some — a new region, a broker that forgot — catches up)."""

    region: Region
    tokens: list[RevokedToken] = Field(max_length=MAX_REVOCATIONS_PER_MESSAGE)
    full: bool = False
    sent_at_ms: int = Field(ge=0)


class RegionAclRules(Strict):
    """ACL entries (rules set or deleted) ``region`` sends; ``full`` when these are every one it holds
    (sent whenever its relay starts). An entry keeps the region it was set in (``origin``)."""

    region: Region
    entries: list[AclEntry] = Field(max_length=MAX_ACL_ENTRIES_PER_MESSAGE)
    full: bool = False
    sent_at_ms: int = Field(ge=0)


class FederationMessage(Strict):
    """One record's value: exactly one of ``change``, ``beacon``, ``summary``, ``revocations`` or
    ``acl``, and the schema version.

    ``summary``, ``revocations`` and ``acl`` are kinds added within schema version 2: each travels only on
    its own topic, which readers of the change and beacon topics never fetch, so their layout is
    unchanged.
    """

    schema_version: int = Field(default=1, ge=1, description="The value's layout (SCHEMA_VERSION when written).")
    change: ChangeEvent | None = None
    beacon: RegionBeacon | None = None
    summary: RegionSummary | None = None
    revocations: RegionRevocations | None = None
    acl: RegionAclRules | None = None

    @classmethod
    def of_change(cls, event: ChangeEvent) -> FederationMessage:
        return cls(schema_version=SCHEMA_VERSION, change=event)

    @classmethod
    def of_beacon(cls, beacon: RegionBeacon) -> FederationMessage:
        return cls(schema_version=SCHEMA_VERSION, beacon=beacon)

    @classmethod
    def of_summary(cls, summary: RegionSummary) -> FederationMessage:
        return cls(schema_version=SCHEMA_VERSION, summary=summary)

    @classmethod
    def of_revocations(cls, revocations: RegionRevocations) -> FederationMessage:
        return cls(schema_version=SCHEMA_VERSION, revocations=revocations)

    @classmethod
    def of_acl(cls, acl: RegionAclRules) -> FederationMessage:
        return cls(schema_version=SCHEMA_VERSION, acl=acl)

    @model_validator(mode="after")
    def _exactly_one(self) -> FederationMessage:
        if sum(kind is not None for kind in (self.change, self.beacon, self.summary, self.revocations, self.acl)) != 1:
            raise ValueError("a federation message carries exactly one of 'change', 'beacon', 'summary', "
                             "'revocations' or 'acl'")
        if self.change is not None and self.change.record is not None:
            _check_record(self.change)
        return self

    @property
    def region(self) -> str:
        kind = self.change or self.beacon or self.summary or self.revocations or self.acl
        return kind.region  # type: ignore[union-attr]

    def key(self) -> bytes:
        """The record key: the agent_id of a change, ``{region}/{part}`` of a summary, else the region."""
        if self.change is not None:
            return self.change.agent_id.encode()
        if self.summary is not None:
            return f"{self.region}/{self.summary.part}".encode()
        return self.region.encode()

    def headers(self) -> list[tuple[str, bytes]]:
        if self.change is not None:
            content_type = CHANGE_CONTENT_TYPE
        elif self.revocations is not None:
            content_type = REVOCATIONS_CONTENT_TYPE
        elif self.acl is not None:
            content_type = ACL_CONTENT_TYPE
        else:
            content_type = BEACON_CONTENT_TYPE if self.beacon is not None else SUMMARY_CONTENT_TYPE
        return [(CONTENT_TYPE_HEADER, content_type.encode())]

    def encode(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()

    @classmethod
    def decode(cls, value: bytes | None) -> FederationMessage:
        """Parse a record value; raises :class:`NewerSchema` for a schema version this code does not
        know (skip it) and :class:`InvalidMessage` naming the first bad field. A tombstone (no value)
        is not a message: check for it first."""
        if not value:
            raise InvalidMessage("empty record value")
        version = _schema_version(value)
        if version is not None and version > SCHEMA_VERSION:
            raise NewerSchema(version, known=SCHEMA_VERSION)
        try:
            return compat.read_json(cls, value)  # a newer peer's added fields are dropped
        except ValidationError as exc:
            first = first_problem(exc)
            raise InvalidMessage(f"{first.field or '(message)'}: {first.message}") from exc


def _check_record(change: ChangeEvent) -> None:
    """A change's record is of the change's agent, region and version. The replica is keyed by the
    change's agent id in Redis and by the record's in memory, and the router addresses the record's
    region and agent: a record naming another (this region's agent, say) would put a double of it,
    at an address the message's writer chose, among the peer's agents."""
    record = change.record
    for name in ("agent_id", "region", "version"):
        given, expected = getattr(record, name), getattr(change, name)
        if given != expected:
            raise ValueError(f"change.record.{name} is {given!r}, not the change's {expected!r}: a change "
                             "carries the record of its own agent, region and version")


def _schema_version(value: bytes) -> int | None:
    """The value's ``schema_version`` read without its schema (None when it has none or is no object)."""
    try:
        decoded = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    version = decoded.get("schema_version") if isinstance(decoded, dict) else None
    return version if isinstance(version, int) and not isinstance(version, bool) else None
