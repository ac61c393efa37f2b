"""Heartbeats: renew an agent's lease every interval, on a thread of its own (or as a task).

With the process's session (``_session``: one WebSocket per process and node) the renewals and
load reports travel over it as small frames; over HTTP (``PUT …/heartbeat``, ``PUT …/load``) only
while it cannot carry them (not open yet, lost, a node without sessions).

On a thread, with its own event loop and HTTP session, they survive an agent handler that blocks
the caller's loop; the ``load`` callback then runs on that thread, so it must be thread-safe.
``unknown_agent`` (the lease lapsed) re-registers from the same thread. With ``load_interval_s``
the loop also reports load between heartbeats (``PUT …/load``, only when it changed): load that
is fresh every second costs no lease write and no event for other regions.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from ..core import NodeError, UnknownAgent
from ..core.models import Heartbeat, Load, RegisterResponse, Status
from ..delivery import RetryPolicy
from ._http import NodeApi
from ._registration import retryable_node_error
from ._session import NodeSession, SessionDown

log = logging.getLogger("node.client")  # the SDK logs under one name, whichever module it is in

HEARTBEAT_STOP_TIMEOUT_S = 10.0
LoadCallback = Callable[[], "Load | Mapping[str, Any] | None"]
# Registers the agent again through ``api`` (the heartbeat thread's own), with ``status`` if set.
Reregister = Callable[[NodeApi, "Status | None"], Awaitable[RegisterResponse]]


class HeartbeatState(enum.Enum):
    """Where the heartbeat loop is; FAILED means it died (see ``Heartbeater.error``)."""

    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(slots=True)
class HeartbeatStats:
    """What the heartbeat loop did; read from any thread."""

    sent: int = 0  # every renewal, over the session or HTTP
    over_session: int = 0  # of them, the renewals the session carried
    failed: int = 0
    reregistered: int = 0
    load_reports: int = 0
    session_load_reports: int = 0
    last_sent_at: float | None = None
    last_error: str | None = None
    thread_name: str | None = None


class Heartbeater:
    """Renews the lease every ``interval_s``, on a thread of its own or as a task.

    The stop and wake signals may come from any thread (``call_soon_threadsafe``).
    """

    def __init__(self, *, base_url: str, token: str, agent_id: str, reregister: Reregister, interval_s: float,
                 node_timeout_s: float, policy: RetryPolicy, load: LoadCallback | None,
                 status: Callable[[], Status | None], rng: random.Random,
                 load_interval_s: float | None = None, ssl_context: ssl.SSLContext | bool = True,
                 session: NodeSession | None = None) -> None:
        self.base_url = base_url
        self.ssl_context = ssl_context  # the client's, shared: a context may serve several threads' connections
        self.token = token
        self.agent_id = agent_id
        self.reregister = reregister
        self.interval_s = interval_s
        self.node_timeout_s = node_timeout_s
        self.retry_policy = policy
        self.load = load
        self.load_interval_s = load_interval_s if load is not None and load_interval_s else None
        self.status = status
        self.session = session  # the process's session with the node, shared; None: HTTP only
        self._sent_load: Load | None = None
        self.rng = random.Random(rng.random())  # its own stream: the thread must not share the caller's RNG
        self.stats = HeartbeatStats()
        self.state = HeartbeatState.NEW
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start_thread(self) -> None:
        name = f"reach-heartbeat-{self.agent_id}"
        self._thread = threading.Thread(target=self._thread_main, name=name, daemon=True)
        self._thread.start()

    def start_task(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._main(), name="reach-heartbeat")
        self._task.add_done_callback(self._task_done)

    def wake(self) -> None:
        """Send a heartbeat now (e.g. to push a status change) instead of at the next tick."""
        if self._loop is not None and self._wake is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._wake.set)

    async def stop(self) -> None:
        if self._task is not None:
            if self._stop is not None:
                self._stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            return
        if self._thread is None:
            return
        await asyncio.to_thread(self._ready.wait, HEARTBEAT_STOP_TIMEOUT_S)
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        await asyncio.to_thread(self._thread.join, HEARTBEAT_STOP_TIMEOUT_S)
        if self._thread.is_alive():
            log.error("the heartbeat thread of %s did not stop within %.0fs", self.agent_id,
                      HEARTBEAT_STOP_TIMEOUT_S)

    def _thread_main(self) -> None:
        self.stats.thread_name = threading.current_thread().name
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - the thread must record why it died
            self._died(exc)
        finally:
            self._ready.set()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._died(task.exception())  # type: ignore[arg-type]

    def _died(self, exc: BaseException) -> None:
        self.error = exc
        self.state = HeartbeatState.FAILED
        log.error("heartbeats of %s stopped: %r — the lease will lapse", self.agent_id, exc,
                  exc_info=exc)

    # -- the loop ----------------------------------------------------------------------------

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self.state = HeartbeatState.RUNNING
        self._ready.set()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl_context)) as session:
            api = NodeApi(session, self.base_url, self.token, timeout_s=self.node_timeout_s)
            failures = 0
            beat_due = 0.0  # time.monotonic() at which the next heartbeat is due
            while not self._stop.is_set():
                wait_s = self.interval_s
                try:
                    if time.monotonic() >= beat_due:
                        await self._beat(api)
                        beat_due = self._next_due()
                        wait_s = max(0.0, beat_due - time.monotonic())
                    else:
                        await self._report_load(api)
                    failures = 0
                except asyncio.CancelledError:
                    raise
                except NodeError as exc:
                    self.stats.failed += 1
                    self.stats.last_error = f"{exc.code}: {exc.message}"
                    if retryable_node_error(exc):
                        # Retry sooner than the interval so one lost beat does not cost the lease.
                        wait_s = min(self.interval_s, self.retry_policy.backoff_s(failures, self.rng))
                        failures += 1
                    log.warning("heartbeat of %s failed: %s", self.agent_id, exc.message)
                except Exception as exc:  # noqa: BLE001 - one bad beat must not end the loop
                    self.stats.failed += 1
                    self.stats.last_error = repr(exc)
                    log.exception("heartbeat of %s failed unexpectedly", self.agent_id)
                if self.load_interval_s is not None:
                    wait_s = min(wait_s, self.load_interval_s, max(0.0, beat_due - time.monotonic()))
                if await self._pause(wait_s):
                    beat_due = 0.0  # woken: a status to push now
        self.state = HeartbeatState.STOPPED

    def _next_due(self) -> float:
        """When the next renewal is due: an interval from now, or over a session a little earlier,
        on the session's beat (``NodeSession.aligned``), so the process's agents renew together,
        in one frame."""
        due = time.monotonic() + self.interval_s
        session = self.session
        return session.aligned(due, self.interval_s) if session is not None and session.pushing else due

    async def _pause(self, seconds: float) -> bool:
        """Wait ``seconds``, or less if stopped or woken; True if woken."""
        if self._stop is None or self._wake is None:
            raise RuntimeError("the heartbeat loop is not running")
        stop = asyncio.ensure_future(self._stop.wait())
        wake = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({stop, wake}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            wake.cancel()
        woken = self._wake.is_set()
        self._wake.clear()
        return woken

    async def _beat(self, api: NodeApi) -> None:
        beat = Heartbeat(status=self.status(), load=self._current_load())
        try:
            if await self._over_session(beat):
                self.stats.over_session += 1
            else:
                await api.heartbeat(self.agent_id, beat)
            self._sent_load = beat.load
        except UnknownAgent:
            # The lease lapsed (a partition, a paused process, a node that lost Redis): come back.
            response = await self.reregister(api, self.status())
            self._sent_load = None  # a registration starts from no load: report it again
            self.stats.reregistered += 1
            if response.heartbeat_interval_ms:
                self.interval_s = min(self.interval_s, response.heartbeat_interval_ms / 1000)
            log.warning("%s had no lease at %s; registered again (version %d)", self.agent_id,
                        self.base_url, response.version)
        self.stats.sent += 1
        self.stats.last_sent_at = time.monotonic()
        self.stats.last_error = None

    async def _report_load(self, api: NodeApi) -> None:
        """Report the load if it changed since it was last sent; a lapsed lease heartbeats (and so
        registers again) at once."""
        load = self._current_load()
        if load is None or load == self._sent_load:
            return
        try:
            if await self._over_session(load):
                self.stats.session_load_reports += 1
            else:
                await api.report_load(self.agent_id, load)
        except UnknownAgent:
            await self._beat(api)
            return
        self._sent_load = load
        self.stats.load_reports += 1

    async def _over_session(self, what: Heartbeat | Load) -> bool:
        """Send a renewal (or a load report) over the session; False if it cannot carry it now (then
        HTTP does). The first renewal after registering waits for the agent's join."""
        session = self.session
        if session is None or not await session.wait_joined(self.agent_id, timeout_s=self.node_timeout_s):
            return False
        try:
            if isinstance(what, Heartbeat):
                await session.renew(self.agent_id, what, timeout_s=self.node_timeout_s)
            else:
                await session.report_load(self.agent_id, what, timeout_s=self.node_timeout_s)
        except SessionDown as exc:
            log.debug("heartbeat of %s over HTTP: %s", self.agent_id, exc.message)
            return False
        return True

    def _current_load(self) -> Load | None:
        if self.load is None:
            return None
        try:
            value = self.load()
        except Exception:  # noqa: BLE001 - a broken load callback must not stop the heartbeat
            log.exception("the load callback of %s raised; heartbeat sent without load", self.agent_id)
            return None
        if value is None or isinstance(value, Load):
            return value
        return Load.model_validate(dict(value))


__all__ = ["HEARTBEAT_STOP_TIMEOUT_S", "Heartbeater", "HeartbeatState", "HeartbeatStats", "LoadCallback", "Reregister"]
