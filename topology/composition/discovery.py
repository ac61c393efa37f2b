"""Semantic discovery attached to a node: the node's ``Searcher`` and the router's ``Matcher``.

Every agent the node knows — its own region's (from the cache) and, with federation, its peers'
(from the remote catalog) — is indexed in a :class:`semantic.SemanticSearch` as one document
per capability plus one for its description (the search builds the agent-level text from them). The index follows registrations, updates,
expiries and federation events through the same change listeners as the rest of the node; a
single owned worker task applies them, coalescing bursts (one pending state per agent), so the
listeners stay synchronous and quick. Status and load changes do not touch the index:
routability is checked against the live records at query time.

Vectors are cached in the region's Redis by (model, text hash), so a restarted node or another
replica does not encode the same text again; before indexing a remote agent, the vectors its
home region computed are fetched from that region's node (``POST /v1/semantic/vectors``, by
key), so an agent's texts are encoded once, by its home region. Without
torch/sentence-transformers (or with ``semantic_enabled=False``) the same search runs lexically
and says ``mode: lexical``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Annotated

import aiohttp
import numpy as np
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from node.core import cancel_and_wait
from node.core.models import AgentRecord, ChangeEvent, ChangeKind, Locality, Scope, SearchHit, SearchResponse, TokenRole
from node.http import CALLER, json_response, parse_body
from node.routing import SemanticMatch, SemanticMatches
from node.service import RegistryNode
from node.store import redis_client
from node.trust import SelfToken, Signer, require_peer
from node.view import AgentIndex
from semantic import (
    DEFAULT_ENCODERS,
    Document,
    Embedder,
    LayeredVectorCache,
    MemoryVectorCache,
    RedisVectorCache,
    SemanticSearch,
    VectorCache,
    default_embedders,
    suggested_min_score,
)

log = logging.getLogger(__name__)

_OWNER_SEPARATOR = "/"
_BATCH = 256
VECTORS_PATH = "/v1/semantic/vectors"
PEER_VECTOR_TIMEOUT_S = 10.0
PEER_SETTLE_WAIT_S = 5.0
MAX_VECTOR_KEYS = 1_000  # keys of one POST /v1/semantic/vectors


def owner_id(region: str, agent_id: str) -> str:
    """Index key of an agent: the same agent_id may exist in two regions."""
    return f"{region}{_OWNER_SEPARATOR}{agent_id}"


def documents_of(record: AgentRecord, *, owner: str | None = None) -> list[Document]:
    """The search documents of ``record``; pass its ``owner`` id when it is at hand (the index
    then holds one such string per agent, not one per place it is used)."""
    owner = owner or owner_id(record.region, record.agent_id)
    documents = [Document.for_capability(owner_id=owner, name=capability.name, description=capability.description,
                                         tags=capability.tags, examples=capability.examples,
                                         version=capability.version)
                 for capability in record.capabilities]
    if record.description or record.display_name:
        documents.append(Document.for_description(owner_id=owner, title=record.display_name,
                                                  description=record.description))
    return documents


class SemanticDiscovery:
    """Keeps a semantic index of a node's agents and answers searches and router fallbacks."""

    def __init__(self, node: RegistryNode, search: SemanticSearch, *,
                 on_close: Callable[[], Awaitable[None]] | None = None, vector_cache: VectorCache | None = None,
                 peer_urls: Mapping[str, str] | None = None, peer_token: SelfToken | None = None) -> None:
        self.node = node
        self.search_index = search
        self._on_close = on_close
        self._vector_cache = vector_cache
        self._peer_urls = dict(peer_urls or {})
        self.peer_token = peer_token
        self.vectors_from_peers = 0
        self._peer_session: aiohttp.ClientSession | None = None
        self._pending: dict[str, AgentRecord | None] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._worker: asyncio.Task[None] | None = None
        self._unsubscribe: list[Callable[[], None]] = []
        self.applied = 0

    # -- lifecycle (an aiohttp cleanup context: runs with the node's HTTP server) -------------

    async def lifespan(self, app: web.Application) -> AsyncIterator[None]:
        await self.start()
        yield
        await self.aclose()

    async def start(self) -> None:
        await self.search_index.start()
        log.info("region %s: semantic search in %s mode%s", self.node.region, self.search_index.mode.value,
                 f" ({self.search_index.unavailable_reason})" if self.search_index.unavailable_reason else "")
        self._unsubscribe.append(self.node.cache.subscribe(self._on_change))
        remote = self.node.router.remote
        if remote is not None:  # federation attached
            self._unsubscribe.append(remote.subscribe(self._on_change))
        for index in self._indexes():
            for record in index:
                self._queue(record.region, record.agent_id, record)
        if self._peer_urls:
            tls = aiohttp.TCPConnector(ssl=self.node.config.client_ssl_context())  # peers' https: the node's ca_file
            self._peer_session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PEER_VECTOR_TIMEOUT_S),
                                                       connector=tls)
        self._worker = asyncio.create_task(self._run(), name=f"semantic-index-{self.node.region}")

    async def aclose(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()
        if self._worker is not None:
            await cancel_and_wait([self._worker])
            self._worker = None
        if self._peer_session is not None:
            await self._peer_session.close()
            self._peer_session = None
        await self.search_index.aclose()
        if self._on_close is not None:
            await self._on_close()

    async def settled(self, timeout_s: float = 30.0) -> None:
        """Wait until every change seen so far is in the index (tests, startup checks)."""
        await asyncio.wait_for(self._idle.wait(), timeout_s)

    # -- keeping the index current -----------------------------------------------------------

    def _on_change(self, event: ChangeEvent) -> None:
        if event.kind is ChangeKind.DELETE:
            self._queue(event.region, event.agent_id, None)
        elif event.kind is ChangeKind.UPSERT and event.record is not None:
            self._queue(event.region, event.agent_id, event.record)

    def _queue(self, region: str, agent_id: str, record: AgentRecord | None) -> None:
        self._pending[owner_id(region, agent_id)] = record
        self._idle.clear()
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                # islice, not list(...)[:_BATCH]: copying 100,000 pending items per batch of 256 was
                # quadratic. A batch without an embedder never awaits anything that suspends, so
                # yield between batches: a node indexing its region at start kept its listener
                # from opening for the whole 8 s (bench/scale.py cold start at 100,000 agents).
                batch = dict(itertools.islice(self._pending.items(), _BATCH))
                for key in batch:
                    del self._pending[key]
                upserts = {}
                for owner, record in batch.items():
                    if record is None:
                        self.search_index.remove_owner(owner)
                        continue
                    documents = documents_of(record, owner=owner)
                    # Re-registrations (restarts, weight or endpoint changes) rarely change the
                    # texts: skip them rather than re-index (compared with what the index holds,
                    # not with a copy of it: ~120 B per agent).
                    if self.search_index.documents_of(owner) != documents:
                        upserts[owner] = documents
                if upserts:
                    try:
                        await self._prefetch_from_home_regions(upserts)
                        await self.search_index.upsert_owners(upserts)
                    except asyncio.CancelledError:
                        raise
                    except Exception:  # one bad batch must not stop indexing; it is retried on next change
                        log.exception("region %s: indexing %d agents failed", self.node.region, len(upserts))
                self.applied += len(batch)
                await asyncio.sleep(0)
            self._idle.set()

    async def _prefetch_from_home_regions(self, upserts: Mapping[str, list[Document]]) -> None:
        """Put the vectors that remote agents' home regions computed into our cache first."""
        embedders = self.search_index.embedders
        session = self._peer_session
        if not embedders or self._vector_cache is None or session is None:
            return
        keys_by_region: dict[str, list[str]] = {}
        for owner, documents in upserts.items():
            region = owner.partition(_OWNER_SEPARATOR)[0]
            if region in self._peer_urls:
                texts = self.search_index.embedding_texts(documents)
                keys_by_region.setdefault(region, []).extend(
                    embedder.cache_key(text) for embedder in embedders for text in texts)
        if not keys_by_region:
            return
        for region, keys in keys_by_region.items():
            have = await self._vector_cache.get_many(keys)
            missing = [key for key in keys if key not in have]
            for start in range(0, len(missing), MAX_VECTOR_KEYS):  # a peer answers this many keys at once
                found = await fetch_vectors(session, self._peer_urls[region], missing[start : start + MAX_VECTOR_KEYS],
                                            token=self.peer_token)
                if found:
                    await self._vector_cache.set_many(found)
                    self.vectors_from_peers += len(found)

    # -- answering -----------------------------------------------------------------------------

    def _indexes(self) -> list[AgentIndex]:
        indexes = [self.node.cache.index]
        if self.node.router.remote is not None:
            indexes += [peer.index for peer in self.node.router.remote.peers()]
        return indexes

    def _lookup(self, owner: str) -> AgentRecord | None:
        region, _, agent_id = owner.partition(_OWNER_SEPARATOR)
        if region == self.node.region:
            return self.node.cache.index.get(agent_id)
        if self.node.router.remote is None:
            return None
        for peer in self.node.router.remote.peers():
            if peer.region == region:
                return peer.index.get(agent_id)
        return None

    @property
    def suggested_threshold(self) -> float:
        """The calibrated threshold of the search's default ranking for its mode (the packaged
        model's; see semantic.search); a single match carries its own (:meth:`match`)."""
        return self.search_index.suggested_threshold

    async def search(self, query: str, *, k: int, scope: Scope, routable_only: bool,
                     visible: Callable[[AgentRecord], bool] | None = None) -> SearchResponse:
        started = time.perf_counter()

        def allow(owner: str) -> bool:
            if scope is Scope.LOCAL and not owner.startswith(self.node.region + _OWNER_SEPARATOR):
                return False
            record = self._lookup(owner)
            if record is None or (visible is not None and not visible(record)):
                return False
            return not routable_only or self.node.routable(record)

        result = await self.search_index.search(query, k, allow)
        hits = []
        for hit in result.hits:
            record = self._lookup(hit.owner_id)
            if record is None:
                continue
            hits.append(SearchHit(
                agent_id=record.agent_id, region=record.region,
                locality=Locality.LOCAL if record.region == self.node.region else Locality.REMOTE,
                capability=hit.capability, score=round(hit.score, 4),
                vector_score=None if hit.vector_score is None else round(hit.vector_score, 4),
                lexical_score=round(hit.lexical_score, 4), routable=self.node.routable(record),
                display_name=record.display_name,
            ))
        if scope is Scope.LOCAL_FIRST:
            hits.sort(key=lambda h: h.locality is not Locality.LOCAL)  # stable: score order within each
        return SearchResponse(query=query, mode=result.mode.value, scope=scope, hits=hits,
                              corrected_query=result.corrected_query,
                              took_ms=round((time.perf_counter() - started) * 1000, 3))

    async def match(self, text: str, *, k: int, allow: Callable[[str, str], bool] | None = None
                    ) -> SemanticMatches:
        """Router fallback: the best routable agents for a capability name nobody has exactly, and
        the threshold of the ranking that scored them (lexical for a mostly-Chinese request)."""
        def allowed(owner: str) -> bool:
            record = self._lookup(owner)
            if record is None or not self.node.routable(record):
                return False
            return allow is None or allow(record.region, record.agent_id)

        result = await self.search_index.search(_as_sentence(text), k, allowed)
        threshold = result.suggested_threshold or suggested_min_score(result.ranking)  # hybrid or lexical, never vector
        matches = []
        for hit in result.hits:
            region, _, agent_id = hit.owner_id.partition(_OWNER_SEPARATOR)
            matches.append(SemanticMatch(agent_id=agent_id, region=region, capability=hit.capability,
                                         score=hit.score))
        return SemanticMatches(matches=matches, threshold=threshold, ranking=result.ranking.value)


async def fetch_vectors(session: aiohttp.ClientSession, node_url: str, keys: Sequence[str], *,
                        token: SelfToken | None = None) -> dict[str, np.ndarray]:
    """Vectors a peer node holds for ``keys`` (``POST /v1/semantic/vectors``); failures are misses.
    A peer that refuses ``token`` as revoked gets a new one next time."""
    headers = {"Authorization": f"Bearer {token.current()}"} if token is not None else {}
    try:
        async with session.post(f"{node_url.rstrip('/')}{VECTORS_PATH}", json={"keys": list(keys)},
                                headers=headers) as response:
            if response.status == 401 and token is not None:
                token.renew()
            if response.status != 200:
                return {}
            body = await response.json()
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.debug("peer %s gave no vectors: %s", node_url, exc)
        return {}
    wanted = set(keys)
    return {key: np.frombuffer(base64.b64decode(encoded), dtype="<f4").astype(np.float32)
            for key, encoded in body.get("vectors", {}).items() if key in wanted}


def _as_sentence(capability: str) -> str:
    """``translate.chinese_to_english`` reads better to a sentence model as words."""
    return capability.replace(".", " ").replace("_", " ").replace(":", " ").replace("/", " ").replace("-", " ")


def attach_discovery(node: RegistryNode, *, semantic_enabled: bool = True, model: str | None = None,
                     encoders: Sequence[str] | None = None, embedder: Embedder | None = None,
                     peer_urls: Mapping[str, str] | None = None, secret: bytes | None = None) -> SemanticDiscovery:
    """Attach semantic search and the router's semantic fallback to ``node`` (before it serves).

    The search ranks with ``embedder`` when given; else with one embedder per name of
    ``encoders`` (:func:`semantic.encoder_for`), or ``model`` alone, or the default pair
    (all-MiniLM-L6-v2 and multilingual USE), all on the region's vector cache (keys name the
    model). With ``peer_urls`` (region → node URL) and the cluster ``secret``, a remote agent's
    vectors are fetched from its home region before a model would encode them.
    """
    closers: list[Callable[[], Awaitable[None]]] = []
    region_cache: RedisVectorCache | None = None
    vector_cache: VectorCache | None = None
    embedders = [embedder] if embedder is not None else None
    if embedders is None and semantic_enabled:
        # Vectors are raw bytes: a client of its own, without the store's string decoding.
        vectors = redis_client(node.config.redis_url, key_base=node.store.key_base, settings=node.config,
                               decode_responses=False)
        closers.append(vectors.aclose)
        region_cache = RedisVectorCache(vectors, prefix=f"{node.store.key_base}:vec")
        vector_cache = LayeredVectorCache(MemoryVectorCache(), region_cache)
        names = list(encoders) if encoders else [model] if model is not None else list(DEFAULT_ENCODERS)
        embedders = default_embedders(names, cache=vector_cache)
    peer_token = None
    if peer_urls and secret is not None:
        peer_token = SelfToken(Signer(secret), f"{node.region}.semantic.peer", TokenRole.PEER)

    async def close() -> None:
        for closer in closers:
            await closer()

    search = SemanticSearch(embedders=embedders, semantic_enabled=semantic_enabled)
    discovery = SemanticDiscovery(node, search, on_close=close, vector_cache=vector_cache, peer_urls=peer_urls,
                                  peer_token=peer_token)
    node.searcher = discovery
    node.router.matcher = discovery

    async def vectors_for_peers(request: web.Request) -> web.Response:
        """Vectors this region holds, by cache key, for a peer indexing this region's agents."""
        require_peer(request[CALLER], "the vectors route")
        body = await parse_body(request, VectorRequest)
        if region_cache is None:
            return json_response({"vectors": {}})
        with contextlib.suppress(TimeoutError):
            await discovery.settled(timeout_s=PEER_SETTLE_WAIT_S)  # our own agents first
        found = await region_cache.get_many(body.keys)
        return json_response({"vectors": {key: base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes())
                                          .decode() for key, vector in found.items()}})

    def install(app: web.Application) -> None:
        app.cleanup_ctx.append(discovery.lifespan)
        app.router.add_post(VECTORS_PATH, vectors_for_peers)

    node.extensions.append(install)
    node.metrics.gauge("agent_reach_semantic_texts_encoded", "Texts this node's models encoded (each model's count)",
                       lambda: sum(each.stats.texts_encoded for each in search.embedders))
    node.metrics.gauge("agent_reach_semantic_cache_hits", "Texts whose vector came from a cache (local or peer)",
                       lambda: sum(each.stats.cache_hits for each in search.embedders))
    return discovery


class VectorRequest(BaseModel):
    """``POST /v1/semantic/vectors``: the cache keys a peer wants."""

    model_config = ConfigDict(extra="forbid")

    keys: list[Annotated[str, Field(max_length=200)]] = Field(max_length=MAX_VECTOR_KEYS)


__all__ = ["SemanticDiscovery", "attach_discovery", "documents_of", "fetch_vectors", "owner_id"]
