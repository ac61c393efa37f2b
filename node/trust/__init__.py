"""Who may do what: bearer tokens, route credentials and region keys, revocation, the egress
policy, the ACL rules and who may see what (``admits``), the redaction of secrets in logs and the
rate budgets each tenant spends; the node's settings of them (``TrustSettings``).
"""

from .acl import DEFAULT_ACL_POLL_INTERVAL_MS, AclFull, RegionAcl, admits
from .budgets import Budget, BudgetKind, RateBudgets, RateSettings, tenant_of
from .credentials import JWKS_PATH, RegionKeys, SigningKeyError
from .egress import DEFAULT_EGRESS_POLICY, EgressDenied, EgressPolicy, egress_denial, egress_session
from .payload import DEFAULT_REFUSED_PAYLOAD_KEYS, PayloadPolicy, PayloadRefused, mask_secrets
from .redact import CredentialFilter, mask_credentials, mask_url
from .revocation import LoggedRevocation, Revocation, RevocationList
from .settings import TrustSettings
from .tokens import (
    DEFAULT_TOKEN_TTL_S,
    SECRET_ENV,
    SecretError,
    SelfToken,
    Signer,
    authorize_agent,
    load_secret,
    may_see,
    require_peer,
    token_claims_unverified,
)

__all__ = [
    "AclFull",
    "Budget",
    "BudgetKind",
    "CredentialFilter",
    "DEFAULT_ACL_POLL_INTERVAL_MS",
    "DEFAULT_EGRESS_POLICY",
    "DEFAULT_REFUSED_PAYLOAD_KEYS",
    "DEFAULT_TOKEN_TTL_S",
    "EgressDenied",
    "EgressPolicy",
    "JWKS_PATH",
    "LoggedRevocation",
    "PayloadPolicy",
    "PayloadRefused",
    "RateBudgets",
    "RateSettings",
    "RegionAcl",
    "RegionKeys",
    "Revocation",
    "RevocationList",
    "SECRET_ENV",
    "SecretError",
    "SelfToken",
    "Signer",
    "SigningKeyError",
    "TrustSettings",
    "admits",
    "authorize_agent",
    "egress_denial",
    "egress_session",
    "load_secret",
    "mask_credentials",
    "mask_secrets",
    "mask_url",
    "may_see",
    "require_peer",
    "tenant_of",
    "token_claims_unverified",
]
