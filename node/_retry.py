"""Trying again: registration with backoff, the client-side breaker, and each call's failover order.

Only transient node errors are retried (:func:`retryable_node_error`); a call moves to another
agent, never back to one it tried, and skips agents whose breaker in this client is open.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ._client_errors import NodeUnreachable
from ._client_http import NodeApi
from .agentconfig import RetryPolicy
from .errors import Conflict, NoAgentAvailable, NodeError, RateLimited, StoreUnavailable
from .models import (
    Outcome,
    RegisterResponse,
    Registration,
    RouteRequest,
    RouteTarget,
    RouteTicket,
)
from .outcomes import BreakerState, OutcomeTracker

log = logging.getLogger("node.client")  # the SDK logs under one name, whichever module it is in

MAX_RESOLVES_PER_PICK = 3
MAX_EXCLUDE = 64  # RouteRequest.exclude's limit
Sleep = Callable[[float], Awaitable[None]]
Resolve = Callable[..., Awaitable[RouteTicket]]


def retryable_node_error(exc: NodeError) -> bool:
    """Transient: the node could not answer now (not: the request is wrong)."""
    return isinstance(exc, (NodeUnreachable, StoreUnavailable, RateLimited, Conflict)) or exc.status >= 500


async def register_with_backoff(api: NodeApi, registration: Registration, policy: RetryPolicy, *,
                                rng: random.Random, sleep: Sleep, clock: Callable[[], float],
                                max_wait_s: float | None, stopping: Callable[[], bool] = lambda: False
                                ) -> RegisterResponse:
    """Register, retrying transient failures with backoff until the node answers.

    Raises the node's error at once for a rejection, and the last transient error once
    ``max_wait_s`` has passed.
    """
    started = clock()
    attempt = 0
    while True:
        try:
            return await api.register(registration)
        except NodeError as exc:
            if not retryable_node_error(exc) or stopping():
                raise
            delay = policy.backoff_s(attempt, rng)
            if max_wait_s is not None and clock() - started + delay > max_wait_s:
                raise
            log.warning("registering %s: %s; retrying in %.2fs", registration.agent_id, exc.message, delay)
            attempt += 1
            await sleep(delay)


class ClientBreakers:
    """This client's breaker per target (an :class:`OutcomeTracker` fed by its own calls' outcomes)."""

    def __init__(self, tracker: OutcomeTracker, *, now_ms: Callable[[], int]) -> None:
        self.tracker = tracker
        self._now_ms = now_ms
        self._seen: set[str] = set()  # every target an outcome was recorded for

    def admits(self, agent_id: str) -> bool:
        return self.tracker.admits(agent_id, now_ms=self._now_ms())

    def issued(self, agent_id: str) -> None:
        self.tracker.issued(agent_id, now_ms=self._now_ms())

    def record(self, agent_id: str, outcome: Outcome) -> None:
        self._seen.add(agent_id)
        self.tracker.record(agent_id, outcome, now_ms=self._now_ms())

    def state(self, agent_id: str) -> BreakerState:
        return self.tracker.state(agent_id, now_ms=self._now_ms())

    def open_agents(self) -> list[str]:
        """The targets seen so far whose breaker does not admit a call now."""
        now = self._now_ms()
        return [agent_id for agent_id in self._seen if not self.tracker.admits(agent_id, now_ms=now)]


@dataclass(slots=True)
class Pick:
    """One attempt's target and the ticket it came from (whose signature the outcome report carries)."""

    ticket: RouteTicket
    target: RouteTarget


class Failover:
    """The targets of one call, in order: the ticket's target, its alternates, then fresh decisions.

    Never an agent or an address already tried in this call, nor an agent whose breaker is open.
    ``resolve(request, fresh=...)`` asks for a ticket (the client's cache for the first).
    """

    def __init__(self, request: RouteRequest, *, resolve: Resolve, breakers: ClientBreakers) -> None:
        self.request = request
        self.tried: list[str] = []
        self.tried_endpoints: set[str] = set()
        self._resolve = resolve
        self._breakers = breakers
        self._queue: list[Pick] = []
        self._started = False

    async def next(self) -> Pick | None:
        """The next target to try, or ``None`` when no agent is left."""
        if not self._started:
            self._started = True
            ticket = await self._resolve(self.request)
            self._queue.extend(Pick(ticket, target) for target in (ticket.target, *ticket.alternates))
        for _ in range(MAX_RESOLVES_PER_PICK + 1):
            while self._queue:
                pick = self._queue.pop(0)
                if self._untried(pick.target) and self._breakers.admits(pick.target.agent_id):
                    self._breakers.issued(pick.target.agent_id)
                    self.tried.append(pick.target.agent_id)
                    self.tried_endpoints.add(pick.target.endpoint)
                    return pick
            exclude = [*self.tried, *sorted(set(self._breakers.open_agents()) - set(self.tried))][:MAX_EXCLUDE]
            try:
                ticket = await self._resolve(self.request.model_copy(update={"exclude": exclude}), fresh=True)
            except NoAgentAvailable:
                return None
            fresh = [Pick(ticket, target) for target in (ticket.target, *ticket.alternates) if self._untried(target)]
            if not fresh:
                return None
            self._queue.extend(fresh)
        return None

    def _untried(self, target: RouteTarget) -> bool:
        return target.agent_id not in self.tried and target.endpoint not in self.tried_endpoints


__all__ = ["MAX_EXCLUDE", "MAX_RESOLVES_PER_PICK", "ClientBreakers", "Failover", "Pick", "Sleep",
           "register_with_backoff", "retryable_node_error"]
