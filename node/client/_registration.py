"""Registering with backoff: which node errors the SDK retries, and the retry loop of registration."""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable

from ..core import Conflict, NodeError, RateLimited, StoreUnavailable
from ..core.models import RegisterResponse
from ..delivery import RetryPolicy, Sleep
from ._errors import NodeUnreachable

log = logging.getLogger("node.client")  # the SDK logs under one name, whichever module it is in


def retryable_node_error(exc: NodeError) -> bool:
    """Transient: the node could not answer now (not: the request is wrong)."""
    return isinstance(exc, (NodeUnreachable, StoreUnavailable, RateLimited, Conflict)) or exc.status >= 500


async def register_with_backoff(register: Callable[[], Awaitable[RegisterResponse]], *, agent_id: str,
                                policy: RetryPolicy, rng: random.Random, sleep: Sleep, clock: Callable[[], float],
                                max_wait_s: float | None, stopping: Callable[[], bool] = lambda: False
                                ) -> RegisterResponse:
    """``register()`` (one request to the node), retrying transient failures with backoff.

    Raises the node's error at once for a rejection, and the last transient error once
    ``max_wait_s`` has passed (``0``: one try only).
    """
    started = clock()
    attempt = 0
    while True:
        try:
            return await register()
        except NodeError as exc:
            if not retryable_node_error(exc) or stopping():
                raise
            delay = policy.backoff_s(attempt, rng)
            if max_wait_s is not None and clock() - started + delay > max_wait_s:
                raise
            log.warning("registering %s: %s; retrying in %.2fs", agent_id, exc.message, delay)
            attempt += 1
            await sleep(delay)


__all__ = ["register_with_backoff", "retryable_node_error"]
