"""Who may do what: bearer tokens, route credentials and region keys, revocation, the egress
policy and the redaction of secrets in logs.
"""

from .credentials import (
    DEFAULT_KEY_PUBLISH_INTERVAL_MS,
    DEFAULT_SIGNING_KEY_MAX_AGE_MS,
    JWKS_PATH,
    RegionKeys,
    SigningKeyError,
)
from .egress import DEFAULT_EGRESS_POLICY, EgressDenied, EgressPolicy, egress_denial, egress_session
from .redact import CredentialFilter, mask_credentials, mask_url
from .revocation import DEFAULT_REVOCATION_POLL_INTERVAL_MS, Revocation, RevocationList
from .tokens import (
    DEFAULT_TOKEN_TTL_S,
    SECRET_ENV,
    SecretError,
    Signer,
    authorize_agent,
    load_secret,
    may_see,
    require_peer,
    token_claims_unverified,
)

__all__ = [
    "CredentialFilter",
    "DEFAULT_EGRESS_POLICY",
    "DEFAULT_KEY_PUBLISH_INTERVAL_MS",
    "DEFAULT_REVOCATION_POLL_INTERVAL_MS",
    "DEFAULT_SIGNING_KEY_MAX_AGE_MS",
    "DEFAULT_TOKEN_TTL_S",
    "EgressDenied",
    "EgressPolicy",
    "JWKS_PATH",
    "RegionKeys",
    "Revocation",
    "RevocationList",
    "SECRET_ENV",
    "SecretError",
    "Signer",
    "SigningKeyError",
    "authorize_agent",
    "egress_denial",
    "egress_session",
    "load_secret",
    "mask_credentials",
    "mask_url",
    "may_see",
    "require_peer",
    "token_claims_unverified",
]
