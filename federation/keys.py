"""The peer regions' public signing keys, so a cross-region route credential verifies here too.

A caller resolves in its own region, whose node signs the route credential; the agent it calls
lives in another region and verifies with *its* node's key set (``/.well-known/jwks.json``).
So every node holds its peers' public keys: :class:`PeerKeys` fetches each peer's key set from
the peer's node URLs in the topology — the same addresses anti-entropy pulls snapshots from —
every ``key_refresh_interval_ms``, and at once (at most once a second per peer) when someone asks
this node for a key of a peer that it does not hold yet (:meth:`PeerKeys.learn`).

Why HTTP from the topology's URLs and not the Kafka topics: a key is believed because of where it
was fetched from — the peer's own node at an address the operator configured (https in
production) — while a topic accepts whatever anyone with write access to the broker puts on it;
the key set is public and small, and its changes (a rotation, a restart) are rare. Of what a
peer serves only its own region's keys are kept (``kid`` = ``<region>.<thumbprint>``), so one
region can never speak for another; and of those at most ``MAX_REGION_KEYS`` (256), from an
answer read to at most ``MAX_KEY_SET_BYTES`` (4 MiB), so a hostile peer can neither fill this
node's memory nor make the key set this node serves its agents too large for them to read. Each
replica fetches for itself; nothing is stored in Redis.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable

import aiohttp
import orjson

from node.core import BodyTooLarge, cancel_and_wait, read_bounded
from node.core.models import MAX_KEY_SET_BYTES, MAX_REGION_KEYS, PublicKey, key_region, usable_keys
from node.trust import JWKS_PATH

from .config import FederationConfig

__all__ = ["LEARN_MIN_INTERVAL_S", "PeerKeys"]

log = logging.getLogger(__name__)

LEARN_MIN_INTERVAL_S = 1.0


class PeerKeys:
    """Every peer region's public keys, kept fresh; fills ``node.trust.credentials.PeerKeySource``.

    ``async with`` (or ``start``/``aclose``): starting opens the session and starts the task it
    owns, which fetches every peer at once and then every ``key_refresh_interval_ms`` (a peer that
    does not answer is tried again on the next round; :meth:`learn` does not wait for a round).
    """

    def __init__(self, config: FederationConfig, *, clock: Callable[[], float] = time.monotonic,
                 ssl_context: ssl.SSLContext | bool = True) -> None:
        self.config = config
        self.ssl_context = ssl_context  # what a peer's https node is checked against
        self.clock = clock
        self.fetches = 0
        self.failures = 0
        self._keys: dict[str, list[PublicKey]] = {peer.region: [] for peer in config.peers}
        self._fetched_at: dict[str, float] = {}
        self._locks = {peer.region: asyncio.Lock() for peer in config.peers}
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> PeerKeys:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        if self._session is not None:
            return
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
            total=self.config.request_timeout_ms / 1000), connector=aiohttp.TCPConnector(ssl=self.ssl_context))
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"peer-keys-{self.config.region}")
        self._task.add_done_callback(self._ended)

    async def aclose(self) -> None:
        """Stop refreshing and close the session. Idempotent."""
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("region %s: the peer-key refresh died: %r; peers' keys are no longer refreshed",
                      self.config.region, task.exception())

    # -- node.trust.credentials.PeerKeySource --------------------------------------------------------

    def keys(self) -> list[PublicKey]:
        return [key for keys in self._keys.values() for key in keys]

    async def learn(self, kid: str) -> None:
        region = key_region(kid)
        if region not in self._keys:
            return
        async with self._locks[region]:
            if any(key.kid == kid for key in self._keys[region]):
                return  # a concurrent request just fetched it
            since = self.clock() - self._fetched_at.get(region, -LEARN_MIN_INTERVAL_S)
            if since >= LEARN_MIN_INTERVAL_S:
                await self._fetch(region)

    # -- fetching ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await asyncio.gather(*(self._refresh(region) for region in self._keys))
            await asyncio.sleep(self.config.key_refresh_interval_ms / 1000)

    async def _refresh(self, region: str) -> None:
        async with self._locks[region]:
            await self._fetch(region)

    async def _fetch(self, region: str) -> None:
        """Replace ``region``'s keys with what its first answering node serves (its own keys only)."""
        session = self._session
        if session is None:
            return
        self.fetches += 1
        self._fetched_at[region] = self.clock()
        problems = []
        for url in self.config.peer(region).node_urls:
            try:
                async with session.get(url.rstrip("/") + JWKS_PATH, allow_redirects=False) as response:
                    raw = await read_bounded(response, MAX_KEY_SET_BYTES)
                    if response.status != 200:
                        problems.append(f"{url}: HTTP {response.status}")
                        continue
                body = orjson.loads(raw)
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError, BodyTooLarge) as exc:
                problems.append(f"{url}: {type(exc).__name__}: {exc}")
                continue
            found = usable_keys(body.get("keys") if isinstance(body, dict) else None)
            own = [key for key in found if key.region == region]
            if len(own) > MAX_REGION_KEYS:
                log.warning("region %s: peer %s serves %d signing keys; keeping the first %d (MAX_REGION_KEYS)",
                            self.config.region, region, len(own), MAX_REGION_KEYS)
            self._keys[region] = own[:MAX_REGION_KEYS]
            return
        self.failures += 1
        log.warning("region %s: cannot fetch the signing keys of peer %s (keeping %d known): %s", self.config.region,
                    region, len(self._keys[region]), "; ".join(problems))
