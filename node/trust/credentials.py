"""Route credentials: what a called agent checks to know who calls it, without the cluster secret.

The target of every route ticket carries a **route credential**: a JWT (RFC 7519) signed with
EdDSA over Ed25519 (PyJWT with ``cryptography``)::

    header  {"alg": "EdDSA", "typ": "JWT", "kid": "<region>.<RFC 7638 thumbprint of the key>"}
    claims  iss  the region whose node issued the ticket      sub  the caller (its token's subject)
            rol  the caller's token role                      aud  the one agent it may be shown to
            cap  the capability routed by (when there is one) tid  the ticket id
            jti  "<ticket id>.<n>" (n: the target's place)    iat, exp  seconds; exp = the ticket's expiry

(:class:`node.core.models.CallClaims`). The called agent verifies it with the public keys its region
serves at ``/.well-known/jwks.json`` (:class:`node.client.CallVerifier` does it); an alternate's
credential is issued when the caller fails over to it (``POST /v1/credentials``), so a resolve
signs once.

**Keys.** Each node process signs with its own Ed25519 key, generated in memory at start (the
private key never touches disk) unless ``NodeConfig.signing_key_file`` names a PEM file, which is
read — created with mode 0600 when missing, refused when others may read it — and rewritten on
rotation. Replicas of a region need not share a private key: each *publishes* its public key in
the region's Redis (``{prefix}:{region}:keys`` hash kid → JWK; ``…:keys:until`` sorted set
kid → end of the key's lease) and renews the lease every ``key_publish_interval_ms`` while it
signs with it, so the region's key set is the union of what its replicas sign with. A lease ends
``3 × key_publish_interval_ms + ticket_ttl_ms + CLOCK_LEEWAY_MS`` after its last renewal, later than
any credential the key signed (a renewal never shortens it: ``ZADD GT``).

**Rotation.** :meth:`RegionKeys.rotate` — ``POST /v1/admin/keys/rotate``, automatically once a key
is ``signing_key_max_age_ms`` old, and in effect at every restart without a key file — publishes a
new key, signs with it from then on and stops renewing the old one, which stays in the key set
until its lease ends: after the last credential it signed expired. Verifiers that meet a new
``kid`` fetch the key set again.

**Peers.** Regions learn each other's public keys over HTTP from the topology's node URLs (a
:class:`PeerKeySource`, filled by ``federation.keys``). The key set a node serves holds its own
region's keys and its peers', so an agent verifies a credential issued in any region with its own
node's key set; ``?kid=`` naming a peer's key this node does not hold yet makes it ask that peer
first (at most once a second per peer).
"""

from __future__ import annotations

import asyncio
import base64
import enum
import hashlib
import logging
import os
import stat
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import orjson
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt.algorithms import OKPAlgorithm

from ..core import NodeError, cancel_and_wait, now_ms
from ..core.models import PublicKey, TokenClaims, key_region
from ..store import RedisErrors

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from ..store import RegionStore

__all__ = ["ALGORITHM", "CLOCK_LEEWAY_MS", "DEFAULT_KEY_PUBLISH_INTERVAL_MS", "DEFAULT_SIGNING_KEY_MAX_AGE_MS",
           "JWKS_PATH", "KeysState", "PeerKeySource", "RegionKeys", "SigningKey", "SigningKeyError",
           "load_signing_key"]

log = logging.getLogger(__name__)

ALGORITHM = "EdDSA"
JWKS_PATH = "/.well-known/jwks.json"
DEFAULT_KEY_PUBLISH_INTERVAL_MS = 30_000
DEFAULT_SIGNING_KEY_MAX_AGE_MS = 24 * 3600 * 1000
# Clocks of nodes and agents disagree by this much at most (NTP keeps them far closer).
CLOCK_LEEWAY_MS = 5_000
_ISSUED_CACHE_SIZE = 100_000  # credentials kept for reuse (about 0.5 KB each)
# A credential may outlive its ticket by less than this, so that a caller's resolves of the same agent
# within it share one signature (see RegionKeys.issue).
DEFAULT_CREDENTIAL_REUSE_MS = 5_000
_PUBLISHED_CACHE_MS = 1_000   # the region's published keys are re-read from Redis at most this often
_UNKNOWN_KID_REREAD_MS = 100  # … and for a kid of this region that memory does not know, this often


class SigningKeyError(ValueError):
    """The signing key file cannot be read, parsed or created; the message says how to fix it."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class SigningKey:
    """One Ed25519 private key with its key id and public JWK."""

    __slots__ = ("_header", "created_at_ms", "jwk", "kid", "private")

    def __init__(self, private: Ed25519PrivateKey, *, region: str, created_at_ms: int) -> None:
        public = OKPAlgorithm.to_jwk(private.public_key(), as_dict=True)
        # RFC 7638: the SHA-256 of the required members in lexicographic order, no whitespace.
        canonical = orjson.dumps({"crv": public["crv"], "kty": public["kty"], "x": public["x"]},
                                 option=orjson.OPT_SORT_KEYS)
        self.private = private
        self.kid = f"{region}.{_b64(hashlib.sha256(canonical).digest())}"
        self.jwk = PublicKey(kty="OKP", crv="Ed25519", x=public["x"], kid=self.kid)
        self.created_at_ms = created_at_ms
        # The JWS header is the same for every credential of this key (the bytes PyJWT writes).
        self._header = _b64(orjson.dumps({"alg": ALGORITHM, "kid": self.kid, "typ": "JWT"},
                                         option=orjson.OPT_SORT_KEYS)).encode("ascii")

    def sign_jwt(self, claims: dict[str, object]) -> str:
        """A compact JWS (RFC 7515) of ``claims`` signed with this key: header, payload and
        signature, base64url without padding — what ``jwt.encode`` returns, a third of its cost."""
        signing_input = self._header + b"." + _b64(orjson.dumps(claims)).encode("ascii")
        return f"{signing_input.decode('ascii')}.{_b64(self.private.sign(signing_input))}"

    @classmethod
    def generate(cls, *, region: str, created_at_ms: int) -> SigningKey:
        return cls(Ed25519PrivateKey.generate(), region=region, created_at_ms=created_at_ms)

    def pem(self) -> bytes:
        return self.private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())


def load_signing_key(path: Path, *, region: str, now_ms_: int) -> SigningKey:
    """The Ed25519 key in the PEM file ``path``, created (mode 0600) when missing.

    Raises :class:`SigningKeyError` when the file cannot be read or written, is readable by group
    or others, or holds something other than an unencrypted Ed25519 private key.
    """
    path = path.expanduser()
    if not path.exists():
        key = SigningKey.generate(region=region, created_at_ms=now_ms_)
        write_signing_key(path, key)
        return key
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SigningKeyError(f"the signing key file {path} is readable by others (mode {stat.S_IMODE(mode):o}); "
                                  f"chmod 600 {path}")
        data = path.read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"cannot read the signing key file {path}: {exc.strerror or exc}; fix its "
                              "permissions (chmod 600, owned by this user) or point signing_key_file elsewhere") from exc
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise SigningKeyError(f"the signing key file {path} holds no unencrypted PEM private key ({exc}); remove it "
                              "to have a new Ed25519 key created there") from exc
    if not isinstance(private, Ed25519PrivateKey):
        raise SigningKeyError(f"the signing key file {path} holds a {type(private).__name__}, not an Ed25519 key; "
                              "remove it to have a new one created there")
    return SigningKey(private, region=region, created_at_ms=int(path.stat().st_mtime * 1000))


def write_signing_key(path: Path, key: SigningKey) -> None:
    """Write ``key`` to ``path`` with mode 0600, atomically (a reader sees the old key or the new)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key.pem())
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise SigningKeyError(f"cannot write the signing key file {path}: {exc.strerror or exc}; choose a writable "
                              "place for signing_key_file") from exc


class PeerKeySource(Protocol):
    """The public keys of the peer regions (``federation.keys`` fills it)."""

    def keys(self) -> list[PublicKey]:
        """Every peer key known now."""
        ...

    async def learn(self, kid: str) -> None:
        """Ask the region ``kid`` names for its keys now, if it is a peer (rate-limited; never raises)."""
        ...


class KeysState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSED = "closed"


class RegionKeys:
    """This node's signing key, the keys its region publishes (Redis) and its peers'.

    ``async with`` (or ``start``/``aclose``): starting loads or generates the key and publishes it
    (raises :class:`StoreUnavailable` without Redis, :class:`SigningKeyError` for a bad key file);
    a background task renews the lease and rotates by age. :meth:`issue` is synchronous.
    """

    def __init__(self, redis: aioredis.Redis, *, key_base: str, region: str, ticket_ttl_ms: int,
                 key_file: Path | None = None, publish_interval_ms: int = DEFAULT_KEY_PUBLISH_INTERVAL_MS,
                 max_age_ms: int = DEFAULT_SIGNING_KEY_MAX_AGE_MS, reuse_ms: int = DEFAULT_CREDENTIAL_REUSE_MS,
                 clock: Callable[[], int] = now_ms) -> None:
        if reuse_ms < 1_000 or reuse_ms % 1_000:
            raise ValueError("reuse_ms must be a whole number of seconds (credentials expire in seconds)")
        self.redis = redis
        self.region = region
        self.key_file = key_file
        self.publish_interval_ms = publish_interval_ms
        self.max_age_ms = max_age_ms
        self.reuse_ms = reuse_ms
        # A retired key stays published while a credential it signed can still be presented.
        self.lease_ms = 3 * publish_interval_ms + ticket_ttl_ms + reuse_ms + CLOCK_LEEWAY_MS
        self.clock = clock
        self.key_jwks = f"{key_base}:keys"
        self.key_until = f"{key_base}:keys:until"
        self.peers: PeerKeySource | None = None
        self.state = KeysState.NEW
        self.rotations = 0
        self._key: SigningKey | None = None
        self._published: dict[str, PublicKey] = {}
        self._published_at_ms = -_PUBLISHED_CACHE_MS
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        # (kid, caller, role, agent, capability) -> (credential, exp in s): signing is ~25 us, most of
        # a resolve, and callers ask for the same agents again and again (see issue()).
        self._issued: OrderedDict[tuple[str, str, str, str, str | None], tuple[str, int]] = OrderedDict()
        self.reused = 0

    @classmethod
    def of(cls, store: RegionStore, *, ticket_ttl_ms: int, key_file: Path | None = None,
           publish_interval_ms: int = DEFAULT_KEY_PUBLISH_INTERVAL_MS,
           max_age_ms: int = DEFAULT_SIGNING_KEY_MAX_AGE_MS,
           reuse_ms: int = DEFAULT_CREDENTIAL_REUSE_MS) -> RegionKeys:
        return cls(store.redis, key_base=store.key_base, region=store.region, ticket_ttl_ms=ticket_ttl_ms,
                   key_file=key_file, publish_interval_ms=publish_interval_ms, max_age_ms=max_age_ms,
                   reuse_ms=reuse_ms)

    @property
    def current(self) -> SigningKey:
        if self._key is None:
            raise NodeError("the node's signing key is not loaded yet (start the node first)", code="keys_not_started")
        return self._key

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> RegionKeys:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        if self.state is not KeysState.NEW:
            return
        now = self.clock()
        if self.key_file is not None:
            key = load_signing_key(self.key_file, region=self.region, now_ms_=now)
        else:
            key = SigningKey.generate(region=self.region, created_at_ms=now)
        await self._publish(key)
        self._key = key
        self.state = KeysState.RUNNING
        self._task = asyncio.get_running_loop().create_task(self._renew(), name=f"signing-keys-{self.region}")
        self._task.add_done_callback(self._renewal_ended)
        log.info("region %s: signing route credentials with key %s%s", self.region, key.kid,
                 f" from {self.key_file}" if self.key_file else " (generated in memory)")

    async def aclose(self) -> None:
        """Stop renewing; the published key lapses with its lease. Idempotent."""
        if self.state is KeysState.CLOSED:
            return
        self.state = KeysState.CLOSED
        if self._task is not None:
            await cancel_and_wait([self._task])

    def _renewal_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("region %s: the signing-key renewal died: %r; the key lapses when its lease ends",
                      self.region, task.exception())

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.publish_interval_ms / 1000)
            try:
                if self.clock() - self.current.created_at_ms >= self.max_age_ms:
                    await self.rotate()
                else:
                    await self._publish(self.current)
            except NodeError as exc:  # Redis away: the lease still covers the next intervals
                log.warning("region %s: could not renew signing key %s: %s", self.region, self.current.kid,
                            exc.message)

    # -- keys --------------------------------------------------------------------------------

    async def rotate(self) -> SigningKey:
        """Sign with a new key from now on; the old one stays published until its lease ends."""
        async with self._lock:
            old = self.current
            key = SigningKey.generate(region=self.region, created_at_ms=self.clock())
            if self.key_file is not None:
                write_signing_key(self.key_file, key)
            await self._publish(key)
            self._key = key
            self.rotations += 1
        log.info("region %s: rotated the signing key %s -> %s (the old one stays published for up to %d ms)",
                 self.region, old.kid, key.kid, self.lease_ms)
        return key

    async def _publish(self, key: SigningKey) -> None:
        now = self.clock()
        async with RedisErrors(self.region):
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(self.key_jwks, key.kid, key.jwk.model_dump_json())
                pipe.zadd(self.key_until, {key.kid: now + self.lease_ms}, gt=True)
                await pipe.execute()
            lapsed = await self.redis.zrangebyscore(self.key_until, "-inf", now)
            if lapsed:
                async with self.redis.pipeline(transaction=True) as pipe:
                    pipe.hdel(self.key_jwks, *lapsed)
                    pipe.zrem(self.key_until, *lapsed)
                    await pipe.execute()
        self._published[key.kid] = key.jwk

    async def published(self, *, max_age_ms: int = _PUBLISHED_CACHE_MS) -> dict[str, PublicKey]:
        """This region's keys whose lease has not ended, read from Redis at most every ``max_age_ms``."""
        now = self.clock()
        if now - self._published_at_ms < max_age_ms:
            return self._published
        try:
            async with RedisErrors(self.region):
                kids = await self.redis.zrangebyscore(self.key_until, now, "+inf")
                raw = await self.redis.hmget(self.key_jwks, kids) if kids else []
        except NodeError as exc:  # serve what memory holds; the next request reads again
            log.warning("region %s: cannot read the published signing keys: %s", self.region, exc.message)
            return self._published
        found: dict[str, PublicKey] = {}
        for kid, value in zip(kids, raw):
            if value is None:
                continue
            try:
                found[kid] = PublicKey.model_validate_json(value)
            except ValueError:
                log.warning("region %s: skipping the published key %s: not a JWK this node reads", self.region, kid)
        if self._key is not None:
            found.setdefault(self._key.kid, self._key.jwk)
        self._published, self._published_at_ms = found, now
        return found

    async def key_set(self, *, kid: str | None = None) -> list[PublicKey]:
        """The keys credentials valid in this region are signed with: this region's, then its peers'.

        ``kid``: a key the asker needs; if neither this region nor a peer is known to hold it,
        the region's keys are read again (another replica may have just published it) or the
        peer it names is asked first.
        """
        own = await self.published()
        peers = self.peers.keys() if self.peers is not None else []
        if kid is not None and kid not in own and all(key.kid != kid for key in peers):
            if key_region(kid) == self.region:
                own = await self.published(max_age_ms=_UNKNOWN_KID_REREAD_MS)
            elif self.peers is not None:
                await self.peers.learn(kid)
                peers = self.peers.keys()
        return [*own.values(), *peers]

    # -- credentials -------------------------------------------------------------------------

    def issue(self, *, caller: TokenClaims, agent_id: str, capability: str | None, ticket_id: str, index: int,
              expires_at_ms: int, now_ms_: int) -> str:
        """A route credential for calling ``agent_id`` (``index``: its place in the ticket); synchronous.

        ``exp`` is the ticket's expiry rounded up to a multiple of ``reuse_ms`` (whole seconds): the
        credential never expires before its ticket, and outlives it by less than ``reuse_ms``. Every
        ticket of the same caller for the same agent and capability whose expiry falls in the same
        window gets the same statement — and the same credential, signed once (``tid``/``jti`` then
        name the first of those tickets). An Ed25519 signature is most of a resolve's own work; a
        caller resolving an agent more often than once per window signs nothing after the first.
        """
        key = self.current
        reuse_ms = self.reuse_ms
        expires_s = -(-expires_at_ms // reuse_ms) * reuse_ms // 1000
        cache_key = (key.kid, caller.sub, caller.role.value, agent_id, capability)
        cached = self._issued.get(cache_key)
        if cached is not None and cached[1] == expires_s:
            self.reused += 1
            return cached[0]
        claims: dict[str, object] = {"iss": self.region, "sub": caller.sub, "rol": caller.role.value,
                                     "aud": agent_id, "tid": ticket_id, "jti": f"{ticket_id}.{index}",
                                     "iat": now_ms_ // 1000, "exp": expires_s}
        if capability is not None:
            claims["cap"] = capability
        credential = key.sign_jwt(claims)
        self._issued[cache_key] = (credential, expires_s)
        self._issued.move_to_end(cache_key)
        if len(self._issued) > _ISSUED_CACHE_SIZE:
            self._issued.popitem(last=False)
        return credential
