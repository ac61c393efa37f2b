"""Outcome reports: every attempt's outcome (and direct-call route event) sent to the node in batches."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..core import NodeError, RouteEvent
from ..core.models import OutcomeReport
from ._http import NodeApi

log = logging.getLogger("node.client")  # the SDK logs under one name, whichever module it is in


class Reporter:
    """Sends outcome reports (and direct-call route events) to the node in batches, in the background.

    A batch goes out when it holds ``batch_size`` items or ``flush_interval_s`` after its first
    item, whichever comes first. ``flush()`` puts a marker in the queue and waits until every
    item before it has been sent, so nothing is lost in a half-collected batch.
    """

    def __init__(self, api: NodeApi, *, batch_size: int, flush_interval_s: float, queue_limit: int,
                 flush_timeout_s: float) -> None:
        self.api = api
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.queue_limit = queue_limit
        self.flush_timeout_s = flush_timeout_s
        self.sent_reports = 0
        self.sent_batches = 0
        self.sent_events = 0
        self.dropped = 0  # reports and events shed (queue full) or refused by the node
        self._queue: asyncio.Queue[OutcomeReport | RouteEvent | asyncio.Event] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="reach-reporter")
        self._task.add_done_callback(self._done)

    def put(self, item: OutcomeReport | RouteEvent) -> None:
        if self._queue.qsize() >= self.queue_limit:
            self.dropped += 1  # reports are advice to the router: shed them, never block a call
            return
        self._queue.put_nowait(item)

    async def flush(self) -> None:
        """Wait until everything queued so far has been sent (or ``flush_timeout_s`` passed)."""
        if self._task is None or self._task.done():
            return
        sent = asyncio.Event()
        self._queue.put_nowait(sent)
        try:
            await asyncio.wait_for(sent.wait(), self.flush_timeout_s)
        except TimeoutError:
            log.warning("outcome reports not flushed within %.1fs", self.flush_timeout_s)

    async def aclose(self) -> None:
        """Send what is queued, then stop the background task."""
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("the outcome reporter died: %r; reports are no longer sent", task.exception())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            item = await self._queue.get()
            deadline = loop.time() + self.flush_interval_s
            batch: list[OutcomeReport | RouteEvent] = []
            marker: asyncio.Event | None = None
            while True:
                if isinstance(item, asyncio.Event):
                    marker = item
                    break
                batch.append(item)
                remaining = deadline - loop.time()
                if len(batch) >= self.batch_size or remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            if batch:
                await self._send(batch)
            if marker is not None:
                marker.set()

    async def _send(self, batch: list[OutcomeReport | RouteEvent]) -> None:
        # Only what is set, as every body the SDK sends (``_http.wire_json``): older nodes refuse new fields.
        reports = [item.model_dump(mode="json", exclude_unset=True, exclude_none=True)
                   for item in batch if isinstance(item, OutcomeReport)]
        events = [item.model_dump(mode="json", exclude_unset=True, exclude_none=True)
                  for item in batch if isinstance(item, RouteEvent)]
        requests = (("/v1/reports", "reports", reports), ("/v1/traces", "events", events))
        for path, key, items in requests:
            if not items:
                continue
            try:
                await self.api.request("POST", path, {key: items})
            except asyncio.CancelledError:
                raise
            except NodeError as exc:  # the other request still goes: each is counted for what it carried
                self.dropped += len(items)
                log.warning("could not send %d %s (POST %s): %s", len(items), key, path, exc.message)
                continue
            if key == "reports":
                self.sent_reports += len(items)
                self.sent_batches += 1
            else:
                self.sent_events += len(items)


__all__ = ["Reporter"]
