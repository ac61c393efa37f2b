"""``RevocationRelay``: a token revoked in any region is refused in every region.

Bearer tokens are valid in every region of a cluster (one secret), while each region keeps its
deny list in its own Redis (``node.trust.revocation``). The relay, one of the leader's duties,
joins the lists over Kafka:

* **out**: it follows the region's revocation log and sends the entries whose origin is this
  region to ``{prefix}.revocations.{region}`` as they are made. The deny list wakes it
  (:meth:`RevocationList.wait_changed`): at once for a revocation through the leader itself,
  within the list's poll interval for one through another node of the region; the log is read
  every :data:`LOG_RESCAN_S` whatever happens, so a missed wake costs at most that. Every time the
  relay starts it first sends the whole list, marked ``full``: a peer that missed records — a new
  region, a broker that forgot them, retention — catches up.
* **in**: it reads every peer's revocation topic from its start and applies each token with that
  peer as its origin. The log marks it so, which is why it is never sent back; a token the list
  holds until as late already costs no round trip, so the full lists peers repeat are cheap.

The leader applies a peer's revocation at once; the region's other nodes read it from Redis
within their ``revocation_poll_interval_ms``. While Kafka cannot be reached, revocations keep
working in the region they were made in and travel once it is back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from aiokafka import AIOKafkaProducer, ConsumerRecord

from node.core import now_ms
from node.store import Quarantine
from node.trust import RevocationList

from .config import FederationConfig
from .events import MAX_REVOCATIONS_PER_MESSAGE, FederationMessage, RegionRevocations, RevokedToken
from .relay import LOG_RESCAN_S, LogRelay, RelayState, RelayStats

__all__ = ["LOG_RESCAN_S", "RelayState", "RelayStats", "RevocationRelay"]

log = logging.getLogger(__name__)


class RevocationRelay(LogRelay):
    """Sends this region's revocations to its peers and applies theirs; ``run`` is a leader duty."""

    name = "revocations"

    def __init__(self, config: FederationConfig, *, revocations: RevocationList, quarantine: Quarantine) -> None:
        super().__init__(config, topic=config.revocation_topic(config.region),
                         peer_topics={peer.region: config.revocation_topic(peer.region) for peer in config.peers},
                         quarantine=quarantine)
        self.revocations = revocations

    # -- out ---------------------------------------------------------------------------------

    async def _send(self, producer: AIOKafkaProducer) -> None:
        # The log position is read before the list: a revocation in between is in both, and a
        # peer applies a token twice at no cost.
        position = await self.revocations.log_position()
        everything = await self.revocations.entries()
        self.stats.announced += await self._publish(
            producer, (RevokedToken(jti=jti, until_ms=until) for jti, until in everything.items()), full=True)
        while True:
            await self.revocations.wait_changed(LOG_RESCAN_S)
            entries = await self.revocations.read_log(after=position)
            if not entries:
                continue
            own = [RevokedToken(jti=entry.jti, until_ms=entry.until_ms) for entry in entries
                   if entry.origin == self.config.region]
            if own:
                self.stats.sent += await self._publish(producer, own, full=False)
            position = entries[-1].position

    async def _publish(self, producer: AIOKafkaProducer, tokens: Iterable[RevokedToken], *, full: bool) -> int:
        """Send ``tokens`` (in messages of at most 5,000) and wait for Kafka's acknowledgement."""
        batch = list(tokens)
        if not batch and not full:
            return 0
        await self._publish_parts(producer, batch, per_message=MAX_REVOCATIONS_PER_MESSAGE,
                                  message=lambda part: FederationMessage.of_revocations(RegionRevocations(
                                      region=self.config.region, tokens=part, full=full, sent_at_ms=now_ms())))
        if batch:
            log.info("region %s: sent %d revocation(s) to the peers%s", self.config.region, len(batch),
                     " (the whole list)" if full else "")
        return len(batch)

    # -- in ----------------------------------------------------------------------------------

    async def _apply(self, peer: str, record: ConsumerRecord) -> None:
        message = self._message(peer, record)
        if message is None or message.revocations is None:
            return
        for token in message.revocations.tokens:
            self.stats.received += 1
            done = await self.revocations.apply(token.jti, until_ms=token.until_ms, origin=peer)
            if done.changed:
                self.stats.applied += 1
                log.info("region %s: token %s revoked in region %s is refused here too", self.config.region,
                         token.jti, peer)
