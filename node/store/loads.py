"""Load stays home: agents' reported load, kept apart from their records and followed live.

A heartbeat with a new load, or a load report (``PUT /v1/agents/{id}/load``), stores the load in
the region's loads hash and publishes it on the region's load channel (one message per batch of
writes, ``"agent_id load-JSON"`` lines; ``node.store.scripts.UPDATE``). It bumps no version and
appends nothing to the change stream, so the federation publisher — which reads only the stream —
sends peers nothing for it: their replicas keep the load of the agent's last full-record change,
and they route to the region by its summary, not by per-agent load.

Every replica of the region follows the channel (:class:`LoadFeed`) and sets the live load on
the record it holds, which the router's tables pick up like any other change of the index. Pub/sub
loses what is published while a subscriber is disconnected, so every (re)subscription first reads
the whole hash again: after a reconnect a replica is as fresh as the hash. Load is soft state —
a load that is a few messages late only weighs an agent a little off for a second.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import ValidationError
from redis.exceptions import RedisError

from ..core import StoreUnavailable
from ..core.models import Load, compat

if TYPE_CHECKING:
    from .region import RegionStore

__all__ = ["LoadFeed", "parse_load"]

log = logging.getLogger(__name__)

_PARSED_MAX = 10_000  # distinct load strings remembered (loads repeat: idle agents report the same)
_parsed: dict[str, Load] = {}
RETRY_MS = (100, 2_000)  # the feed's reconnect backoff: first and longest wait


def parse_load(raw: str) -> Load | None:
    """A stored or published load, or None when it does not parse (the record's own load stands)."""
    load = _parsed.get(raw)
    if load is None:
        try:
            load = compat.read_json(Load, raw)
        except ValidationError:
            return None
        if len(_parsed) >= _PARSED_MAX:
            _parsed.clear()
        _parsed[raw] = load
    return load


def parse_message(data: str) -> list[tuple[str, Load]]:
    """The ``(agent_id, load)`` pairs of one load-channel message (lines that do not parse skipped)."""
    pairs = []
    for line in data.split("\n"):
        agent_id, _, raw = line.partition(" ")
        load = parse_load(raw) if agent_id else None
        if load is not None:
            pairs.append((agent_id, load))
    return pairs


class LoadFeed:
    """Follows a region's load channel and hands every load to ``apply(agent_id, load)``.

    ``run()`` is the task: subscribe, read every stored load, then apply messages as they come;
    on a lost connection wait (100 ms doubling to 2 s) and start over. ``apply`` is called in the
    event loop and must be quick.
    """

    def __init__(self, store: RegionStore, apply: Callable[[str, Load], object]) -> None:
        self.store = store
        self.apply = apply
        self.subscribed = False
        self.messages = 0
        self.resyncs = 0

    async def run(self) -> None:
        wait_ms = RETRY_MS[0]
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except (RedisError, StoreUnavailable, OSError) as exc:
                if self.subscribed:
                    wait_ms = RETRY_MS[0]
                    log.warning("region %s: load feed lost (%s); reading the loads again", self.store.region, exc)
            self.subscribed = False
            await asyncio.sleep(wait_ms / 1000)
            wait_ms = min(RETRY_MS[1], wait_ms * 2)

    async def _follow(self) -> None:
        async with self.store.redis.pubsub() as pubsub:
            await pubsub.subscribe(self.store.load_channel)
            async for message in pubsub.listen():
                kind = message.get("type")
                if kind == "subscribe":
                    # (Re)subscribed — redis-py re-subscribes by itself after a reconnect, losing
                    # what was published meanwhile — so read every stored load again. What is
                    # published while the hash is read waits on the connection.
                    for agent_id, load in (await self.store.all_loads()).items():
                        self.apply(agent_id, load)
                    self.subscribed = True
                    self.resyncs += 1
                elif kind == "message":
                    self.messages += 1
                    for agent_id, load in parse_message(message["data"]):
                        self.apply(agent_id, load)
