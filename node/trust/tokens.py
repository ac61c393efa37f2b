"""Identity: bearer tokens and route-ticket signatures, both HMAC-SHA256 with the cluster secret.

A token is ``ar1.<base64url(claims JSON)>.<base64url(mac)>``; claims say who (``sub``), in
which role (admin, agent, caller), until when (``exp``, seconds) and which token it is (``jti``,
what revoking it names: :mod:`node.trust.revocation`); a token a node minted to forward its
caller's request to a peer region also says so (``fwd``: :meth:`Signer.issue_forwarded`). An
agent token allows register/heartbeat/deregister of that agent_id only; any valid token may
resolve, and the router sees the caller's identity. The secret is read from
``AGENT_REACH_SECRET``, or from the file named by ``AGENT_REACH_SECRET_FILE``; with neither, a
local secret file is created once (``~/.agent-reach/secret``, mode 0600) and reused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import re
import secrets
import time
from collections import OrderedDict
from pathlib import Path

import orjson
from pydantic import ValidationError

from ..core import Forbidden, Unauthorized
from ..core.models import Forwarding, TokenClaims, TokenRole, caller_may_call

log = logging.getLogger(__name__)

SECRET_ENV = "AGENT_REACH_SECRET"
SECRET_FILE_ENV = "AGENT_REACH_SECRET_FILE"
DEFAULT_SECRET_FILE = Path.home() / ".agent-reach" / "secret"
DEFAULT_TOKEN_TTL_S = 30 * 24 * 3600
DEFAULT_SELF_TOKEN_TTL_S = 600  # a token a node mints for its own calls to peers: minutes, renewed
MIN_SECRET_BYTES = 16
_TOKEN_PREFIX = "ar1"
_VERIFIED_CACHE_SIZE = 10_000


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


_BASE64URL_RE = re.compile(r"^[A-Za-z0-9_-]*$")


def _unb64(text: str) -> bytes:
    """Decode unpadded base64url, accepting only its canonical form.

    The standard decoder skips characters outside the alphabet and ignores the unused bits of
    the last character, so many strings decode to the same bytes; a signature must have
    exactly one spelling.
    """
    if not _BASE64URL_RE.match(text) or len(text) % 4 == 1:
        raise ValueError("not canonical base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(data) != text:
        raise ValueError("not canonical base64url")
    return data


def new_token_id() -> str:
    """A fresh token id (``jti``): 96 random bits, base64url (16 characters), never starting with
    ``-`` — one that did was taken for an option by ``agent-reach token revoke --jti ID``."""
    while True:
        token_id = secrets.token_urlsafe(12)
        if not token_id.startswith("-"):
            return token_id


def token_claims_unverified(token: str) -> TokenClaims:
    """The claims a token states, WITHOUT checking its signature: for the side that names a token
    to revoke it (``agent-reach token revoke``); a node never trusts claims read this way.

    Raises:
        ValueError: not an Agent-Reach token, or its claims do not parse.
    """
    parts = token.strip().split(".")
    if len(parts) != 3 or parts[0] != _TOKEN_PREFIX:
        raise ValueError(f"not an Agent-Reach token ({_TOKEN_PREFIX}.<claims>.<signature>)")
    try:
        return TokenClaims.model_validate_json(_unb64(parts[1]))
    except (ValueError, ValidationError) as exc:
        raise ValueError("the token's claims do not parse") from exc


class SecretError(ValueError):
    """The cluster secret is missing, unreadable or too short; the message says how to fix it."""


def load_secret(*, secret: str | None = None, secret_file: str | Path | None = None,
                create: bool = False) -> tuple[bytes, str]:
    """The cluster secret and where it came from (for the startup log).

    Order: the ``secret`` argument, ``AGENT_REACH_SECRET``, the ``secret_file`` argument,
    ``AGENT_REACH_SECRET_FILE``, then the default file ``~/.agent-reach/secret``. The default
    file is created when missing (mode 0600) and reused after; a file that was *named* must
    exist unless ``create`` is true — a typo must not silently mint tokens with a new secret.

    Raises:
        SecretError: the named file does not exist (and ``create`` is false), cannot be read
            or created, or holds fewer than ``MIN_SECRET_BYTES`` bytes.
    """
    value = secret or os.environ.get(SECRET_ENV)
    if value:
        source = "argument" if secret else f"${SECRET_ENV}"
        return _checked(value.encode(), source), source
    named = secret_file or os.environ.get(SECRET_FILE_ENV)
    path = Path(named or DEFAULT_SECRET_FILE).expanduser()
    if not path.exists():
        if named and not create:
            via = "--secret-file" if secret_file else f"${SECRET_FILE_ENV}"
            raise SecretError(f"the secret file {path} (from {via}) does not exist; fix the path, or pass "
                              "--create-secret to create a new secret there")
        _create_secret_file(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SecretError(f"cannot read the secret file {path}: {reason}; fix its permissions "
                          "(chmod 600, owned by this user) or point --secret-file elsewhere") from exc
    return _checked(text.strip().encode(), str(path)), str(path)


def _create_secret_file(path: Path) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # another process created it first: use theirs
    except OSError as exc:
        raise SecretError(f"cannot create the secret file {path}: {exc.strerror or exc}; choose a writable "
                          "place with --secret-file, or set $AGENT_REACH_SECRET") from exc
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")


def _checked(secret: bytes, source: str) -> bytes:
    if len(secret) < MIN_SECRET_BYTES:
        raise SecretError(f"the cluster secret from {source} is shorter than {MIN_SECRET_BYTES} bytes; use a "
                          "longer one (e.g. the output of: python -c 'import secrets; "
                          "print(secrets.token_urlsafe(32))')")
    return secret


class Signer:
    """Issues and verifies tokens and ticket signatures with one secret."""

    def __init__(self, secret: bytes) -> None:
        self._token_key = hmac.new(secret, b"agent-reach token", hashlib.sha256).digest()
        # Keyed once; each seal copies the keyed state (OpenSSL 3's one-shot HMAC looks the
        # algorithm up on every call, the larger part of a seal's cost on the resolve path).
        self._ticket_key = _keyed(hmac.new(secret, b"agent-reach ticket", hashlib.sha256).digest())
        self._hop_key = _keyed(hmac.new(secret, b"agent-reach hop", hashlib.sha256).digest())
        self._verified: OrderedDict[str, TokenClaims] = OrderedDict()

    # -- tokens ------------------------------------------------------------------------------

    def issue(self, subject: str, role: TokenRole, *, ttl_s: int = DEFAULT_TOKEN_TTL_S,
              now_s: int | None = None) -> str:
        issued = int(time.time()) if now_s is None else now_s
        return self._mint(TokenClaims(sub=subject, role=role, iat=issued, exp=issued + ttl_s, jti=new_token_id()))

    def issue_forwarded(self, caller: TokenClaims, *, region: str, ttl_s: int, now_s: int | None = None) -> str:
        """The token ``region``'s node sends a peer's node with ``caller``'s request: the caller's
        subject and role, marked (``fwd``) with ``region`` and the caller's own token id, so the
        peer never forwards it again and refuses it when it has revoked the caller's token; it
        expires with the caller's token, if that comes sooner than ``ttl_s``.

        Raises:
            ValueError: ``caller`` arrived forwarded itself (a forwarded request is never forwarded again).
        """
        if caller.fwd is not None:
            raise ValueError(f"the request arrived forwarded from region {caller.fwd.region}: it is never "
                             "forwarded again")
        issued = int(time.time()) if now_s is None else now_s
        return self._mint(TokenClaims(sub=caller.sub, role=caller.role, iat=issued,
                                      exp=min(issued + ttl_s, caller.exp), jti=new_token_id(),
                                      fwd=Forwarding(region=region, jti=caller.jti)))

    def _mint(self, claims: TokenClaims) -> str:
        # Without fwd (None) a token reads exactly as before the mark existed.
        payload = _b64(claims.model_dump_json(exclude_none=True).encode())
        mac = _b64(hmac.new(self._token_key, payload.encode(), hashlib.sha256).digest())
        return f"{_TOKEN_PREFIX}.{payload}.{mac}"

    def verify(self, token: str, *, now_s: float | None = None, remember: bool = True) -> TokenClaims:
        """Claims of a valid token; raises :class:`Unauthorized` for forged, malformed, expired.
        ``remember=False`` for a token seen once (an agent joining a session): it does not take the
        place of the tokens that come with every request."""
        now = time.time() if now_s is None else now_s
        claims = self._verified.get(token)
        if claims is None:
            claims = self._verify_uncached(token)
            if remember:
                self._verified[token] = claims
                if len(self._verified) > _VERIFIED_CACHE_SIZE:
                    self._verified.popitem(last=False)
        if claims.exp <= now:
            raise Unauthorized("the token has expired: issue a new one with 'agent-reach token issue'",
                               code="token_expired")
        return claims

    def _verify_uncached(self, token: str) -> TokenClaims:
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != _TOKEN_PREFIX:
            raise Unauthorized("the bearer token is malformed", code="invalid_token")
        expected = hmac.new(self._token_key, parts[1].encode(), hashlib.sha256).digest()
        try:
            given = _unb64(parts[2])
            if not hmac.compare_digest(expected, given):
                raise Unauthorized("the bearer token's signature is not valid for this cluster", code="invalid_token")
            return TokenClaims.model_validate_json(_unb64(parts[1]))
        except (ValueError, ValidationError) as exc:
            raise Unauthorized("the bearer token is malformed", code="invalid_token") from exc

    # -- tickets -----------------------------------------------------------------------------

    def sign_ticket(self, claims: dict[str, object]) -> str:
        return _seal(self._ticket_key, claims)

    def verify_ticket(self, signature: str) -> dict[str, object]:
        """The signed claims of a ticket; raises :class:`Forbidden` if forged or malformed."""
        claims = _opened(self._ticket_key, signature)
        if claims is None:
            raise Forbidden("the ticket signature is not valid", code="invalid_ticket", field="signature")
        return claims

    def sign_hop(self, claims: dict[str, object]) -> str:
        """A hop stamp (``node.http.proxy.hops``): signed with a key of its own, never taken for a ticket."""
        return _seal(self._hop_key, claims)

    def verify_hop(self, stamp: str) -> dict[str, object] | None:
        """The claims of a hop stamp this cluster signed; None if forged or malformed."""
        return _opened(self._hop_key, stamp)


def _keyed(key: bytes) -> hmac.HMAC:
    return hmac.new(key, digestmod=hashlib.sha256)


def _mac(key: hmac.HMAC, payload: bytes) -> bytes:
    """HMAC-SHA256 of ``payload`` under ``key`` (:func:`_keyed`), its first 16 bytes."""
    mac = key.copy()
    mac.update(payload)
    return mac.digest()[:16]


def _seal(key: hmac.HMAC, claims: dict[str, object]) -> str:
    payload = _b64(orjson.dumps(claims))
    return f"{payload}.{_b64(_mac(key, payload.encode()))}"


def _opened(key: hmac.HMAC, sealed: str) -> dict[str, object] | None:
    """The claims ``key`` sealed in ``sealed`` (:func:`_seal`); None if forged or malformed."""
    payload, _, mac = sealed.partition(".")
    expected = _mac(key, payload.encode())
    try:
        if not hmac.compare_digest(expected, _unb64(mac)):
            return None
        claims = orjson.loads(_unb64(payload))
    except (ValueError, orjson.JSONDecodeError):
        return None
    return claims if isinstance(claims, dict) else None


class SelfToken:
    """A token a node mints for its own calls to peers, renewed when half its life is gone.

    It lives minutes (``ttl_s``), so one that leaked soon ends by itself, and every one minted is
    logged with its id and expiry, the two things ``agent-reach token revoke --jti … --exp …``
    needs; :meth:`renew` mints the next one at once (after a peer refused the current one as
    revoked, say).
    """

    def __init__(self, signer: Signer, subject: str, role: TokenRole, *,
                 ttl_s: int = DEFAULT_SELF_TOKEN_TTL_S) -> None:
        if ttl_s < 2:
            raise ValueError("ttl_s must be at least 2 seconds")
        self.signer = signer
        self.subject = subject
        self.role = role
        self.ttl_s = ttl_s
        self.minted = 0
        self._token: str | None = None
        self._claims: TokenClaims | None = None

    def current(self) -> str:
        """The token to send now: the last one, or a new one once half of its life is gone."""
        claims = self._claims
        if self._token is None or claims is None or time.time() >= claims.exp - self.ttl_s / 2:
            return self.renew()
        return self._token

    def renew(self) -> str:
        token = self.signer.issue(self.subject, self.role, ttl_s=self.ttl_s)
        self._token, self._claims = token, self.signer.verify(token)
        self.minted += 1
        log.info("minted the %s token %s for %s, valid until %d (revoke: agent-reach token revoke --jti %s "
                 "--exp %d)", self.role.value, self._claims.jti, self.subject, self._claims.exp, self._claims.jti,
                 self._claims.exp)
        return token

    @property
    def claims(self) -> TokenClaims | None:
        """The current token's claims (None before the first)."""
        return self._claims


def authorize_agent(claims: TokenClaims, agent_id: str) -> None:
    """An agent token may only act for its own agent_id; admin may act for any."""
    if claims.role is TokenRole.ADMIN:
        return
    if claims.role is TokenRole.AGENT and claims.sub == agent_id:
        return
    raise Forbidden(f"a token for {claims.sub!r} ({claims.role.value}) may not act for agent {agent_id}",
                    field="agent_id")


def may_see(caller: TokenClaims, agent_id: str, allowed_callers: list[str]) -> bool:
    """Whether ``caller`` may see an agent (its record, endpoints, card, changes, traces).

    ``allowed_callers`` empty: anyone. Otherwise admins and peer nodes, the agent itself, and
    callers whose subject matches one of the patterns (``"admin"`` names the admin role); the
    called agent applies the same rule to a route credential (:func:`node.core.models.caller_may_call`).
    """
    return caller_may_call(caller.sub, caller.role, agent_id, allowed_callers)


def require_peer(caller: TokenClaims, what: str) -> None:
    """Routes that show every record regardless of ``allowed_callers`` are for peers and admins."""
    if caller.role not in (TokenRole.ADMIN, TokenRole.PEER):
        raise Forbidden(f"{what} is for peer regions and admins only (a token of role "
                        f"{caller.role.value} may not read it)", code="peers_only")
