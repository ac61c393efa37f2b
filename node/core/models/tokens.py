"""Who a request is from and what it is told when refused: a bearer token's claims and role, the
claims of a route credential (what a called agent is told about its caller), who may call an
agent, what revoking a token names, and the JSON error body every route answers with. This module does no I/O.
"""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .fields import SINGLE_LINE_PATTERN, AgentId, Count, Region, Strict, compile_pattern

TOKEN_ID_PATTERN = r"^[A-Za-z0-9_-]{8,64}$"
"""A bearer token's id (``jti``): what revoking it names; base64url, 8 to 64 characters."""
MAX_TOKEN_EXPIRY_S = 253_402_300_799  # 9999-12-31T23:59:59Z: in ms still exact as a double (Redis scores, Lua)

class ErrorBody(Strict):
    error: str = Field(description="snake_case code, e.g. no_agent_available")
    message: str
    field: str | None = None
    details: dict[str, object] | None = None


class TokenRole(str, enum.Enum):
    """admin: anything; agent: act for its own agent_id; caller: resolve, search, send, report;
    peer: another region's node (snapshot and vectors, which show every record)."""

    ADMIN = "admin"
    AGENT = "agent"
    CALLER = "caller"
    PEER = "peer"


class Forwarding(Strict):
    """The mark of a token a node minted to forward its caller's request to a peer region's node
    (``federation.forward``): the peer never forwards such a request again, and applies its
    revocations to the caller's own token (``jti``) as well as to this one."""

    region: Region = Field(description="The region whose node forwarded the request.")
    jti: str | None = Field(default=None, pattern=TOKEN_ID_PATTERN,
                            description="The id of the token the caller sent that node (None: it had none).")


class TokenClaims(Strict):
    """What a bearer token asserts; signed with the cluster secret."""

    sub: str = Field(max_length=200, pattern=SINGLE_LINE_PATTERN)
    role: TokenRole
    exp: Count = Field(description="Expiry, seconds since the epoch.")
    iat: Count
    jti: str | None = Field(default=None, pattern=TOKEN_ID_PATTERN,
                            description="The token's id: what revoking it names (tokens issued before ids were "
                                        "introduced have none and cannot be revoked one by one).")
    fwd: Forwarding | None = Field(default=None, description="Set on a token a node minted to forward the "
                                                             "caller's request to a peer region (never by a caller).")


class RevocationRequest(Strict):
    """``POST /v1/admin/tokens/revoke``: refuse the token ``jti`` in this region from now until ``exp``."""

    jti: str = Field(pattern=TOKEN_ID_PATTERN, description="The token's id (its jti claim).")
    exp: int = Field(ge=0, le=MAX_TOKEN_EXPIRY_S,
                     description="The token's expiry, seconds since the epoch (its exp claim): the deny-list entry "
                                 "ends then, when the token is refused as expired anyway.")


class CallClaims(Strict):
    """What a route credential asserts: who calls which agent for what, until when.

    A route credential is a JWT (EdDSA, Ed25519) signed by the key of the region that issued the
    ticket (``iss``); the JWT header's ``kid`` names the key, ``<region>.<thumbprint>``. The
    called agent checks it with the region's public keys (``/.well-known/jwks.json``), never
    with the cluster secret: see :mod:`node.trust.credentials` and ``node.client.CallVerifier``.
    """

    iss: Region = Field(description="The region whose node issued the ticket and signed this credential.")
    sub: str = Field(max_length=200, pattern=SINGLE_LINE_PATTERN,
                     description="The caller: its token's subject (an agent's id for an agent token).")
    rol: TokenRole = Field(description="The caller's token role.")
    aud: AgentId = Field(description="The one agent this credential may be presented to.")
    cap: str | None = Field(default=None, max_length=500, pattern=SINGLE_LINE_PATTERN,
                            description="The capability the call was routed by (the one matched), if any.")
    tid: str = Field(max_length=64, pattern=SINGLE_LINE_PATTERN, description="The route ticket's id.")
    jti: str = Field(max_length=80, pattern=SINGLE_LINE_PATTERN, description="This credential's own id.")
    iat: Count = Field(description="Issued at, seconds since the epoch.")
    exp: Count = Field(description="Expiry, seconds since the epoch: the ticket's expiry.")


def caller_may_call(caller: str, role: TokenRole, agent_id: str, allowed_callers: list[str]) -> bool:
    """Whether ``caller`` (a token subject, in ``role``) may see and call ``agent_id``.

    ``allowed_callers`` empty: anyone. Otherwise admins and peer nodes, the agent itself, and
    callers whose subject matches one of the patterns. ``"admin"`` names the admin role, never a
    subject: a caller or agent token whose subject happens to be ``admin`` does not match it.
    """
    if not allowed_callers or role in (TokenRole.ADMIN, TokenRole.PEER) or caller == agent_id:
        return True
    return any(pattern != "admin" and (pattern == caller or compile_pattern(pattern).match(caller))
               for pattern in allowed_callers)


KEY_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}\.[A-Za-z0-9_-]{16,64}$"  # <region>.<RFC 7638 thumbprint>
# A key set is read from another party (a node, a peer): at most this many bytes of it, and of
# one region's keys at most this many (one per node process, plus rotated keys within their lease).
MAX_KEY_SET_BYTES = 4 << 20
MAX_REGION_KEYS = 256
_BASE64URL_PATTERN = r"^[A-Za-z0-9_-]+$"


class PublicKey(BaseModel):
    """One public signing key of a region, as a JWK (RFC 7517/8037): an Ed25519 key for EdDSA.

    Unknown members are ignored, as RFC 7517 asks of a JWK's readers.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    kty: Literal["OKP"]
    crv: Literal["Ed25519"]
    x: str = Field(min_length=43, max_length=43, pattern=_BASE64URL_PATTERN)
    kid: str = Field(pattern=KEY_ID_PATTERN, description="<region>.<RFC 7638 thumbprint>: the region signing with it.")
    alg: Literal["EdDSA"] = "EdDSA"
    use: Literal["sig"] = "sig"

    @property
    def region(self) -> str:
        return key_region(self.kid)


class KeySet(Strict):
    """A JWK Set (``/.well-known/jwks.json``): the keys route credentials are signed with."""

    keys: list[PublicKey]


def key_region(kid: str) -> str:
    """The region a key id names (``us-east.AbC…`` → ``us-east``)."""
    return kid.partition(".")[0]


def usable_keys(keys: object) -> list[PublicKey]:
    """The Ed25519 signing keys of a decoded JWK Set's ``keys``; keys of other types are skipped
    (RFC 7517: ignore what is not understood), as is anything that is not a JWK Set."""
    found: list[PublicKey] = []
    for key in keys if isinstance(keys, list) else []:
        try:
            found.append(PublicKey.model_validate(key))
        except ValidationError:
            continue
    return found
