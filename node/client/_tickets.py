"""The SDK's route-ticket cache: ``resolve()`` answers from it until a ticket is about to expire."""

from __future__ import annotations

from collections.abc import Callable

from ..core.models import RouteRequest, RouteTicket

TICKET_CACHE_SIZE = 1_024
TICKET_EXPIRY_MARGIN = 0.9  # a ticket is reused for at most this share of its lifetime, so it never expires in flight


class TicketCache:
    """Tickets by route request (all of it but ``exclude`` and ``trace_id``), each for ``reuse_s`` or
    until just before its expiry, whichever comes first.

    ``clock`` is monotonic seconds. When full, expired tickets go first, else the oldest one.
    """

    def __init__(self, *, clock: Callable[[], float], reuse_s: float, size: int = TICKET_CACHE_SIZE) -> None:
        self.clock = clock
        self.reuse_s = reuse_s
        self.size = size
        self._tickets: dict[str, tuple[RouteTicket, float]] = {}

    def get(self, request: RouteRequest) -> RouteTicket | None:
        cached = self._tickets.get(_key(request))
        if cached is not None and cached[1] > self.clock():
            return cached[0]
        return None

    def put(self, request: RouteRequest, ticket: RouteTicket) -> None:
        lifetime_s = min(self.reuse_s, max(0, ticket.expires_at_ms - ticket.issued_at_ms) / 1000 * TICKET_EXPIRY_MARGIN)
        if lifetime_s <= 0:
            return
        if len(self._tickets) >= self.size:
            now = self.clock()
            for stale in [k for k, (_, until) in self._tickets.items() if until <= now] or [next(iter(self._tickets))]:
                self._tickets.pop(stale, None)
        self._tickets[_key(request)] = (ticket, self.clock() + lifetime_s)

    def drop(self, request: RouteRequest) -> None:
        """Forget the ticket of ``request`` (the node just said nobody serves it)."""
        self._tickets.pop(_key(request), None)

    def evict(self, agent_id: str) -> None:
        """Forget the tickets that name ``agent_id`` (it just failed), so the next call asks again:
        calls are drawn among a ticket's target and alternates, so any of them may have been called."""
        for key in [k for k, (ticket, _) in self._tickets.items()
                    if ticket.target.agent_id == agent_id or any(a.agent_id == agent_id for a in ticket.alternates)]:
            del self._tickets[key]


def _key(request: RouteRequest) -> str:
    return request.model_dump_json(exclude={"exclude", "trace_id"})


__all__ = ["TICKET_CACHE_SIZE", "TICKET_EXPIRY_MARGIN", "TicketCache"]
