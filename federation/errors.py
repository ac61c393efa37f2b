"""Errors of the federation package.

Hierarchy::

    FederationError            base of everything raised here
    ├── BrokerUnavailable      Kafka cannot be reached or refused a request (retry; nothing is lost)
    ├── SnapshotUnavailable    no node of a peer region served ``GET /v1/federation/snapshot``
    ├── InvalidMessage         a record on a region topic is not a federation message (skipped)
    └── NewerSchema            a record of a newer schema version than this node reads (skipped)

Background duties (publisher, consumer, anti-entropy) catch these, log them and retry with a
backoff; they reach a caller only from the explicit one-shot operations.
"""

from __future__ import annotations


class FederationError(Exception):
    """Base of all federation errors."""


class BrokerUnavailable(FederationError):
    """Kafka cannot be reached or refused a request; the operation is retried later."""


class SnapshotUnavailable(FederationError):
    """No node of a peer region answered the snapshot request; anti-entropy retries later."""


class InvalidMessage(FederationError):
    """A record on a region topic does not parse as a federation message."""


class NewerSchema(FederationError):
    """A record's value is of a newer schema version than this node reads: skipped, not quarantined."""

    def __init__(self, version: int, *, known: int) -> None:
        super().__init__(f"schema version {version} is newer than the {known} this node reads; upgrade the node "
                         "to read it")
        self.version = version
