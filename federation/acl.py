"""``AclRelay``: an ACL rule set or deleted in any region holds in every region.

Each region keeps its ACL rules in its own Redis (``node.trust.acl``); the relay, one of the
leader's duties, joins them over Kafka as the revocation relay joins the deny lists
(``federation.relay``): out, it announces every entry it holds when it starts (``full``) and then
the entries of this region's own origin as the log shows them — at once for a change through the
leader, within ``acl_poll_interval_ms`` for one through another node of the region, at most
:data:`~federation.relay.LOG_RESCAN_S` for one whose wake was missed; in, it applies each peer's
entry keeping its origin, the later entry of a rule winning, so a set and a delete crossing end the
same in every region and nothing is sent back. The leader applies a peer's rule at once, the
region's other nodes within their poll interval.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer, ConsumerRecord

from node.core import now_ms
from node.core.models import AclEntry
from node.store import Quarantine
from node.trust import AclFull, RegionAcl

from .config import FederationConfig
from .events import MAX_ACL_ENTRIES_PER_MESSAGE, FederationMessage, RegionAclRules
from .relay import LOG_RESCAN_S, LogRelay

__all__ = ["AclRelay"]

log = logging.getLogger(__name__)


class AclRelay(LogRelay):
    """Sends this region's ACL changes to its peers and applies theirs; ``run`` is a leader duty."""

    name = "acl"

    def __init__(self, config: FederationConfig, *, acl: RegionAcl, quarantine: Quarantine) -> None:
        super().__init__(config, topic=config.acl_topic(config.region),
                         peer_topics={peer.region: config.acl_topic(peer.region) for peer in config.peers},
                         quarantine=quarantine)
        self.acl = acl

    async def _send(self, producer: AIOKafkaProducer) -> None:
        position = await self.acl.log_position()  # before the list: a change in between is sent twice, harmlessly
        await self.acl.refresh(force=True)
        self.stats.announced += await self._publish(producer, self.acl.every_entry(), full=True)
        while True:
            await self.acl.wait_changed(LOG_RESCAN_S)
            position, entries = await self.acl.read_log(after=position)
            own = [entry for entry in entries if entry.origin == self.config.region]
            if own:
                self.stats.sent += await self._publish(producer, own, full=False)

    async def _publish(self, producer: AIOKafkaProducer, entries: Sequence[AclEntry], *, full: bool) -> int:
        await self._publish_parts(producer, entries, per_message=MAX_ACL_ENTRIES_PER_MESSAGE,
                                  message=lambda part: FederationMessage.of_acl(RegionAclRules(
                                      region=self.config.region, entries=part, full=full, sent_at_ms=now_ms())))
        if entries:
            log.info("region %s: sent %d ACL entr%s to the peers%s", self.config.region, len(entries),
                     "y" if len(entries) == 1 else "ies", " (every one held)" if full else "")
        return len(entries)

    async def _apply(self, peer: str, record: ConsumerRecord) -> None:
        message = self._message(peer, record)
        if message is None or message.acl is None:
            return
        for entry in message.acl.entries:
            self.stats.received += 1
            try:
                applied = await self.acl.apply(entry)
            except AclFull as exc:
                log.warning("region %s: ACL rule %s of region %s not applied: %s", self.config.region, entry.id,
                            entry.origin, exc)
                continue
            if applied:
                self.stats.applied += 1
                log.info("region %s: ACL rule %s %s in region %s holds here too", self.config.region, entry.id,
                         "set" if entry.rule is not None else "deleted", entry.origin)
