"""The node's keys, its token deny list and what it may contact (:class:`TrustSettings`;
``NodeConfig`` inherits them)."""

from __future__ import annotations

from pydantic import Field

from .acl import DEFAULT_ACL_POLL_INTERVAL_MS
from .budgets import RateSettings
from .credentials import DEFAULT_CREDENTIAL_REUSE_MS, DEFAULT_KEY_PUBLISH_INTERVAL_MS, DEFAULT_SIGNING_KEY_MAX_AGE_MS
from .egress import EgressPolicy
from .revocation import DEFAULT_REVOCATION_POLL_INTERVAL_MS

__all__ = ["TrustSettings"]


class TrustSettings(RateSettings):
    """Settings of :class:`~node.trust.RegionKeys` (route credentials), :class:`~node.trust.RevocationList`
    (bearer tokens), the region's :class:`~node.trust.EgressPolicy` and its rate budgets
    (:class:`~node.trust.RateSettings`)."""

    signing_key_file: str | None = Field(
        default=None, description="Ed25519 PEM file to sign route credentials with (created, mode 0600, when "
                                  "missing; rewritten on rotation); None = a key generated in memory at start.")
    key_publish_interval_ms: int = Field(default=DEFAULT_KEY_PUBLISH_INTERVAL_MS, ge=100,
                                         description="How often the node renews its public key's lease in Redis.")
    signing_key_max_age_ms: int = Field(default=DEFAULT_SIGNING_KEY_MAX_AGE_MS, ge=1_000,
                                        description="The node rotates its signing key once it is this old.")
    credential_reuse_ms: int = Field(
        default=DEFAULT_CREDENTIAL_REUSE_MS, ge=1_000, multiple_of=1_000,
        description="A route credential outlives its ticket by less than this (whole seconds), so that a caller's "
                    "resolves of the same agent within it share one signature; also how much longer a revoked "
                    "caller's direct calls can still be accepted.")
    revocation_poll_interval_ms: int = Field(
        default=DEFAULT_REVOCATION_POLL_INTERVAL_MS, ge=10,
        description="How often the node reads the region's token deny list again: a token revoked through one "
                    "node is refused by every node of the region within about this long.")
    acl_poll_interval_ms: int = Field(
        default=DEFAULT_ACL_POLL_INTERVAL_MS, ge=10,
        description="How often the node reads the region's ACL rules again (/v1/acl): a rule set through one node "
                    "holds on every node of the region within about this long.")
    # What the node itself may contact: proxy deliveries, callbacks, probes.
    egress: EgressPolicy = Field(
        default_factory=EgressPolicy,
        description='Default: public addresses only; e.g. {"allow": ["loopback"]} when agents run on this host.')
