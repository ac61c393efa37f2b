"""Loop protection the node owns: a trace's hop count as the node delivered it, not as an agent says.

``hop_count`` is the envelope's, written by whoever sends it: an agent that answers a request by
sending a fresh envelope (``hop_count`` 0) through ``POST /v1/send`` undid the count, and two
such agents ping-ponged one trace without end. The node now keeps the count itself, twice over:

* **A stamp it signs.** Every proxied delivery carries ``X-Reach-Hop``: the trace, the hop count
  delivered and the agent it went to, sealed with the cluster secret (:meth:`Signer.sign_hop`,
  a key of its own). The SDK's :class:`~node.client.AgentHost` keeps the stamp while its handler
  runs and :class:`~node.client.ReachClient` sends it back with that handler's sends, by
  itself; the node takes the stamp's count as the least the send may carry, whatever trace id
  the new envelope names. A forged or mangled stamp is refused (422 ``invalid_hop_stamp``).
* **A ledger per trace** for agents that pass nothing on: the count each agent was delivered
  within the trace, in the region's Redis beside the trace log::

      {prefix}:{region}:trace:{trace_id}/hops   HASH  agent_id -> the highest hop delivered to it (TTL)

  A send of that trace by that agent carries at least that count.

So an agent's ``hop_count`` can raise the count, never lower it: the send goes out with the
highest of the three, and at ``max_hops`` it is refused (422 ``hop_limit_exceeded``).
"""

from __future__ import annotations

from redis import asyncio as aioredis

from ...core import HOP_HEADER, Envelope, ValidationFailed
from ...store import RedisErrors
from ...trust import Signer

__all__ = ["HOP_HEADER", "HopLedger", "InvalidHopStamp"]

# KEYS: the trace's hop ledger; ARGV: ttl_ms, the hop delivered, the agents it may go to (the ticket's
# target and alternates). Raises each agent's entry to the hop, never lowers it.
RAISE = """
local hop = tonumber(ARGV[2])
for i = 3, #ARGV do
  local held = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '-1')
  if held < hop then redis.call('HSET', KEYS[1], ARGV[i], hop) end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 0
"""


class InvalidHopStamp(ValidationFailed):
    """``X-Reach-Hop`` is not a stamp this cluster signed."""

    code = "invalid_hop_stamp"


class HopLedger:
    """Hop stamps and the per-trace ledger, on the trace log's Redis connection and key prefix."""

    def __init__(self, redis: aioredis.Redis, *, signer: Signer, prefix: str, region: str, ttl_ms: int) -> None:
        self.redis = redis
        self.signer = signer
        self.prefix = prefix
        self.region = region
        self.ttl_ms = ttl_ms
        self._raise = redis.register_script(RAISE)

    def key(self, trace_id: str) -> str:
        return f"{self.prefix}{trace_id}/hops"

    def stamp(self, trace_id: str, hop: int, agent_id: str) -> str:
        """The ``X-Reach-Hop`` value of a delivery of ``trace_id`` at ``hop`` to ``agent_id``."""
        return self.signer.sign_hop({"trc": trace_id, "hop": hop, "to": agent_id})

    def stamped(self, header: str | None) -> int:
        """The hop count an ``X-Reach-Hop`` value carries (0 without one); raises :class:`InvalidHopStamp`."""
        if header is None:
            return 0
        claims = self.signer.verify_hop(header.strip())
        hop = claims.get("hop") if claims is not None else None
        if not isinstance(hop, int) or isinstance(hop, bool) or hop < 0:
            raise InvalidHopStamp(f"{HOP_HEADER} is not a hop stamp this cluster signed: send back the value a "
                                  "delivery brought, unchanged, or none", field=HOP_HEADER)
        return hop

    async def counted(self, envelope: Envelope, sender: str, header: str | None) -> Envelope:
        """``envelope`` with its hop count raised to what the node delivered to ``sender``: the stamp
        it sent back, and what the trace's ledger holds for it. Raises :class:`InvalidHopStamp` and
        :class:`~node.core.StoreUnavailable`."""
        stamped = self.stamped(header)
        async with RedisErrors(self.region):
            held = await self.redis.hget(self.key(envelope.trace_id), sender)
        floor = max(stamped, int(held) if held is not None else 0)
        if floor <= envelope.hop_count:
            return envelope
        return envelope.model_copy(update={"hop_count": floor})

    async def delivering(self, trace_id: str, hop: int, agent_ids: list[str]) -> None:
        """``trace_id`` is about to reach one of ``agent_ids`` at ``hop``: each of their sends of it
        carries at least that from now on. Raises :class:`~node.core.StoreUnavailable`."""
        async with RedisErrors(self.region):
            await self._raise(keys=[self.key(trace_id)], args=[self.ttl_ms, hop, *agent_ids])
