"""Fan-out of change events to ``/v1/watch`` subscribers (server-sent events).

Each subscriber has a bounded queue; one that cannot keep up is cut off with an ``overflow``
marker rather than slowing the node or growing memory without bound: the client reconnects
with ``since=<last version>`` and replays from the region's change stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..core import RateLimited
from ..core.models import ChangeEvent

DEFAULT_SUBSCRIBER_QUEUE = 1_000
DEFAULT_STREAMS_PER_CALLER = 16
DEFAULT_WRITE_TIMEOUT_MS = 30_000


class Subscription:
    """One watcher's queue; ``None`` in the queue ends it, ``end_reason`` says why."""

    def __init__(self, hub: WatchHub, accept: Callable[[ChangeEvent], bool], maxsize: int, owner: str) -> None:
        self.hub = hub
        self.accept = accept
        self.owner = owner
        self.queue: asyncio.Queue[ChangeEvent | None] = asyncio.Queue(maxsize=maxsize)
        self.end_reason: str | None = None

    def offer(self, event: ChangeEvent) -> None:
        if self.end_reason is not None or not self.accept(event):
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.end("overflow")

    def end(self, reason: str) -> None:
        """Stop this subscription; the reader sees ``None`` next (older events are dropped)."""
        if self.end_reason is not None:
            return
        self.end_reason = reason
        while True:
            try:
                self.queue.put_nowait(None)
                return
            except asyncio.QueueFull:
                self.queue.get_nowait()

    def close(self) -> None:
        self.hub.subscribers.discard(self)


class WatchHub:
    """Publishes every change (local and, when federation is attached, remote) to watchers.

    Every change is offered to every watcher, so one tenant (a token's role and subject) may hold at most
    ``streams_per_caller`` streams at once: more would multiply the node's work per change. A
    stream whose watcher does not take a write within ``write_timeout_ms`` is cut (see
    ``node.http.watch_stream``).
    """

    def __init__(self, *, subscriber_queue: int = DEFAULT_SUBSCRIBER_QUEUE,
                 streams_per_caller: int = DEFAULT_STREAMS_PER_CALLER,
                 write_timeout_ms: int = DEFAULT_WRITE_TIMEOUT_MS) -> None:
        self.subscribers: set[Subscription] = set()
        self.subscriber_queue = subscriber_queue
        self.streams_per_caller = streams_per_caller
        self.write_timeout_ms = write_timeout_ms
        self.cut = 0  # streams cut because their watcher stopped reading (observability and tests)

    def publish(self, event: ChangeEvent) -> None:
        for subscription in list(self.subscribers):
            subscription.offer(event)

    def end_all(self, reason: str = "closing") -> None:
        """End every subscription (the node is shutting down)."""
        for subscription in list(self.subscribers):
            subscription.end(reason)

    def subscribe(self, accept: Callable[[ChangeEvent], bool], *, owner: str) -> Subscription:
        """A new watcher of ``owner``'s; raises :class:`RateLimited` (429) when it holds its share."""
        held = sum(1 for subscription in self.subscribers if subscription.owner == owner)  # a new stream only
        if held >= self.streams_per_caller:
            raise RateLimited(f"{owner} holds {held} watch streams, the most one token may; close one "
                              "(or raise watch_streams_per_caller)", code="too_many_watches")
        subscription = Subscription(self, accept, self.subscriber_queue, owner)
        self.subscribers.add(subscription)
        return subscription
