"""Errors of the federation package.

Hierarchy::

    FederationError            base of everything raised here
    ├── BrokerUnavailable      Kafka cannot be reached or refused a request (retry; nothing is lost)
    │   └── KafkaAccessDenied  the broker refused this client's TLS, credentials or rights (fatal at start-up)
    │       ├── KafkaHandshakeFailed       the TLS handshake failed (certificate verify, client certificate)
    │       ├── KafkaAuthenticationFailed  SASL authentication was refused (mechanism, user, password)
    │       └── KafkaNotAuthorized         the broker denied an operation to this client's principal
    ├── KafkaSettingsInvalid   a Kafka security setting cannot be used (a missing file, an unset variable)
    ├── SnapshotUnavailable    no node of a peer region served ``GET /v1/federation/snapshot``
    ├── InvalidMessage         a record on a region topic is not a federation message (skipped)
    └── NewerSchema            a record of a newer schema version than this node reads (skipped)

Background duties (publisher, consumer, anti-entropy) catch these, log them and retry with a
backoff; they reach a caller only from the explicit one-shot operations, and from
``Federation.start()``, which checks once that the broker accepts this client (a wrong CA,
certificate, password or right ends the start-up with one line saying which).
"""

from __future__ import annotations


class FederationError(Exception):
    """Base of all federation errors."""


class BrokerUnavailable(FederationError):
    """Kafka cannot be reached or refused a request; the operation is retried later."""


class KafkaAccessDenied(BrokerUnavailable):
    """The broker refused this client's TLS, credentials or rights: the settings are wrong, retrying won't help."""


class KafkaHandshakeFailed(KafkaAccessDenied):
    """The TLS handshake with a broker failed: its certificate did not verify, or it wanted ours."""


class KafkaAuthenticationFailed(KafkaAccessDenied):
    """The broker refused SASL authentication: the mechanism, the user name or the password."""


class KafkaNotAuthorized(KafkaAccessDenied):
    """The broker denied an operation (create or use a topic) to this client's principal."""


class KafkaSettingsInvalid(FederationError):
    """A Kafka security setting cannot be used: a file that does not exist, an unset variable."""


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
