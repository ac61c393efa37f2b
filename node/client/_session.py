"""The SDK's session: one long-lived WebSocket per process and node (``GET /v1/session``).

Every :class:`~node.client.ReachClient` of a process that talks to one node shares one
:class:`NodeSession` (:meth:`NodeSession.acquire`), which runs on a thread of its own with its own
event loop, as heartbeats do, so an agent loop that blocks does not end it. Each agent joins it
with its own token; the heartbeat loop (``_heartbeat``) then renews the lease and reports load over
it (one frame carries every renewal that is due at once) and over HTTP only while it is down. The
node tells the region when the connection ends without the agent leaving — its agents are then
not routable (suspect) until they return or their leases pass — and pushes ``gone`` for the agents
this process holds tickets for, which drops those tickets at once.

A lost connection is opened again after a jittered, doubling wait (``RECONNECT_MS``: a node restart
is not met by every process at the same instant), and every agent joins again. A node that does
not serve sessions (an older one: 404) is asked again every ``UNSUPPORTED_RETRY_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import random
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import aiohttp
import orjson
from pydantic import ValidationError

from ..core import UnknownAgent
from ..core.models import Gone, Heartbeat, Joined, Load, SessionAnswer, compat
from ._errors import NodeUnreachable, node_error

log = logging.getLogger("node.client")  # the SDK logs under one name, whichever module it is in

SESSION_PATH = "/v1/session"
RECONNECT_MS = (100, 5_000)  # the first wait after a lost session and the longest, each jittered
UNSUPPORTED_RETRY_S = 60.0
PING_S = 5.0  # the SDK's own ping: a node that went silent is left for another within 1.5 pings
STOP_TIMEOUT_S = 10.0
MAX_FRAME_BYTES = 1 << 20
JOIN_POLL_S = 0.005  # how often a renewal waiting for its agent's join looks again (bounded by its timeout)
FLUSH_WINDOW_S = 0.005  # a renewal waits this long for the others due at the same beat: one frame for all
GoneListener = Callable[[list[str]], None]


class SessionState(enum.Enum):
    """NEW → CONNECTING → OPEN ⇄ DOWN (waiting to reconnect) → CLOSED; UNSUPPORTED: the node has no sessions."""

    NEW = "new"
    CONNECTING = "connecting"
    OPEN = "open"
    DOWN = "down"
    UNSUPPORTED = "unsupported"
    CLOSED = "closed"


class SessionDown(NodeUnreachable):
    """The session cannot carry this now (not open, the agent not joined, no answer in time): use HTTP."""

    code = "session_down"


class NodeSession:
    """One process's session with one node, shared by its clients; thread-safe.

    ``renew`` and ``report_load`` are coroutines for any event loop; they raise
    :class:`SessionDown` when the session cannot carry them now (the caller then uses HTTP) and
    the node's error otherwise (``UnknownAgent``: register again).
    """

    _shared: ClassVar[dict[str, NodeSession]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, base_url: str, *, token: str, ssl_context: ssl.SSLContext | bool = True,
                 rng: random.Random | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.ssl_context = ssl_context
        self.rng = rng or random.Random()
        self.phase = self.rng.random()  # where in each interval this process renews (aligned): spread over processes
        self.state = SessionState.NEW
        self.attempts = 0  # connections tried (opened or not): what a restarted node sees of this process
        self.connects = 0  # sessions opened (1 + reconnects)
        self.opened_at: float | None = None  # time.monotonic() when the connection open now opened
        self.renewals = 0  # renewals the node acknowledged
        self.renew_frames = 0  # renew frames sent (renewals / frames: how well the agents' beats align)
        self.pushes = 0  # gone frames received
        self._users = 0
        self._lock = threading.Lock()
        self._members: dict[str, str] = {}  # agent -> its token
        self._joined: set[str] = set()  # agents joined on the connection open now
        self._watched: set[str] = set()
        self._listeners: list[GoneListener] = []
        self._lost_listeners: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self._pending: list[tuple[dict[str, Any], asyncio.Future[int]]] = []
        self._waiting: dict[int, dict[str, asyncio.Future[int]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # frames being sent

    # -- sharing -----------------------------------------------------------------------------

    @classmethod
    def acquire(cls, base_url: str, *, token: str, ssl_context: ssl.SSLContext | bool = True) -> NodeSession:
        """The process's session with ``base_url`` (opened by its first user, with its token and TLS)."""
        key = base_url.rstrip("/")
        with cls._shared_lock:
            session = cls._shared.get(key)
            if session is None:
                session = cls._shared[key] = NodeSession(key, token=token, ssl_context=ssl_context)
                session._start()
            else:
                session.token = token  # the newest user's: the session outlives the first one's token
            session._users += 1
            return session

    async def release(self) -> None:
        """One user less; the last one closes the session (its agents left it first)."""
        with self._shared_lock:
            self._users -= 1
            last = self._users <= 0
            if last and self._shared.get(self.base_url) is self:
                del self._shared[self.base_url]
        if last:
            await asyncio.to_thread(self._close)

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._thread_main, name="reach-session", daemon=True)
        self._thread.start()
        self._ready.wait(STOP_TIMEOUT_S)

    def _close(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
            if self._thread.is_alive():
                log.error("the session thread with %s did not stop within %.0fs", self.base_url, STOP_TIMEOUT_S)

    # -- what clients ask (any thread) -------------------------------------------------------

    def join(self, agent_id: str, token: str) -> None:
        """Carry ``agent_id`` (authorised by ``token``) on this session, now and after every reconnect."""
        with self._lock:
            self._members[agent_id] = token
        self._soon(self._join_now, [agent_id])

    async def leave(self, agent_id: str, *, timeout_s: float = 2.0) -> None:
        """Stop carrying ``agent_id``; it leaves cleanly (the node marks nothing when the session ends)."""
        with self._lock:
            self._members.pop(agent_id, None)
        if self._loop is None or self.state is SessionState.CLOSED:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                self._send({"t": "leave", "agents": [agent_id]}), self._loop)), timeout_s)

    def joined(self, agent_id: str) -> bool:
        """Whether the node acknowledged ``agent_id`` on the connection open now."""
        return self.state is SessionState.OPEN and agent_id in self._joined

    async def wait_joined(self, agent_id: str, *, timeout_s: float) -> bool:
        """Whether ``agent_id`` is joined, waiting up to ``timeout_s`` while the session is opening
        or the join is on its way (a renewal right after registration goes over it, not HTTP)."""
        deadline = time.monotonic() + timeout_s
        while not self.joined(agent_id):
            opening = self.state in (SessionState.NEW, SessionState.CONNECTING) or (
                self.state is SessionState.OPEN and agent_id in self._members)
            if not opening or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(JOIN_POLL_S)
        return True

    def watch(self, agent_ids: list[str]) -> None:
        """Hear ``gone`` for these agents (the targets of tickets this process holds)."""
        with self._lock:
            new = [agent_id for agent_id in agent_ids if agent_id not in self._watched]
            self._watched.update(new)
        if new:
            self._soon(self._send_nowait, {"t": "watch", "agents": new})

    def on_gone(self, listener: GoneListener) -> Callable[[], None]:
        """Call ``listener(agent_ids)`` (on the session's thread) when the node says they are gone."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def aligned(self, due: float, interval_s: float) -> float:
        """The last instant of this session's beat at or before ``due`` (monotonic seconds): agents
        with the same interval renew at the same instants, in one frame; the phase is this
        process's own, so the processes of a region do not renew at once."""
        return due - (due - self.phase * interval_s) % interval_s

    def on_lost(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` (on the session's thread) when an open connection ends: ``gone`` may be missed."""
        self._lost_listeners.append(listener)
        return lambda: self._lost_listeners.remove(listener) if listener in self._lost_listeners else None

    @property
    def pushing(self) -> bool:
        """Whether ``gone`` can arrive now (the connection is open)."""
        return self.state is SessionState.OPEN

    async def renew(self, agent_id: str, heartbeat: Heartbeat, *, timeout_s: float) -> int:
        """Renew ``agent_id``'s lease (the heartbeat's status and load with it); its new expiry (ms)."""
        beat = {"agent_id": agent_id, **heartbeat.model_dump(mode="json", exclude_none=True)}
        return await self._ask(agent_id, beat, timeout_s=timeout_s)

    async def report_load(self, agent_id: str, load: Load, *, timeout_s: float) -> None:
        await self._ask(agent_id, {"agent_id": agent_id, "load": load.model_dump(mode="json")}, timeout_s=timeout_s,
                        kind="load")

    async def _ask(self, agent_id: str, item: dict[str, Any], *, timeout_s: float, kind: str = "renew") -> int:
        loop = self._loop
        if loop is None or not self.joined(agent_id):
            raise SessionDown(f"the session with {self.base_url} does not carry {agent_id} now")
        future = asyncio.run_coroutine_threadsafe(self._queue(kind, item), loop)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except TimeoutError:
            raise SessionDown(f"no answer over the session with {self.base_url} within {timeout_s:.1f}s") from None

    # -- the session's own loop --------------------------------------------------------------

    def _soon(self, callback: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended: nothing to send
                loop.call_soon_threadsafe(callback, *args)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - the thread must say why it died
            log.error("the session with %s stopped: %r; heartbeats go over HTTP", self.base_url, exc, exc_info=exc)
        finally:
            self.state = SessionState.CLOSED
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl_context)) as http:
            failures = 0
            while not self._stop.is_set():
                self.state = SessionState.CONNECTING
                wait_s = self._backoff_s(failures)
                self.attempts += 1
                headers = {"Authorization": f"Bearer {self.token}"}
                try:
                    async with http.ws_connect(self.base_url + SESSION_PATH, headers=headers, heartbeat=PING_S,
                                               max_msg_size=MAX_FRAME_BYTES, timeout=aiohttp.ClientWSTimeout(
                                                   ws_receive=None, ws_close=2.0)) as ws:
                        failures = 0
                        await self._serve(ws)
                    failures += 1
                except asyncio.CancelledError:
                    raise
                except aiohttp.WSServerHandshakeError as exc:
                    failures += 1
                    if exc.status == 404:
                        self.state = SessionState.UNSUPPORTED
                        wait_s = UNSUPPORTED_RETRY_S
                        log.info("node %s serves no sessions; heartbeats go over HTTP", self.base_url)
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    failures += 1
                    log.debug("session with %s: %r", self.base_url, exc)
                finally:
                    self._lost()
                if self.state is not SessionState.UNSUPPORTED:
                    self.state = SessionState.DOWN
                    wait_s = self._backoff_s(failures)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), wait_s)
        self.state = SessionState.CLOSED

    def _backoff_s(self, failures: int) -> float:
        """Half the doubling wait plus a random part of the other half: spread, and never zero."""
        first_ms, longest_ms = RECONNECT_MS
        wait_ms = min(longest_ms, first_ms * 2 ** min(failures, 16))
        return (wait_ms / 2 + self.rng.random() * wait_ms / 2) / 1000

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self.state = SessionState.OPEN
        self.opened_at = time.monotonic()
        self.connects += 1
        with self._lock:
            members = list(self._members)
            watched = list(self._watched)
        await self._send_joins(members)
        if watched:
            await self._send({"t": "watch", "agents": watched})
        stop = asyncio.ensure_future(self._stop.wait()) if self._stop is not None else None
        try:
            while True:
                receive = asyncio.ensure_future(ws.receive())
                done, _ = await asyncio.wait({receive, stop} if stop else {receive},
                                             return_when=asyncio.FIRST_COMPLETED)
                if receive not in done:
                    receive.cancel()
                    await ws.close()
                    return
                message = receive.result()
                if message.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    return
                self._dispatch(message.data)
        finally:
            if stop is not None:
                stop.cancel()

    def _dispatch(self, data: str | bytes) -> None:
        try:
            frame = orjson.loads(data)
            kind = frame.get("t") if isinstance(frame, dict) else None
            if kind in ("renewed", "loaded"):
                self._answered(compat.read_python(SessionAnswer, frame))
            elif kind == "joined":
                joined = compat.read_python(Joined, frame)
                self._joined.update(joined.agents)
                for refused in joined.refused:
                    log.warning("node %s refused %s on the session: %s", self.base_url, refused.get("agent_id"),
                                refused.get("message"))
            elif kind == "gone":
                self._gone(compat.read_python(Gone, frame).agents)
            elif kind == "error":
                log.warning("node %s on the session: %s", self.base_url, frame.get("message"))
        except (orjson.JSONDecodeError, ValidationError) as exc:
            log.warning("node %s sent a session frame this SDK cannot read: %s", self.base_url, exc)

    def _answered(self, answer: SessionAnswer) -> None:
        futures = self._waiting.pop(answer.id, {})
        for agent_id, future in futures.items():
            if future.done():
                continue
            if agent_id in answer.leases:
                self.renewals += 1
                future.set_result(answer.leases[agent_id])
            elif agent_id in answer.errors:
                error = answer.errors[agent_id]
                if error.get("error") in ("not_joined", "token_expired", "token_revoked"):
                    self._joined.discard(agent_id)  # HTTP says what is wrong, or works
                    future.set_exception(SessionDown(str(error.get("message"))))
                else:
                    future.set_exception(node_error(404 if error.get("error") == UnknownAgent.code else 503, error,
                                                    what=f"the session with {self.base_url}"))
            else:
                future.set_result(0)  # a load report: nothing to say

    def _gone(self, agent_ids: list[str]) -> None:
        self.pushes += 1
        for listener in list(self._listeners):
            try:
                listener(agent_ids)
            except Exception:  # noqa: BLE001 - one client must not stop the others hearing it
                log.exception("a session listener failed")

    async def _queue(self, kind: str, item: dict[str, Any]) -> int:
        """Join the frame that goes out next (within FLUSH_WINDOW_S: every renewal due at once)."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if not self._pending:
            asyncio.get_running_loop().call_later(FLUSH_WINDOW_S, self._flush)
        self._pending.append(({"kind": kind, **item}, future))
        return await future

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for kind, key in (("renew", "beats"), ("load", "loads")):
            items = [(item, future) for item, future in pending if item["kind"] == kind]
            if not items:
                continue
            frame_id = next(self._ids)
            self.renew_frames += kind == "renew"
            futures = self._waiting[frame_id] = {item["agent_id"]: future for item, future in items}
            body = [{k: v for k, v in item.items() if k != "kind"} for item, _ in items]
            self._send_nowait({"t": kind, "id": frame_id, key: body}, waiting=futures)

    def _join_frame(self, agent_ids: list[str]) -> dict[str, Any] | None:
        with self._lock:
            agents = [{"agent_id": a, "token": self._members[a]} for a in agent_ids if a in self._members]
        return {"t": "join", "agents": agents} if agents and self.state is SessionState.OPEN else None

    def _join_now(self, agent_ids: list[str]) -> None:
        frame = self._join_frame(agent_ids)
        if frame is not None:
            self._send_nowait(frame)

    async def _send_joins(self, agent_ids: list[str]) -> None:
        frame = self._join_frame(agent_ids)
        if frame is not None:
            await self._send(frame)

    def _send_nowait(self, frame: dict[str, Any], *, waiting: dict[str, asyncio.Future[int]] | None = None) -> None:
        """Send ``frame`` in a task of this session's (held until done); if it cannot go, what
        waits on it fails at once (the caller uses HTTP)."""
        task = asyncio.get_running_loop().create_task(self._send(frame))
        self._tasks.add(task)

        def sent(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            error = None if task.cancelled() else task.exception()
            if error is None and not task.cancelled():
                return
            for future in (waiting or {}).values():
                if not future.done():
                    future.set_exception(SessionDown(f"the session with {self.base_url} could not send: {error!r}"))

        task.add_done_callback(sent)

    async def _send(self, frame: dict[str, Any]) -> None:
        ws = self._ws
        if ws is None or ws.closed:
            raise SessionDown(f"the session with {self.base_url} is not open")
        await ws.send_bytes(orjson.dumps(frame))

    def _lost(self) -> None:
        """The connection ended: nothing is joined, and what waits on it fails (the caller uses HTTP)."""
        was_open, self._ws = self._ws is not None, None
        if self.state is SessionState.OPEN:
            self.state = SessionState.DOWN  # before the listeners: nothing may count on a push any more
        self._joined.clear()
        if was_open:
            for listener in list(self._lost_listeners):
                try:
                    listener()
                except Exception:  # noqa: BLE001 - one client must not stop the others hearing it
                    log.exception("a session listener failed")
        for futures in self._waiting.values():
            for future in futures.values():
                if not future.done():
                    future.set_exception(SessionDown(f"the session with {self.base_url} was lost"))
        self._waiting.clear()


__all__ = ["NodeSession", "SessionDown", "SessionState"]
