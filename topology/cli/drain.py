"""Draining a node's HTTP server: readiness 503, then no new connections, then in-flight requests.

aiohttp's own shutdown stops reading from every connection at once, so a request still sending
its body when it starts can never finish. :class:`Drain` instead waits for the count of requests
inside the app (kept by the API's middleware, :class:`node.http.InFlight`; the drain finds it
through the node's ``extensions`` when the app is built) to reach zero with the listener closed
but every open connection still read; only then is aiohttp's shutdown run, which finds nothing
left to wait for::

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

from aiohttp import web

from node.http import IN_FLIGHT_KEY, InFlight
from node.service import RegistryNode

__all__ = ["Drain"]

log = logging.getLogger(__name__)

# What requests still running after the drain timeout get to unwind once cancelled.
_CANCEL_GRACE_S = 0.5


class Drain:
    """In-flight request accounting and the drain sequence of one node's HTTP server."""

    def __init__(self) -> None:
        self._counted = InFlight()  # the app's own, once installed

    @property
    def in_flight(self) -> int:
        """Requests inside the app right now."""
        return self._counted.count

    def install(self, app: web.Application) -> None:
        """Follow the app's count of requests in flight."""
        self._counted = app[IN_FLIGHT_KEY]

    async def run(self, node: RegistryNode, runner: web.AppRunner, *, grace_ms: int, timeout_ms: int,
                  hurry: asyncio.Event | None = None) -> None:
        """Readiness 503 for ``grace_ms`` (cut short by ``hurry``), close the listener, give
        in-flight requests ``timeout_ms``, cancel what is left, then clean the runner up."""
        node.begin_drain()
        self._counted.closing = True
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
            await asyncio.wait_for(self._counted.idle.wait(), timeout=timeout_ms / 1000)
        if self._counted.count:
            log.warning("region %s: %d requests still running after the %d ms drain timeout; cancelling them",
                        node.region, self._counted.count, timeout_ms)
        server = runner.server
        if server is not None:
            server.pre_shutdown()  # idle keep-alive connections: nothing else would wake them
            await server.shutdown(_CANCEL_GRACE_S)
        await runner.cleanup()
        log.info("region %s: drained", node.region)
