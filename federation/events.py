"""What travels on a region topic: change events and region beacons; the region digest.

A region topic ``{prefix}.changes.{region}`` has ONE partition: the region's changes form a
total order (its versions), so a beacon lands after every change it covers and a consumer can
tell a gap (version ``n`` followed by ``n + 2``) from a duplicate. A registry changes at most
thousands of times per second, which one partition carries easily. Records are keyed by
agent_id (per-agent order on any future multi-partition layout) and beacons by ``~beacon``.

A beacon carries the region's digest (``federation.digest``). This module does no I/O.
"""

from __future__ import annotations

from pydantic import Field, ValidationError, model_validator

from node.errors import first_problem
from node.models import ChangeEvent, Region, Strict

from .errors import InvalidMessage

BEACON_KEY = b"~beacon"


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


class FederationMessage(Strict):
    """One record of a region topic: exactly one of ``change`` or ``beacon``."""

    change: ChangeEvent | None = None
    beacon: RegionBeacon | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> FederationMessage:
        if (self.change is None) == (self.beacon is None):
            raise ValueError("a federation message carries exactly one of 'change' or 'beacon'")
        return self

    @property
    def region(self) -> str:
        return self.change.region if self.change is not None else self.beacon.region  # type: ignore[union-attr]

    def key(self) -> bytes:
        return self.change.agent_id.encode() if self.change is not None else BEACON_KEY

    def encode(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()

    @classmethod
    def decode(cls, value: bytes | None) -> FederationMessage:
        """Parse a record value; raises :class:`InvalidMessage` naming the first bad field."""
        if not value:
            raise InvalidMessage("empty record value")
        try:
            return cls.model_validate_json(value)
        except ValidationError as exc:
            first = first_problem(exc)
            raise InvalidMessage(f"{first.field or '(message)'}: {first.message}") from exc
