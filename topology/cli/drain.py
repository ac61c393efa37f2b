"""Draining a node's HTTP server: readiness 503, then no new connections, then in-flight requests.

aiohttp's own shutdown stops reading from every connection at once, so a request still sending
its body when it starts can never finish. :class:`Drain` instead counts the requests inside
the app's handlers (a middleware, installed through the node's ``extensions`` before the app is
built) and waits for that count to reach zero with the listener closed but every open
connection still read; only then is aiohttp's shutdown run, which finds nothing left to wait for::

    drain = Drain()
    node.extensions.append(drain.install)
    runner = await serve(node)
    ...
    await drain.run(node, runner, grace_ms=500, timeout_ms=10_000)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from node.service import RegistryNode

__all__ = ["Drain"]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# What requests still running after the drain timeout get to unwind once cancelled.
_CANCEL_GRACE_S = 0.5


class Drain:
    """In-flight request accounting and the drain sequence of one node's HTTP server."""

    def __init__(self) -> None:
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False

    @property
    def in_flight(self) -> int:
        """Requests inside a handler right now."""
        return self._in_flight

    def install(self, app: web.Application) -> None:
        """Add the counting middleware (innermost: it sees requests that reached a handler)."""

        @web.middleware  # marks it new-style; aiohttp would call an unmarked one as a factory
        async def count_in_flight(request: web.Request, handler: Handler) -> web.StreamResponse:
            return await self._counted(request, handler)

        app.middlewares.append(count_in_flight)

    async def _counted(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self._in_flight += 1
        self._idle.clear()
        try:
            response = await handler(request)
            if self._closing:
                # No more requests on this connection: its client reconnects, to a node still up.
                response.force_close()
            return response
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def run(self, node: RegistryNode, runner: web.AppRunner, *, grace_ms: int, timeout_ms: int,
                  hurry: asyncio.Event | None = None) -> None:
        """Readiness 503 for ``grace_ms`` (cut short by ``hurry``), close the listener, give
        in-flight requests ``timeout_ms``, cancel what is left, then clean the runner up."""
        node.begin_drain()
        self._closing = True
        log.info("region %s: draining (readiness 503; the listener closes in %d ms, in-flight requests then get "
                 "%d ms)", node.region, grace_ms, timeout_ms)
        if grace_ms > 0 and (hurry is None or not hurry.is_set()):
            waiting = [asyncio.ensure_future(asyncio.sleep(grace_ms / 1000))]
            if hurry is not None:
                waiting.append(asyncio.ensure_future(hurry.wait()))
            try:
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for future in waiting:
                    future.cancel()
        for site in list(runner.sites):
            await site.stop()
        # Event streams never end by themselves: end them, or they would hold the drain open.
        node.watch.end_all("draining")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout=timeout_ms / 1000)
        if self._in_flight:
            log.warning("region %s: %d requests still running after the %d ms drain timeout; cancelling them",
                        node.region, self._in_flight, timeout_ms)
        server = runner.server
        if server is not None:
            server.pre_shutdown()  # idle keep-alive connections: nothing else would wake them
            await server.shutdown(_CANCEL_GRACE_S)
        await runner.cleanup()
        log.info("region %s: drained", node.region)
