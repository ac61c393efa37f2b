"""The SDK's route-ticket cache: ``resolve()`` answers from it until a ticket is about to expire.

While something tells the client at once when a target goes (``pushed()``: the session is open and
carries ``gone``), a ticket may be kept longer (``pushed_reuse_s``); a push evicts the tickets that
name the agent, and a lost push channel drops the tickets kept for longer than ``reuse_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from ..core.models import RouteRequest, RouteTicket
from ._session import NodeSession

TICKET_CACHE_SIZE = 1_024
TICKET_EXPIRY_MARGIN = 0.9  # a ticket is reused for at most this share of its lifetime, so it never expires in flight


class TicketCache:
    """Tickets by route request (all of it but ``exclude`` and ``trace_id``), each for ``reuse_s`` or
    until just before its expiry, whichever comes first.

    ``clock`` is monotonic seconds. When full, expired tickets go first, else the oldest one.
    """

    def __init__(self, *, clock: Callable[[], float], reuse_ms: int, size: int = TICKET_CACHE_SIZE,
                 pushed_reuse_ms: int | None = None, pushed: Callable[[], bool] = lambda: False) -> None:
        """``reuse_ms``/``pushed_reuse_ms``: the settings' ``ticket_reuse_ms`` and
        ``session_ticket_reuse_ms`` (None: the same as ``reuse_ms``)."""
        self.clock = clock
        self.reuse_s = reuse_ms / 1000
        self.pushed_reuse_s = self.reuse_s if pushed_reuse_ms is None else pushed_reuse_ms / 1000
        self.pushed = pushed
        self.size = size
        self._tickets: dict[str, tuple[RouteTicket, float]] = {}
        self._watch: Callable[[list[str]], None] | None = None

    def follow(self, session: NodeSession, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
        """Hear ``session``'s pushes (on its thread) in this cache's ``loop``: ``gone`` evicts, a lost
        connection ends the longer reuse; each ticket's targets are watched. Returns what stops it."""

        def soon(callback: Callable[..., Any], *args: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the client's loop ended: nothing left to evict
                loop.call_soon_threadsafe(callback, *args)

        self.pushed = lambda: session.pushing
        self._watch = session.watch
        forget = [session.on_gone(lambda agent_ids: soon(self.evict, *agent_ids)),
                  session.on_lost(lambda: soon(self.unpushed))]

        def stop() -> None:
            for undo in forget:
                undo()
            self.pushed, self._watch = (lambda: False), None

        return stop

    def get(self, request: RouteRequest) -> RouteTicket | None:
        cached = self._tickets.get(_key(request))
        if cached is not None and cached[1] > self.clock():
            return cached[0]
        return None

    def put(self, request: RouteRequest, ticket: RouteTicket) -> None:
        reuse_s = self.pushed_reuse_s if self.pushed() else self.reuse_s
        lifetime_s = min(reuse_s, max(0, ticket.expires_at_ms - ticket.issued_at_ms) / 1000 * TICKET_EXPIRY_MARGIN)
        if lifetime_s <= 0:
            return
        if len(self._tickets) >= self.size:
            now = self.clock()
            for stale in [k for k, (_, until) in self._tickets.items() if until <= now] or [next(iter(self._tickets))]:
                self._tickets.pop(stale, None)
        self._tickets[_key(request)] = (ticket, self.clock() + lifetime_s)
        if self._watch is not None:
            self._watch([ticket.target.agent_id, *(alternate.agent_id for alternate in ticket.alternates)])

    def drop(self, request: RouteRequest) -> None:
        """Forget the ticket of ``request`` (the node just said nobody serves it)."""
        self._tickets.pop(_key(request), None)

    def evict(self, *agent_ids: str) -> None:
        """Forget the tickets that name any of ``agent_ids`` (it just failed, or is gone), so the next
        call asks again: calls are drawn among a ticket's target and alternates, so any may be called."""
        gone = set(agent_ids)
        for key in [k for k, (ticket, _) in self._tickets.items()
                    if ticket.target.agent_id in gone or any(a.agent_id in gone for a in ticket.alternates)]:
            del self._tickets[key]

    def unpushed(self) -> None:
        """The push channel went: drop the tickets kept past ``reuse_s`` on its word."""
        if self.pushed_reuse_s <= self.reuse_s:
            return
        now = self.clock()
        for key in [k for k, (_, until) in self._tickets.items() if until - now > self.reuse_s]:
            del self._tickets[key]


def _key(request: RouteRequest) -> str:
    return request.model_dump_json(exclude={"exclude", "trace_id"})


__all__ = ["TICKET_CACHE_SIZE", "TICKET_EXPIRY_MARGIN", "TicketCache"]
