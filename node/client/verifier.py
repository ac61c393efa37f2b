"""The called agent's half of a route credential: :class:`CallVerifier`.

Every call the reach layer delivers — the SDK's direct calls and the node's proxy mode — carries
``Authorization: Bearer <route credential>``: a JWT the caller's region signed (EdDSA, Ed25519)
naming the caller (``sub``), the one agent it is for (``aud``), the capability and the ticket,
valid until the ticket expires (:class:`~node.core.models.CallClaims`). An agent checks it with its
own node's public keys, never with the cluster secret::

    async with CallVerifier(node_url, agent_id="demo.summarize.en_01") as verifier:
        caller = await verifier.verify(request.headers.get("Authorization"))   # CallClaims
        caller.sub                                                             # who calls

What it refuses, as :class:`CredentialRejected` (``status`` and ``body()`` are the answer to give)::

    401 credential_missing    no 'Authorization: Bearer …' header
    401 credential_invalid    not a route credential of this cluster: malformed, another algorithm than
                              EdDSA, a key the region does not publish, a bad signature, claims missing
    401 credential_expired    its exp has passed (``leeway_s`` allows for clock skew)
    403 wrong_agent           a credential for another agent (its aud)
    403 caller_not_allowed    the caller matches none of ``allowed_callers`` (the registration's)
    503 keys_unavailable      the node's key set cannot be fetched and none is cached

The key set comes from ``{node_url}/.well-known/jwks.json``: fetched at first use, kept for
``cache_ttl_s``, and fetched again when a credential names a key it does not hold — that is how a
rotated key, or the key of the peer region a cross-region caller resolved in, is learnt (the node
asks that peer first when it does not hold the key either). Such lookups happen at most once per
``refresh_min_interval_s`` (a later one waits for the rest of the interval; the same unknown kid
again within it is refused at once), and concurrent verifications share one: a verification
whose kid is still unknown after a lookup that began once it had arrived is refused, so however
many credentials with made-up key ids arrive at once, none waits for more than two lookups and
they cannot make an agent hammer its node. The key set is read to at most ``MAX_KEY_SET_BYTES``
(4 MiB; a larger one is a failed fetch).
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import jwt
import orjson
from pydantic import ValidationError

from ..core import BodyTooLarge, ClientTlsSettings, read_bounded
from ..core.models import KEY_ID_PATTERN, MAX_KEY_SET_BYTES, CallClaims, caller_may_call, key_region, usable_keys
from ._config import tls_context
from ._errors import ClientError

__all__ = ["DEFAULT_KEYS_CACHE_TTL_S", "DEFAULT_LEEWAY_S", "DEFAULT_REFRESH_MIN_INTERVAL_S", "CallVerifier",
           "CredentialRejected"]

log = logging.getLogger("node.client")

DEFAULT_LEEWAY_S = 2.0
DEFAULT_KEYS_CACHE_TTL_S = 300.0
DEFAULT_REFRESH_MIN_INTERVAL_S = 1.0
DEFAULT_KEYS_TIMEOUT_S = 5.0
_ALGORITHM = "EdDSA"
_REQUIRED_CLAIMS = ["iss", "sub", "aud", "exp", "iat", "jti"]
_KEY_ID_RE = re.compile(KEY_ID_PATTERN)


class CredentialRejected(ClientError):
    """A call's route credential is missing or not good for this agent; answer with ``status`` and ``body()``."""

    status = 401
    code = "credential_invalid"

    def __init__(self, message: str, *, code: str, status: int = 401) -> None:
        super().__init__(message, code=code, field="Authorization")
        self.status = status


class CallVerifier:
    """Verifies the route credentials of calls to ``agent_id``; see the module docstring.

    ``allowed_callers`` are the registration's patterns (empty: anyone). ``clock`` is monotonic
    seconds (the cache's), ``sleep`` what waits between two fetches; both are injectable.
    ``ssl_context``: what an https node is checked against (``ReachClient.call_verifier()`` passes
    its client's; None: ``$AGENT_REACH_CA_FILE``, else the system's store).
    """

    def __init__(self, node_url: str, *, agent_id: str, allowed_callers: Sequence[str] = (),
                 leeway_s: float = DEFAULT_LEEWAY_S, cache_ttl_s: float = DEFAULT_KEYS_CACHE_TTL_S,
                 refresh_min_interval_s: float = DEFAULT_REFRESH_MIN_INTERVAL_S,
                 timeout_s: float = DEFAULT_KEYS_TIMEOUT_S, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 ssl_context: ssl.SSLContext | bool | None = None) -> None:
        if leeway_s < 0 or cache_ttl_s <= 0 or refresh_min_interval_s < 0:
            raise ValueError("need leeway_s >= 0, cache_ttl_s > 0 and refresh_min_interval_s >= 0")
        self.keys_url = node_url.rstrip("/") + "/.well-known/jwks.json"
        self.agent_id = agent_id
        self.allowed_callers = list(allowed_callers)
        self.leeway_s = leeway_s
        self.cache_ttl_s = cache_ttl_s
        self.refresh_min_interval_s = refresh_min_interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.clock = clock
        self.sleep = sleep
        self.fetches = 0  # key-set fetches so far (observability and tests)
        self._lookups = 0  # lookups begun so far: a verification waits for none begun after it arrived
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        self._looked_up_at: float | None = None  # the last fetch, and the kid it asked the node for
        self._looked_up_kid: str | None = None
        self._lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None
        # None: $AGENT_REACH_CA_FILE (and a client certificate's variables), else the system's store
        self.ssl_context = tls_context(ClientTlsSettings()) if ssl_context is None else ssl_context

    async def __aenter__(self) -> CallVerifier:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP session (a later verify opens a new one). Idempotent."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def verify(self, authorization: str | None) -> CallClaims:
        """The verified claims of the credential in an ``Authorization`` header's value.

        Raises :class:`CredentialRejected` (see the module docstring for each status and code).
        """
        token = _bearer(authorization)
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as exc:
            raise CredentialRejected(f"the route credential is malformed: {exc}", code="credential_invalid") from exc
        kid, algorithm = header.get("kid"), header.get("alg")
        if algorithm != _ALGORITHM or not isinstance(kid, str) or not _KEY_ID_RE.match(kid):
            raise CredentialRejected(f"the route credential must be signed with {_ALGORITHM} and name its key "
                                     f"(kid = <region>.<thumbprint>); this one says alg={algorithm!r}",
                                     code="credential_invalid")
        key = await self._key(kid)
        if key is None:
            raise CredentialRejected(f"the route credential is signed with key {kid[:80]!r}, which the region does "
                                     f"not publish ({self.keys_url})", code="credential_invalid")
        claims = self._decode(token, key, issuer=key_region(kid))
        if not caller_may_call(claims.sub, claims.rol, self.agent_id, self.allowed_callers):
            raise CredentialRejected(f"caller {claims.sub!r} is not among the allowed callers of {self.agent_id}",
                                     code="caller_not_allowed", status=403)
        return claims

    def _decode(self, token: str, key: jwt.PyJWK, *, issuer: str) -> CallClaims:
        try:
            decoded = jwt.decode(token, key, algorithms=[_ALGORITHM], audience=self.agent_id, issuer=issuer,
                                 leeway=self.leeway_s, options={"require": _REQUIRED_CLAIMS, "strict_aud": True})
        except jwt.ExpiredSignatureError as exc:
            raise CredentialRejected("the route credential has expired: the caller must resolve again",
                                     code="credential_expired") from exc
        except jwt.InvalidAudienceError as exc:
            raise CredentialRejected(f"the route credential is for another agent, not {self.agent_id}",
                                     code="wrong_agent", status=403) from exc
        except jwt.InvalidTokenError as exc:
            raise CredentialRejected(f"the route credential is not valid: {exc}", code="credential_invalid") from exc
        try:
            return CallClaims.model_validate(decoded)
        except ValidationError as exc:
            raise CredentialRejected("the route credential's claims are not a route credential's",
                                     code="credential_invalid") from exc

    # -- keys --------------------------------------------------------------------------------

    async def _key(self, kid: str) -> jwt.PyJWK | None:
        arrived = self._lookups
        if self._fetched_at is None or self.clock() - self._fetched_at > self.cache_ttl_s:
            async with self._lock:
                if self._fetched_at is None or self.clock() - self._fetched_at > self.cache_ttl_s:
                    await self._look_up(kid)
        key = self._keys.get(kid)
        if key is not None:
            return key
        async with self._lock:  # a key the cache does not hold: a rotation, a peer's key, or junk
            key = self._keys.get(kid)
            if key is None and self._lookups == arrived and not self._just_looked_up(kid):
                # Unknown keys are looked up at most once per refresh_min_interval_s, so junk kids
                # cannot make the agent hammer its node; and only when no lookup began since this
                # verification arrived (that one's key set did not have it either), so a crowd of
                # them is not served one interval after another while later calls queue behind.
                if self._looked_up_at is not None:
                    wait = self._looked_up_at + self.refresh_min_interval_s - self.clock()
                    if wait > 0:
                        await self.sleep(wait)
                await self._look_up(kid)
                key = self._keys.get(kid)
        return key

    def _just_looked_up(self, kid: str) -> bool:
        """The node was asked for this very kid within the interval (and did not have it)."""
        return (self._looked_up_kid == kid and self._looked_up_at is not None
                and self.clock() - self._looked_up_at < self.refresh_min_interval_s)

    async def _look_up(self, kid: str) -> None:
        self._looked_up_at, self._looked_up_kid = self.clock(), kid
        self._lookups += 1
        await self._fetch(kid)

    async def _fetch(self, kid: str) -> None:
        """Replace the cached keys with the node's key set (asking it for ``kid``)."""
        self.fetches += 1
        try:
            body = await self._get(kid)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, BodyTooLarge) as exc:
            self._fetched_at = self.clock()  # not again before refresh_min_interval_s
            if not self._keys:
                raise CredentialRejected(f"cannot fetch the region's keys from {self.keys_url}: "
                                         f"{type(exc).__name__}: {exc}", code="keys_unavailable", status=503) from exc
            log.warning("could not refresh the keys from %s (%s); using the cached ones", self.keys_url, exc)
            return
        keys = {}
        for found in usable_keys(body.get("keys") if isinstance(body, dict) else None):
            keys[found.kid] = jwt.PyJWK(found.model_dump(), algorithm=_ALGORITHM)
        self._keys, self._fetched_at = keys, self.clock()

    async def _get(self, kid: str) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl_context))
        async with self._session.get(self.keys_url, params={"kid": kid}, timeout=self.timeout,
                                     allow_redirects=False) as response:
            raw = await read_bounded(response, MAX_KEY_SET_BYTES)
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}: {raw[:200]!r}")
        return orjson.loads(raw)


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise CredentialRejected("send the route credential as 'Authorization: Bearer <credential>' (the SDK and "
                                 "the proxy do; a caller that skips the registry has none)", code="credential_missing")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise CredentialRejected("the Authorization header must be 'Bearer <route credential>'",
                                 code="credential_missing")
    return token.strip()
