"""``Federation``: the cross-region attachment of one region's node.

It owns the replica of the peers (:class:`PeerCatalog`), the publisher, the consumer and
anti-entropy, and attaches them through the node's hooks only::

    federation = Federation(config, store=node.store, secret=secret)
    federation.attach(node)   # before node.start()

* ``node.router.remote`` ← the catalog (routing and ``find`` see the peers, nearest first; the
  peers beyond ``replicate_depth`` by their summaries only);
* ``node.router.forwarder`` ← the :class:`Forwarder` that asks summary-only peers' nodes;
* ``node.leadership`` duties ← publisher, summary publisher, consumer and the revocation relay
  (one of each per region, on the leader); every replica reads the peers' summaries
  (:class:`SummaryReader`);
* ``node.revocations`` ← the relay reads its log and applies the peers' revocations
  (:class:`RevocationRelay`: a token revoked in any region is refused in all);
* ``node.acl`` ← its relay sends this region's ACL rules and applies the peers' (:class:`AclRelay`);
* ``node.watch`` ← every applied remote change (``/v1/watch`` streams them);
* ``node.keys.peers`` ← the peers' public signing keys (:class:`PeerKeys`), so route credentials
  issued in a peer region verify against this node's ``/.well-known/jwks.json``;
* ``node.metrics.registry`` ← the federation's families (:mod:`federation.metrics`);
* ``node.extensions`` ← the lifecycle of the catalog and the peer keys (an aiohttp cleanup
  context: loaded before the server accepts requests, closed with it) and
  ``GET /v1/federation/status``.

The duties wait for the catalog to load, so a node that never serves HTTP never consumes.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from aiohttp import web

from node.core import now_ms
from node.core.models import TokenRole
from node.http import CALLER
from node.routing import described_for
from node.store import RegionStore
from node.trust import SelfToken, Signer

from .antientropy import AntiEntropy
from .config import FederationConfig
from .consumer import Consumer
from .digest import read_region_state
from .forward import Forwarder
from .kafka import check_access
from .keys import PeerKeys
from .metrics import FederationCollector
from .publisher import Publisher
from .replica import PeerCatalog
from .replica_store import ReplicaStore
from .acl import AclRelay
from .revocations import RevocationRelay
from .summary import SummaryPublisher, SummaryReader

if TYPE_CHECKING:
    from node.service import RegistryNode

log = logging.getLogger(__name__)

STATUS_PATH = "/v1/federation/status"


class Federation:
    """Replication of one region with its peers over Kafka; see the module docstring."""

    def __init__(self, config: FederationConfig, *, store: RegionStore, secret: bytes,
                 peer_ssl_context: ssl.SSLContext | bool = True) -> None:
        """``peer_ssl_context``: what the peers' https nodes are checked against (forwarded lookups,
        snapshots, key sets): the node's ``ClientTlsSettings.client_ssl_context()``."""
        config.security.client_options()  # a missing CA file or password variable: KafkaSettingsInvalid now
        self.config = config
        self.store = store
        self.replica_store = ReplicaStore(store.redis, region=config.region, key_prefix=config.key_prefix,
                                          feed_maxlen=config.feed_maxlen, quarantine=store.quarantine)
        self.catalog = PeerCatalog(self.replica_store, peers=[peer.region for peer in config.peers],
                                   stale_after_ms=config.stale_after_ms, feed_block_ms=config.feed_block_ms,
                                   replicated=[peer.region for peer in config.replicated_peers],
                                   node_urls={peer.region: peer.node_urls for peer in config.peers})
        signer = Signer(secret)
        self.forwarder = Forwarder(config, signer=signer, ssl_context=peer_ssl_context)
        self.summaries = SummaryReader(config, catalog=self.catalog)
        self.summary_publisher: SummaryPublisher | None = None
        self.revocation_relay: RevocationRelay | None = None
        self.acl_relay: AclRelay | None = None
        self.peer_token = SelfToken(signer, f"federation:{config.region}", TokenRole.PEER)
        self.anti_entropy = AntiEntropy(config, catalog=self.catalog, replica_store=self.replica_store,
                                        token=self.peer_token.current, renew_token=self.peer_token.renew,
                                        ssl_context=peer_ssl_context)
        self.publisher = Publisher(config, store=store, replica_store=self.replica_store)
        self.consumer = Consumer(config, catalog=self.catalog, replica_store=self.replica_store,
                                 anti_entropy=self.anti_entropy)
        self.peer_keys = PeerKeys(config, ssl_context=peer_ssl_context)

    def attach(self, node: RegistryNode) -> None:
        """Wire into ``node`` (not yet started); see the module docstring."""
        if node.region != self.config.region:
            raise ValueError(f"federation of region {self.config.region} cannot attach to a node of {node.region}")
        node.router.remote = self.catalog
        node.router.forwarder = self.forwarder
        node.keys.peers = self.peer_keys
        self.catalog.subscribe(node.watch.publish)
        self.summary_publisher = SummaryPublisher(self.config, index=lambda: node.cache.index,
                                                  lease_horizon_ms=node.cache.routable_now_ms)
        node.leadership.add_duty("federation-publisher", self.publisher.run)
        node.leadership.add_duty("federation-summaries", self.summary_publisher.run)
        node.leadership.add_duty("federation-consumer", self.consumer.run)
        self.revocation_relay = RevocationRelay(self.config, revocations=node.revocations,
                                                quarantine=self.store.quarantine)
        node.revocations.peers = tuple(peer.region for peer in self.config.peers)
        node.leadership.add_duty("federation-revocations", self.revocation_relay.run)
        self.acl_relay = AclRelay(self.config, acl=node.acl, quarantine=self.store.quarantine)
        node.leadership.add_duty("federation-acl", self.acl_relay.run)
        node.metrics.registry.register(FederationCollector(self, region_version=lambda: node.cache.index.version))
        node.extensions.append(self._install)

    async def start(self) -> None:
        """Raises :class:`~federation.errors.KafkaAccessDenied` when the broker refuses this client's TLS,
        credentials or rights (see :func:`federation.kafka.check_access`); an unreachable broker is retried."""
        await check_access(self.config)
        await self.catalog.start()
        await self.peer_keys.start()
        await self.forwarder.start()
        await self.summaries.start()

    async def aclose(self) -> None:
        await self.summaries.aclose()
        await self.forwarder.aclose()
        await self.peer_keys.aclose()
        await self.catalog.aclose()

    async def __aenter__(self) -> Federation:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def status(self) -> dict[str, object]:
        """This region's own watermark and digest (what its beacon would say now) and every peer's view."""
        state = await read_region_state(self.store)
        digest, count = state.live_digest(at_ms=now_ms())
        publisher, consumer, anti_entropy = self.publisher.stats, self.consumer.stats, self.anti_entropy.stats
        return {
            "region": self.config.region,
            "topic": self.config.topic(self.config.region),
            "beacon_topic": self.config.beacon_topic(self.config.region),
            "watermark": state.version,
            "live_count": count,
            "digest": digest,
            "kafka": {"bootstrap_servers": self.config.bootstrap_servers, **self.config.security.describe()},
            "publisher": {"state": self.publisher.state.value, "position": publisher.position,
                          "published": publisher.published, "beacons": publisher.beacons,
                          "failures": publisher.failures, "topic_recreated": publisher.topic_recreated,
                          "tombstones": publisher.tombstones,
                          "last_error": publisher.last_error},
            "consumer": {"state": self.consumer.state.value, "records": consumer.records,
                         "applied": consumer.applied, "invalid": consumer.invalid, "gaps": consumer.gaps,
                         "beacon_mismatches": consumer.beacon_mismatches,
                         "broker_data_losses": consumer.broker_data_losses, "failures": consumer.failures,
                         "tombstones": consumer.tombstones, "newer_schema": consumer.newer_schema,
                         "last_error": consumer.last_error,
                         "offsets": {self.consumer.offset_name(p): o for p, o in self.consumer.next_offsets.items()}},
            "anti_entropy": {"runs": anti_entropy.runs, "failures": anti_entropy.failures,
                             "pending": self.anti_entropy.pending, "last_reason": anti_entropy.last_reason,
                             "last_error": anti_entropy.last_error,
                             "last_duration_ms": anti_entropy.last_duration_ms},
            "summaries": self._summary_status(),
            "revocations": self.revocation_relay.describe() if self.revocation_relay is not None else None,
            "acl": self.acl_relay.describe() if self.acl_relay is not None else None,
            "peer_token": _described(self.peer_token),
            "peers": self.catalog.describe(),
            "peer_keys": {"known": sorted(key.kid for key in self.peer_keys.keys()),
                          "fetches": self.peer_keys.fetches, "failures": self.peer_keys.failures},
        }

    def _summary_status(self) -> dict[str, object]:
        reader = self.summaries.stats
        status: dict[str, object] = {"topic": self.config.summary_topic(self.config.region),
                                     "interval_ms": self.config.summary_interval_ms,
                                     "replicate_depth": self.config.replicate_depth,
                                     "read": {"records": reader.records, "applied": reader.applied,
                                              "invalid": reader.invalid, "failures": reader.failures},
                                     "forwarded": self.forwarder.forwarded, "unanswered": self.forwarder.unanswered,
                                     "skipped": self.forwarder.skipped}
        publisher = self.summary_publisher
        if publisher is not None:
            stats = publisher.stats
            status["publisher"] = {"state": publisher.state.value, "sent": stats.sent, "parts": stats.parts,
                                   "failures": stats.failures, "last_build_ms": round(stats.last_build_ms, 3),
                                   "last_recomputed": stats.last_recomputed, "last_error": stats.last_error}
        return status

    def _install(self, app: web.Application) -> None:
        async def lifecycle(app: web.Application) -> AsyncIterator[None]:
            await self.start()
            yield
            await self.aclose()

        async def status(request: web.Request) -> web.Response:
            answer = await self.status()
            answer["peers"] = described_for(answer["peers"], request[CALLER])  # type: ignore[arg-type]
            return web.json_response(answer)

        app.cleanup_ctx.append(lifecycle)
        app.router.add_get(STATUS_PATH, status)


def _described(token: SelfToken) -> dict[str, object] | None:
    """The token this node shows its peers now: its id and end, what revoking it takes."""
    claims = token.claims
    return None if claims is None else {"sub": claims.sub, "jti": claims.jti, "exp": claims.exp,
                                        "minted": token.minted}
