"""Callback mode's half of the proxy: the pool of background deliveries and the POST of a result.

``delivery=callback`` answers 202 at once and delivers in the background. The pool holds at most
``max_background`` such deliveries, and one tenant (its token's role and subject) at most its
share of them (``ProxySettings.background_share``, a tenth by default): a tenant whose endpoint is
slow fills its own share, never the pool. The result then goes to the sender's *registered*
``callback_endpoint`` through the egress policy, retried ``callback_attempts`` times.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

from ...config import ProxySettings
from ...core import Envelope, RateLimited, cancel_and_wait
from ...trust import EgressDenied, EgressPolicy, egress_denial

__all__ = ["CallbackAttempt", "CallbackPool", "post_callback"]

log = logging.getLogger(__name__)

CallbackAttempt = Callable[[int, int | None, float, str | None], None]
"""Told of each attempt: its index, the endpoint's status (None: no answer), latency in ms, the error."""


class CallbackPool:
    """The background deliveries of callback mode, within the pool and each tenant's share of it."""

    def __init__(self, settings: ProxySettings) -> None:
        self.settings = settings
        self._tasks: set[asyncio.Task[None]] = set()
        self._held: dict[str, int] = {}  # tenant -> its background deliveries in flight

    def spawn(self, coroutine: Coroutine[Any, Any, None], tenant: str) -> None:
        """Run ``coroutine`` in the background for ``tenant``; raises :class:`RateLimited` (and closes
        the coroutine) when the pool or the tenant's share is full."""
        held = self._held.get(tenant, 0)
        share = self.settings.background_share
        if len(self._tasks) >= self.settings.max_background or held >= share:
            coroutine.close()
            whose = (f"{tenant} holds {held} background deliveries, its share of the node's"
                     if held >= share else f"{len(self._tasks)} background deliveries in flight, the node's")
            raise RateLimited(f"{whose} {self.settings.max_background}; retry when some have answered",
                              code="background_full", details={"retry_after_ms": 1_000})
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        self._held[tenant] = held + 1
        task.add_done_callback(lambda done: self._done(done, tenant))

    def _done(self, task: asyncio.Task[None], tenant: str) -> None:
        self._tasks.discard(task)
        held = self._held.pop(tenant, 1) - 1
        if held > 0:
            self._held[tenant] = held
        if not task.cancelled() and task.exception() is not None:
            log.error("a background delivery failed: %r", task.exception(), exc_info=task.exception())

    async def aclose(self) -> None:
        """Cancel every background delivery and wait for them."""
        await cancel_and_wait(list(self._tasks))


async def post_callback(session: aiohttp.ClientSession, url: str, result: Envelope, original: Envelope, *,
                        settings: ProxySettings, egress: EgressPolicy, backoff_s: Callable[[int], float],
                        on_attempt: CallbackAttempt) -> bool:
    """POST ``result`` (the answer to ``original``) to ``url``; True once the endpoint took it.

    A refusal of the egress policy is not retried: the policy would say the same every time.
    """
    timeout = aiohttp.ClientTimeout(total=settings.read_timeout_ms / 1000,
                                    sock_connect=settings.connect_timeout_ms / 1000)
    headers = {"Content-Type": "application/json", "X-Reach-Trace-Id": result.trace_id,
               "X-Reach-Reply-To": original.id}
    for attempt in range(settings.callback_attempts):
        if attempt:
            await asyncio.sleep(backoff_s(attempt - 1))
        began = time.perf_counter()
        status: int | None = None
        denied: EgressDenied | None = None
        try:
            egress.check_url(url)
            # The body is not read: only the status matters, and an unread answer cannot
            # fill the node's memory (the connection is closed instead of reused).
            async with session.post(url, data=result.to_json(), headers=headers, timeout=timeout,
                                    allow_redirects=False) as response:
                status = response.status
            error = None if status < 300 else f"HTTP {status}"
        except asyncio.CancelledError:
            raise
        except EgressDenied as exc:
            denied, error = exc, f"egress_denied: {exc.message}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            denied = egress_denial(exc)
            error = f"egress_denied: {denied.message}" if denied else f"{type(exc).__name__}: {exc}"
        on_attempt(attempt, status, (time.perf_counter() - began) * 1000, error)
        if error is None:
            return True
        if denied is not None:
            break
    log.warning("could not deliver the result of %s to %s", original.id, url)
    return False
