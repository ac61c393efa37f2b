"""The agent SDK: register, stay alive, find others and call them — ``ReachClient``.

::

    async with ReachClient("http://127.0.0.1:7070", token=TOKEN, registration=registration,
                           load=lambda: Load(inflight=server.inflight)) as reach:
        result = await reach.call("translate.text", {"text": "退款说明", "target_lang": "en"},
                                  idempotent=True)

What it guarantees:

* **Registration** retries with backoff until the node answers (``register_max_wait_ms`` caps
  it); a rejection (bad token, forbidden transport, invalid field) raises at once.
* **Heartbeats** run on their own thread with their own event loop and HTTP session
  (``heartbeat_in_thread=True``, the default): an agent handler that blocks the caller's event
  loop — synchronous I/O, a CPU-bound step — does not stop them. The ``load`` callback is
  called on that thread, so it must be thread-safe (reading counters is). A pure-Python busy
  loop holding the GIL still lets the heartbeat thread run every ``sys.getswitchinterval()``
  (5 ms); only a C extension that holds the GIL for longer than the lease can starve it.
  ``unknown_agent`` (the lease lapsed) re-registers from the same thread.
* **Close** stops heartbeats, flushes outcome reports and deregisters.
* ``resolve()`` caches a ticket until it expires; a failure of its target evicts it.
* ``call()`` POSTs an :class:`~node.envelope.Envelope` to the target (the raw payload for
  ``transport = "passthrough"``) with separate connect, read and overall timeouts. Only
  ``idempotent=True`` calls are retried: after the wait of :class:`RetryPolicy` they move to an
  alternate of the ticket or a fresh decision that excludes every agent already tried — never
  the same address twice. A breaker per target skips agents that keep failing. Every attempt's
  outcome goes to ``/v1/reports`` in the background, batched.

Errors (the node's tree, :mod:`node.errors`, plus)::

    NodeError
    └── ClientError               base of what only the SDK raises
        ├── NodeUnreachable       503 the node did not answer (connection refused, timeout)
        ├── NodeRejected          the node answered with an error this SDK has no class for
        └── CallFailed            502 no attempt of call() succeeded; ``.attempts`` says why each failed
            ├── CallRejected      the target answered 4xx (not retried: the request is wrong)
            └── CallTimeout       504 the overall request timeout passed

A node error with a known code is raised as its own class (``NoAgentAvailable``,
``UnknownAgent``, ``Unauthorized``, :class:`~node.envelope.HopLimitExceeded`,
:class:`~node.envelope.EnvelopeExpired` …) with the node's code, message, field and details.
``call()`` raises those last two itself before sending: a direct call is a hop, like a
proxied one, so ``hop_count`` is incremented and an A→B→A loop stops at ``max_hops`` (5).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from pydantic import BaseModel, ValidationError

from .agentconfig import AgentConfig, AgentConfigError, ClientSettings, RetryPolicy, load_agent_config
from .envelope import (
    Envelope,
    EnvelopeExpired,
    EnvelopeType,
    HopLimitExceeded,
    Policy,
    RouteEvent,
    RouteEventKind,
    SendAccepted,
    Trace,
    epoch_ms,
    looks_like_envelope,
)
from .errors import (
    BadRequest,
    Conflict,
    Forbidden,
    NoAgentAvailable,
    NodeError,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    StoreUnavailable,
    Unauthorized,
    UnknownAgent,
    ValidationFailed,
)
from .models import (
    Heartbeat,
    Load,
    Outcome,
    OutcomeReport,
    RegisterResponse,
    Registration,
    RouteRequest,
    RouteTarget,
    RouteTicket,
    Scope,
    Status,
)
from .outcomes import BreakerState, OutcomeTracker

log = logging.getLogger(__name__)

PASSTHROUGH = "passthrough"
TICKET_CACHE_SIZE = 1_024
TICKET_EXPIRY_MARGIN = 0.9
HEARTBEAT_STOP_TIMEOUT_S = 10.0
MAX_RESOLVES_PER_PICK = 3
MAX_EXCLUDE = 64  # RouteRequest.exclude's limit
LoadCallback = Callable[[], "Load | Mapping[str, Any] | None"]
Sleep = Callable[[float], Awaitable[None]]


# -- errors ----------------------------------------------------------------------------------


class ClientError(NodeError):
    """Base of the errors only the SDK raises."""

    status = 500
    code = "client_error"


class NodeUnreachable(ClientError):
    """The registry node did not answer: check the URL, the network and that it runs."""

    status = 503
    code = "node_unreachable"


class NodeRejected(ClientError):
    """The node answered with an error status this SDK has no class for (see ``status``)."""

    def __init__(self, message: str, *, status: int, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.status = status


@dataclass(slots=True)
class Attempt:
    """One try of a call: which agent, and how it went."""

    agent_id: str
    endpoint: str
    outcome: Outcome
    latency_ms: float
    status: int | None = None
    error: str | None = None


class CallFailed(ClientError):
    """No attempt of a call succeeded; ``attempts`` lists each, with its error."""

    status = 502
    code = "call_failed"

    def __init__(self, message: str, *, attempts: list[Attempt], trace_id: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.attempts = attempts
        self.trace_id = trace_id


class CallRejected(CallFailed):
    """The target answered 4xx: the request itself is wrong, so it is not retried."""

    code = "call_rejected"

    def __init__(self, message: str, *, attempts: list[Attempt], trace_id: str, response_status: int,
                 body: Any, **kwargs: Any) -> None:
        super().__init__(message, attempts=attempts, trace_id=trace_id, **kwargs)
        self.response_status = response_status
        self.body = body


class CallTimeout(CallFailed):
    """The call's overall timeout (``request_timeout_ms``) passed."""

    status = 504
    code = "call_timeout"


_BY_CODE: dict[str, type[NodeError]] = {"unknown_agent": UnknownAgent, "no_agent_available": NoAgentAvailable,
                                         "hop_limit_exceeded": HopLimitExceeded, "envelope_expired": EnvelopeExpired}
_BY_STATUS: dict[int, type[NodeError]] = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
                                          409: Conflict, 413: PayloadTooLarge, 422: ValidationFailed,
                                          429: RateLimited, 503: StoreUnavailable}


def node_error(status: int, body: Any, *, what: str) -> NodeError:
    """The exception for a node's error answer (``{"error", "message", "field"}``)."""
    if not isinstance(body, dict):
        body = {"message": str(body)[:300]}
    code = str(body.get("error") or "")
    message = f"{what}: {body.get('message') or f'HTTP {status}'}"
    kwargs: dict[str, Any] = {"field": body.get("field"), "details": body.get("details"), "code": code or None}
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status)
    if cls is None:
        return NodeRejected(message, status=status, **kwargs)
    return cls(message, **kwargs)


# -- the node's HTTP API ---------------------------------------------------------------------


class _NodeApi:
    """Requests to the registry node over one aiohttp session (one per event loop)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, token: str, *, timeout_s: float) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def request(self, method: str, path: str, body: BaseModel | dict[str, Any] | None = None) -> Any:
        """The decoded JSON answer; raises :class:`NodeUnreachable` or the node's error."""
        data = None
        headers = self.headers
        if body is not None:
            data = body.model_dump_json().encode() if isinstance(body, BaseModel) else orjson.dumps(body)
            headers = {**headers, "Content-Type": "application/json"}
        url = self.base_url + path
        try:
            async with self.session.request(method, url, data=data, headers=headers, timeout=self.timeout) as resp:
                raw = await resp.read()
                status = resp.status
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise NodeUnreachable(f"node {self.base_url} did not answer {method} {path}: "
                                  f"{type(exc).__name__}: {exc}") from exc
        try:
            decoded = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            decoded = raw.decode(errors="replace")
        if status >= 400:
            raise node_error(status, decoded, what=f"{method} {path} on {self.base_url}")
        return decoded

    async def register(self, registration: Registration) -> RegisterResponse:
        return RegisterResponse.model_validate(await self.request("POST", "/v1/agents", registration))

    async def heartbeat(self, agent_id: str, heartbeat: Heartbeat) -> None:
        await self.request("PUT", f"/v1/agents/{quote(agent_id)}/heartbeat", heartbeat)

    async def deregister(self, agent_id: str) -> None:
        await self.request("DELETE", f"/v1/agents/{quote(agent_id)}")


def _retryable_node_error(exc: NodeError) -> bool:
    """Transient: the node could not answer now (not: the request is wrong)."""
    return isinstance(exc, (NodeUnreachable, StoreUnavailable, RateLimited, Conflict)) or exc.status >= 500


async def register_with_backoff(api: _NodeApi, registration: Registration, policy: RetryPolicy, *,
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
            if not _retryable_node_error(exc) or stopping():
                raise
            delay = policy.backoff_s(attempt, rng)
            if max_wait_s is not None and clock() - started + delay > max_wait_s:
                raise
            log.warning("registering %s: %s; retrying in %.2fs", registration.agent_id, exc.message, delay)
            attempt += 1
            await sleep(delay)


# -- heartbeats ------------------------------------------------------------------------------


class HeartbeatState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(slots=True)
class HeartbeatStats:
    """What the heartbeat loop did; read from any thread."""

    sent: int = 0
    failed: int = 0
    reregistered: int = 0
    last_sent_at: float | None = None
    last_error: str | None = None
    thread_name: str | None = None


class _Heartbeater:
    """Renews the lease every ``interval_s``, on a thread of its own or as a task.

    The stop and wake signals may come from any thread (``call_soon_threadsafe``).
    """

    def __init__(self, *, base_url: str, token: str, registration: Registration, interval_s: float,
                 node_timeout_s: float, policy: RetryPolicy, load: LoadCallback | None,
                 status: Callable[[], Status | None], rng: random.Random) -> None:
        self.base_url = base_url
        self.token = token
        self.registration = registration
        self.interval_s = interval_s
        self.node_timeout_s = node_timeout_s
        self.retry_policy = policy
        self.load = load
        self.status = status
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
        name = f"reach-heartbeat-{self.registration.agent_id}"
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
            log.error("the heartbeat thread of %s did not stop within %.0fs", self.registration.agent_id,
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
        log.error("heartbeats of %s stopped: %r — the lease will lapse", self.registration.agent_id, exc,
                  exc_info=exc)

    # -- the loop ----------------------------------------------------------------------------

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self.state = HeartbeatState.RUNNING
        self._ready.set()
        async with aiohttp.ClientSession() as session:
            api = _NodeApi(session, self.base_url, self.token, timeout_s=self.node_timeout_s)
            failures = 0
            while not self._stop.is_set():
                wait_s = self.interval_s
                try:
                    await self._beat(api)
                    failures = 0
                except asyncio.CancelledError:
                    raise
                except NodeError as exc:
                    self.stats.failed += 1
                    self.stats.last_error = f"{exc.code}: {exc.message}"
                    if _retryable_node_error(exc):
                        # Retry sooner than the interval so one lost beat does not cost the lease.
                        wait_s = min(self.interval_s, self.retry_policy.backoff_s(failures, self.rng))
                        failures += 1
                    log.warning("heartbeat of %s failed: %s", self.registration.agent_id, exc.message)
                except Exception as exc:  # noqa: BLE001 - one bad beat must not end the loop
                    self.stats.failed += 1
                    self.stats.last_error = repr(exc)
                    log.exception("heartbeat of %s failed unexpectedly", self.registration.agent_id)
                await self._pause(wait_s)
        self.state = HeartbeatState.STOPPED

    async def _pause(self, seconds: float) -> None:
        if self._stop is None or self._wake is None:
            raise RuntimeError("the heartbeat loop is not running")
        stop = asyncio.ensure_future(self._stop.wait())
        wake = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({stop, wake}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            wake.cancel()
        self._wake.clear()

    async def _beat(self, api: _NodeApi) -> None:
        beat = Heartbeat(status=self.status(), load=self._current_load())
        try:
            await api.heartbeat(self.registration.agent_id, beat)
        except UnknownAgent:
            # The lease lapsed (a partition, a paused process, a node that lost Redis): come back.
            registration = self.registration
            status = self.status()
            if status is not None:
                registration = registration.model_copy(update={"status": status})
            response = await api.register(registration)
            self.stats.reregistered += 1
            if response.heartbeat_interval_ms:
                self.interval_s = min(self.interval_s, response.heartbeat_interval_ms / 1000)
            log.warning("%s had no lease at %s; registered again (version %d)", registration.agent_id,
                        self.base_url, response.version)
        self.stats.sent += 1
        self.stats.last_sent_at = time.monotonic()
        self.stats.last_error = None

    def _current_load(self) -> Load | None:
        if self.load is None:
            return None
        try:
            value = self.load()
        except Exception:  # noqa: BLE001 - a broken load callback must not stop the heartbeat
            log.exception("the load callback of %s raised; heartbeat sent without load", self.registration.agent_id)
            return None
        if value is None or isinstance(value, Load):
            return value
        return Load.model_validate(dict(value))


# -- outcome reports -------------------------------------------------------------------------


class _Reporter:
    """Sends outcome reports (and direct-call route events) to the node in batches, in the background.

    A batch goes out when it holds ``batch_size`` items or ``flush_interval_s`` after its first
    item, whichever comes first. ``flush()`` puts a marker in the queue and waits until every
    item before it has been sent, so nothing is lost in a half-collected batch.
    """

    def __init__(self, api: _NodeApi, *, batch_size: int, flush_interval_s: float, queue_limit: int,
                 flush_timeout_s: float) -> None:
        self.api = api
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.queue_limit = queue_limit
        self.flush_timeout_s = flush_timeout_s
        self.sent_reports = 0
        self.sent_batches = 0
        self.dropped = 0
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
        reports = [item.model_dump(mode="json") for item in batch if isinstance(item, OutcomeReport)]
        events = [item.model_dump(mode="json") for item in batch if isinstance(item, RouteEvent)]
        try:
            if reports:
                await self.api.request("POST", "/v1/reports", {"reports": reports})
                self.sent_reports += len(reports)
                self.sent_batches += 1
            if events:
                await self.api.request("POST", "/v1/traces", {"events": events})
        except asyncio.CancelledError:
            raise
        except NodeError as exc:
            self.dropped += len(batch)
            log.warning("could not send %d outcome reports: %s", len(batch), exc.message)


# -- calls -----------------------------------------------------------------------------------


@dataclass(slots=True)
class CallResult:
    """A successful call: who answered, what, and how many attempts it took."""

    agent_id: str
    region: str
    endpoint: str
    status: int
    body: Any
    envelope: Envelope | None
    trace_id: str
    request: Envelope
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def payload(self) -> Any:
        """The response envelope's payload, or the raw body when the target is not envelope-aware."""
        return self.envelope.payload if self.envelope is not None else self.body


@dataclass(slots=True)
class SendResult:
    """The answer of proxy mode (``POST /v1/send``)."""

    status: int
    body: Any
    envelope: Envelope | None
    agent_id: str | None
    duplicate: bool
    accepted: SendAccepted | None = None


class _AttemptError(Exception):
    def __init__(self, outcome: Outcome, message: str, *, status: int | None = None, body: Any = None,
                 retryable: bool = True) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.status = status
        self.body = body
        self.retryable = retryable


@dataclass(slots=True)
class _Pick:
    ticket: RouteTicket
    target: RouteTarget


class ClientState(enum.Enum):
    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class ReachClient:
    """An agent's (or a plain caller's) connection to its region's registry node.

    Build it with keywords or from an agent TOML file (:mod:`node.agentconfig`)::

        ReachClient("http://127.0.0.1:7070", token=token, registration={...}, connect_timeout_ms=1000)
        ReachClient(config="agent.toml", load=current_load)

    Keywords beyond the named ones are :class:`ClientSettings` fields and override the file.
    ``clock`` (monotonic seconds), ``sleep`` and ``rng`` are injectable so tests can check the
    backoff and breaker without wall time. Without a ``registration`` it only calls others.
    """

    def __init__(self, node_url: str | None = None, *, token: str | None = None,
                 registration: Registration | Mapping[str, Any] | None = None,
                 config: AgentConfig | str | Path | None = None, settings: ClientSettings | None = None,
                 load: LoadCallback | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Sleep = asyncio.sleep, rng: random.Random | None = None, **options: Any) -> None:
        if isinstance(config, (str, Path)):
            config = load_agent_config(config)
        base = settings or (config.client if config is not None else ClientSettings())
        if options:
            try:
                base = ClientSettings.model_validate({**base.model_dump(), **options})
            except ValidationError as exc:
                first = exc.errors(include_url=False)[0]
                key = ".".join(str(part) for part in first["loc"])
                raise AgentConfigError(f"client option {key}: {first['msg']}", field=key) from exc
        self.settings = base
        url = node_url or (config.node.url if config is not None else None)
        if not url:
            raise AgentConfigError("give the node URL (node_url= or [node] url in the config)", field="node.url")
        self.node_url = url.rstrip("/")
        self.token = token or (config.resolve_token() if config is not None else None) or ""
        if not self.token:
            raise AgentConfigError("give a bearer token (token= or [node] token* in the config)", field="node.token")
        if registration is None and config is not None:
            registration = config.agent
        if registration is not None and not isinstance(registration, Registration):
            try:
                registration = Registration.model_validate(dict(registration))
            except ValidationError as exc:
                first = exc.errors(include_url=False)[0]
                key = ".".join(str(part) for part in first["loc"])
                raise AgentConfigError(f"registration {key}: {first['msg']}", field=key) from exc
        self.registration: Registration | None = registration
        self.load = load
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.retry_policy = self.settings.retry_policy()
        self.breakers = OutcomeTracker(failure_threshold=self.settings.breaker_failures,
                                       window_ms=self.settings.breaker_window_ms,
                                       cooldown_ms=self.settings.breaker_cooldown_ms)
        self.state = ClientState.NEW
        self.registered: RegisterResponse | None = None
        self.backoffs_s: list[float] = []  # every wait call() slept, in order (observability and tests)
        self._status: Status | None = None
        self._session: aiohttp.ClientSession | None = None
        self._api: _NodeApi | None = None
        self._heartbeater: _Heartbeater | None = None
        self._reporter: _Reporter | None = None
        self._tickets: dict[str, tuple[RouteTicket, float]] = {}
        self._targets_seen: set[str] = set()

    @classmethod
    def from_config(cls, path: str | Path, **kwargs: Any) -> ReachClient:
        return cls(config=path, **kwargs)

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> ReachClient:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Open the session; with a registration, register (with backoff) and start heartbeats."""
        if self.state is not ClientState.NEW:
            return
        self.state = ClientState.STARTING
        try:
            self._session = aiohttp.ClientSession()
            self._api = _NodeApi(self._session, self.node_url, self.token,
                                 timeout_s=self.settings.node_timeout_ms / 1000)
            self._reporter = _Reporter(self._api, batch_size=self.settings.report_batch_size,
                                       flush_interval_s=self.settings.report_flush_interval_ms / 1000,
                                       queue_limit=self.settings.report_queue_limit,
                                       flush_timeout_s=2 * self.settings.node_timeout_ms / 1000)
            self._reporter.start()
            if self.registration is not None:
                await self.register()
        except BaseException:
            await self.aclose()
            raise
        self.state = ClientState.RUNNING

    async def register(self) -> RegisterResponse:
        """Register (retrying until the node answers) and make sure heartbeats run."""
        if self.registration is None:
            raise AgentConfigError("this client has no registration", field="agent")
        registration = self.registration
        if self._status is not None:
            registration = registration.model_copy(update={"status": self._status})
        max_wait = self.settings.register_max_wait_ms
        self.registered = await register_with_backoff(
            self._require_api(), registration, self.retry_policy, rng=self.rng, sleep=self.sleep, clock=self.clock,
            max_wait_s=None if max_wait is None else max_wait / 1000,
            stopping=lambda: self.state in (ClientState.CLOSING, ClientState.CLOSED))
        if self._heartbeater is None:
            interval_ms = self.settings.heartbeat_interval_ms or self.registered.heartbeat_interval_ms
            self._heartbeater = _Heartbeater(
                base_url=self.node_url, token=self.token, registration=self.registration,
                interval_s=interval_ms / 1000, node_timeout_s=min(self.settings.node_timeout_ms, interval_ms) / 1000,
                policy=self.retry_policy, load=self.load, status=lambda: self._status, rng=self.rng)
            if self.settings.heartbeat_in_thread:
                self._heartbeater.start_thread()
            else:
                self._heartbeater.start_task()
        return self.registered

    async def aclose(self) -> None:
        """Stop heartbeats, flush reports, deregister, close the session. Idempotent."""
        if self.state in (ClientState.CLOSING, ClientState.CLOSED):
            return
        self.state = ClientState.CLOSING
        try:
            if self._heartbeater is not None:
                await self._heartbeater.stop()
            if self._reporter is not None:
                await self._reporter.aclose()
            if self.registered is not None and self.registration is not None and self._api is not None:
                try:
                    await self._api.deregister(self.registration.agent_id)
                except UnknownAgent:
                    pass
                except NodeError as exc:
                    log.warning("could not deregister %s (its lease will lapse instead): %s",
                                self.registration.agent_id, exc.message)
        finally:
            if self._session is not None:
                await self._session.close()
            self.state = ClientState.CLOSED

    # -- status and observability ------------------------------------------------------------

    @property
    def agent_id(self) -> str | None:
        return self.registration.agent_id if self.registration is not None else None

    @property
    def heartbeat_stats(self) -> HeartbeatStats | None:
        return self._heartbeater.stats if self._heartbeater is not None else None

    @property
    def heartbeat_error(self) -> BaseException | None:
        """Why the heartbeat loop died, if it did (it is also logged at ERROR)."""
        return self._heartbeater.error if self._heartbeater is not None else None

    @property
    def reports_sent(self) -> int:
        return self._reporter.sent_reports if self._reporter is not None else 0

    @property
    def report_batches_sent(self) -> int:
        return self._reporter.sent_batches if self._reporter is not None else 0

    def set_status(self, status: Status | None, *, push: bool = True) -> None:
        """The status heartbeats carry from now on (thread-safe); ``push`` sends one at once."""
        self._status = status
        if push and self._heartbeater is not None:
            self._heartbeater.wake()

    def breaker_state(self, agent_id: str) -> BreakerState:
        """This client's breaker for one target."""
        return self.breakers.state(agent_id, now_ms=self._now_ms())

    async def flush_reports(self) -> None:
        """Send queued outcome reports now (they are otherwise sent every flush interval)."""
        if self._reporter is not None:
            await self._reporter.flush()

    # -- node queries ------------------------------------------------------------------------

    async def node_health(self) -> dict[str, Any]:
        """The node's ``/healthz`` answer (raises :class:`NodeUnreachable` if it does not answer)."""
        return await self._require_api().request("GET", "/healthz")

    async def policy(self) -> Policy:
        """The region's policy and what the node makes of this client's token (``GET /v1/policy``)."""
        return Policy.model_validate(await self._require_api().request("GET", "/v1/policy"))

    async def trace(self, trace_id: str) -> Trace:
        """Decisions, deliveries and outcomes recorded for one trace (``GET /v1/traces/{id}``)."""
        return Trace.model_validate(await self._require_api().request("GET", f"/v1/traces/{quote(trace_id)}"))

    async def resolve(self, capability: str | None = None, *, agent_id: str | None = None,
                      pattern: str | None = None, version: str | None = None, labels: Mapping[str, str] | None = None,
                      conversation_id: str | None = None, scope: Scope | str | None = None,
                      preferred_region: str | None = None, exclude: list[str] | None = None,
                      trace_id: str | None = None, fresh: bool = False) -> RouteTicket:
        """A route ticket, from the cache while it is valid (``fresh`` or ``exclude`` skip the cache).

        Raises :class:`NoAgentAvailable` (with the node's reason per stage), :class:`NodeUnreachable`.
        """
        request = self._route_request(capability=capability, agent_id=agent_id, pattern=pattern, version=version,
                                      labels=labels, conversation_id=conversation_id, scope=scope,
                                      preferred_region=preferred_region, exclude=exclude, trace_id=trace_id)
        return await self._resolve(request, fresh=fresh)

    # -- calls -------------------------------------------------------------------------------

    async def call(self, capability: str | None = None, payload: Any = None, *, operation: str | None = None,
                   agent_id: str | None = None, pattern: str | None = None, version: str | None = None,
                   labels: Mapping[str, str] | None = None, conversation_id: str | None = None,
                   scope: Scope | str | None = None, preferred_region: str | None = None,
                   idempotent: bool = False, trace_id: str | None = None, extensions: Mapping[str, Any] | None = None,
                   envelope: Envelope | None = None, timeout_ms: int | None = None,
                   connect_timeout_ms: int | None = None, read_timeout_ms: int | None = None) -> CallResult:
        """Resolve and call an agent directly; see the module docstring for the retry rules.

        ``envelope`` sends a prepared envelope (e.g. ``incoming.child(...)``, which carries the
        trace and hop count); otherwise one is built from ``payload``/``operation``. Raises
        :class:`CallFailed` (``CallRejected``, ``CallTimeout``), :class:`NoAgentAvailable`,
        :class:`NodeUnreachable`.
        """
        settings = self.settings
        overall_s = (timeout_ms or settings.request_timeout_ms) / 1000
        deadline = self.clock() + overall_s
        if envelope is None:
            envelope = Envelope(source_agent=self.agent_id, target_agent=agent_id or pattern,
                                operation=operation or capability, payload=payload,
                                expire_at_ms=epoch_ms() + int(overall_s * 1000), idempotent=idempotent,
                                extensions=dict(extensions or {}), **({"trace_id": trace_id} if trace_id else {}))
        elif capability is None and agent_id is None and pattern is None:
            # route a prepared envelope the way the proxy would: its target, else its operation
            target = envelope.target_agent
            if target and "*" in target:
                pattern = target
            elif target:
                agent_id = target
            capability = envelope.operation if not target or pattern else None
        if conversation_id is None and isinstance(envelope.extensions.get("conversation_id"), str):
            conversation_id = envelope.extensions["conversation_id"]
        if envelope.expired():
            raise EnvelopeExpired(f"envelope {envelope.id} expired at {envelope.expire_at_ms} ms; send a new one",
                                  field="expire_at_ms")
        if envelope.hop_count >= settings.max_hops:
            raise HopLimitExceeded(f"envelope {envelope.id} already made {envelope.hop_count} hops (the limit is "
                                   f"{settings.max_hops}): a loop between agents, or a chain too long",
                                   field="hop_count")
        envelope = envelope.forwarded()  # a direct call is a hop too, so A→B→A loops end here as in the proxy
        idempotent = envelope.idempotent or idempotent
        request = self._route_request(capability=capability, agent_id=agent_id, pattern=pattern, version=version,
                                      labels=labels, conversation_id=conversation_id, scope=scope,
                                      preferred_region=preferred_region, exclude=None, trace_id=envelope.trace_id)
        timeouts = aiohttp.ClientTimeout(sock_connect=(connect_timeout_ms or settings.connect_timeout_ms) / 1000,
                                         sock_read=(read_timeout_ms or settings.read_timeout_ms) / 1000)
        max_attempts = self.retry_policy.max_attempts if idempotent else 1
        tried: list[str] = []
        tried_endpoints: set[str] = set()
        attempts: list[Attempt] = []
        queue: list[_Pick] = []
        last_error: _AttemptError | None = None
        for attempt in range(max_attempts):
            if attempt > 0:
                delay = self.retry_policy.backoff_s(attempt - 1, self.rng)
                if self.clock() + delay >= deadline:
                    raise self._timeout(envelope, attempts, overall_s)
                self.backoffs_s.append(delay)
                await self.sleep(delay)
            pick = await self._next_pick(request, queue, tried, tried_endpoints, first=attempt == 0)
            if pick is None:
                break
            tried.append(pick.target.agent_id)
            tried_endpoints.add(pick.target.endpoint)
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise self._timeout(envelope, attempts, overall_s)
            started = time.perf_counter()
            try:
                status, body, response = await self._deliver(pick.target, envelope, timeouts, remaining)
            except _AttemptError as failure:
                latency_ms = (time.perf_counter() - started) * 1000
                attempts.append(Attempt(pick.target.agent_id, pick.target.endpoint, failure.outcome, latency_ms,
                                        failure.status, str(failure)))
                self._after_attempt(pick, envelope, attempt, failure.outcome, latency_ms, failure.status,
                                    str(failure))
                if not failure.retryable:
                    raise CallRejected(f"{pick.target.agent_id} rejected {envelope.operation or 'the call'}: "
                                       f"{failure}", attempts=attempts, trace_id=envelope.trace_id,
                                       response_status=failure.status or 0, body=failure.body) from None
                last_error = failure
                self._evict(pick.target.agent_id)
                continue
            latency_ms = (time.perf_counter() - started) * 1000
            attempts.append(Attempt(pick.target.agent_id, pick.target.endpoint, Outcome.SUCCESS, latency_ms, status))
            self._after_attempt(pick, envelope, attempt, Outcome.SUCCESS, latency_ms, status, None)
            return CallResult(agent_id=pick.target.agent_id, region=pick.target.region,
                              endpoint=pick.target.endpoint, status=status, body=body, envelope=response,
                              trace_id=envelope.trace_id, request=envelope, attempts=attempts)
        why = "; ".join(f"{a.agent_id}: {a.error}" for a in attempts) or "no agent to try"
        retry_note = "" if idempotent else " (not retried: the operation is not marked idempotent)"
        raise CallFailed(f"{envelope.operation or 'call'} failed after {len(attempts)} attempt(s){retry_note}: {why}",
                         attempts=attempts, trace_id=envelope.trace_id) from last_error

    async def send(self, envelope: Envelope, *, delivery: str = "sync", version: str | None = None,
                   scope: Scope | str | None = None) -> SendResult:
        """Proxy mode: the node routes and delivers ``envelope`` itself (``POST /v1/send``).

        ``delivery="callback"`` returns at once (202); the result goes to this agent's
        registered ``callback_endpoint``. Raises the node's error (``hop_limit_exceeded``,
        ``envelope_expired``, ``delivery_failed`` …) as a :class:`NodeError`.
        """
        api = self._require_api()
        query = {"delivery": delivery}
        if version:
            query["version"] = version
        if scope:
            query["scope"] = Scope(scope).value
        url = f"{api.base_url}/v1/send"
        try:
            async with api.session.post(url, data=envelope.to_json(), params=query,
                                        headers={**api.headers, "Content-Type": "application/json"},
                                        timeout=aiohttp.ClientTimeout(
                                            total=self.settings.request_timeout_ms / 1000)) as resp:
                raw = await resp.read()
                status = resp.status
                agent = resp.headers.get("X-Reach-Agent")
                duplicate = resp.headers.get("X-Reach-Duplicate") == "true"
                is_json = resp.content_type == "application/json"
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise NodeUnreachable(f"node {api.base_url} did not answer POST /v1/send: {exc!r}") from exc
        body: Any = raw
        if is_json and raw:
            body = orjson.loads(raw)
        if status >= 400 and agent is None:
            raise node_error(status, body, what=f"POST /v1/send on {api.base_url}")
        accepted = SendAccepted.model_validate(body) if status == 202 else None
        return SendResult(status=status, body=body, envelope=_as_envelope(body), agent_id=agent,
                          duplicate=duplicate or bool(accepted and accepted.duplicate), accepted=accepted)

    # -- internals ---------------------------------------------------------------------------

    def _require_api(self) -> _NodeApi:
        if self._api is None or self.state in (ClientState.CLOSING, ClientState.CLOSED):
            raise ClientError("the client is not started: use 'async with ReachClient(...)' or await start()",
                              code="client_not_started")
        return self._api

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _route_request(self, **fields: Any) -> RouteRequest:
        data = {name: value for name, value in fields.items() if value is not None}
        if "labels" in data:
            data["labels"] = dict(data["labels"])
        try:
            return RouteRequest.model_validate(data)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            key = ".".join(str(part) for part in first["loc"]) or None
            raise ValidationFailed(f"route request {key or ''}: {first['msg']}", field=key) from exc

    async def _resolve(self, request: RouteRequest, *, fresh: bool = False) -> RouteTicket:
        key = request.model_dump_json(exclude={"exclude", "trace_id"})
        use_cache = not fresh and not request.exclude
        if use_cache:
            cached = self._tickets.get(key)
            if cached is not None and cached[1] > self.clock():
                return cached[0]
        ticket = RouteTicket.model_validate(await self._require_api().request("POST", "/v1/resolve", request))
        if not request.exclude:  # a decision that excludes agents answers one call, not the next
            lifetime_s = max(0, ticket.expires_at_ms - ticket.issued_at_ms) / 1000 * TICKET_EXPIRY_MARGIN
            if len(self._tickets) >= TICKET_CACHE_SIZE:
                now = self.clock()
                for stale in [k for k, (_, until) in self._tickets.items() if until <= now] or [next(iter(self._tickets))]:
                    self._tickets.pop(stale, None)
            self._tickets[key] = (ticket, self.clock() + lifetime_s)
        return ticket

    def _evict(self, agent_id: str) -> None:
        """Forget cached tickets whose target just failed, so the next call asks again."""
        for key in [k for k, (ticket, _) in self._tickets.items() if ticket.target.agent_id == agent_id]:
            del self._tickets[key]

    def _admits(self, agent_id: str) -> bool:
        return self.breakers.admits(agent_id, now_ms=self._now_ms())

    async def _next_pick(self, request: RouteRequest, queue: list[_Pick], tried: list[str],
                         tried_endpoints: set[str], *, first: bool) -> _Pick | None:
        """The next target: the ticket's target, then its alternates, then a fresh decision.

        Never an agent or an address already tried in this call, nor an agent whose breaker is open.
        """
        if first:
            ticket = await self._resolve(request)
            queue.extend(_Pick(ticket, target) for target in (ticket.target, *ticket.alternates))
        for _ in range(MAX_RESOLVES_PER_PICK + 1):
            while queue:
                pick = queue.pop(0)
                if (pick.target.agent_id not in tried and pick.target.endpoint not in tried_endpoints
                        and self._admits(pick.target.agent_id)):
                    self.breakers.issued(pick.target.agent_id, now_ms=self._now_ms())
                    return pick
            now = self._now_ms()
            open_breakers = [a for a in self._targets_seen if not self.breakers.admits(a, now_ms=now)]
            exclude = [*tried, *sorted(set(open_breakers) - set(tried))][:MAX_EXCLUDE]
            try:
                ticket = await self._resolve(request.model_copy(update={"exclude": exclude}), fresh=True)
            except NoAgentAvailable:
                return None
            fresh = [_Pick(ticket, target) for target in (ticket.target, *ticket.alternates)
                     if target.agent_id not in tried and target.endpoint not in tried_endpoints]
            if not fresh:
                return None
            queue.extend(fresh)
        return None

    async def _deliver(self, target: RouteTarget, envelope: Envelope, timeouts: aiohttp.ClientTimeout,
                       remaining_s: float) -> tuple[int, Any, Envelope | None]:
        session = self._session
        if session is None:
            raise ClientError("the client is closed", code="client_not_started")
        if target.transport == PASSTHROUGH:
            data, content_type = _raw_payload(envelope.payload)
        else:
            data, content_type = envelope.model_copy(update={"target_agent": target.agent_id}).to_json(), \
                "application/json"
        headers = {"Content-Type": content_type, "X-Reach-Trace-Id": envelope.trace_id,
                   "X-Reach-Envelope-Id": envelope.id}
        timeout = aiohttp.ClientTimeout(total=remaining_s, sock_connect=timeouts.sock_connect,
                                        sock_read=timeouts.sock_read)
        try:
            async with session.post(target.endpoint, data=data, headers=headers, timeout=timeout) as resp:
                raw = await resp.read()
                status = resp.status
                is_json = resp.content_type == "application/json"
        except asyncio.CancelledError:
            raise
        except TimeoutError as exc:
            raise _AttemptError(Outcome.TIMEOUT, f"timed out: {exc or 'no answer in time'}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise _AttemptError(Outcome.FAILURE, f"{type(exc).__name__}: {exc}") from exc
        body: Any = raw
        if is_json and raw:
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                body = raw
        if status == 429:
            raise _AttemptError(Outcome.REJECTED, "HTTP 429 (the target is overloaded)", status=status, body=body)
        if status >= 500 or status == 408:
            raise _AttemptError(Outcome.FAILURE, f"HTTP {status}", status=status, body=body)
        if status >= 400:
            raise _AttemptError(Outcome.SUCCESS, f"HTTP {status}: {str(body)[:200]}", status=status, body=body,
                                retryable=False)
        return status, body, (None if target.transport == PASSTHROUGH else _as_envelope(body))

    def _after_attempt(self, pick: _Pick, envelope: Envelope, attempt: int, outcome: Outcome, latency_ms: float,
                       status: int | None, error: str | None) -> None:
        self._targets_seen.add(pick.target.agent_id)
        self.breakers.record(pick.target.agent_id, outcome, now_ms=self._now_ms())
        reporter = self._reporter
        if reporter is None or not self.settings.report_outcomes:
            return
        reporter.put(OutcomeReport(signature=pick.ticket.signature, agent_id=pick.target.agent_id, outcome=outcome,
                                   latency_ms=round(latency_ms, 3)))
        if self.settings.record_traces:
            reporter.put(RouteEvent(event=RouteEventKind.DELIVERY, at_ms=epoch_ms(), trace_id=envelope.trace_id,
                                    mode="direct", caller=self.agent_id or pick.ticket.caller,
                                    envelope_id=envelope.id, agent_id=pick.target.agent_id,
                                    region=pick.target.region, endpoint=pick.target.endpoint, attempt=attempt,
                                    result=outcome.value, status=status, latency_ms=round(latency_ms, 3),
                                    detail=error[:1000] if error else None))

    def _timeout(self, envelope: Envelope, attempts: list[Attempt], overall_s: float) -> CallTimeout:
        return CallTimeout(f"{envelope.operation or 'call'} did not succeed within {overall_s:g}s "
                           f"({len(attempts)} attempt(s))", attempts=attempts, trace_id=envelope.trace_id)


def _raw_payload(payload: Any) -> tuple[bytes, str]:
    """What passthrough sends: text and bytes as they are, anything else as JSON."""
    if isinstance(payload, bytes):
        return payload, "application/octet-stream"
    if isinstance(payload, str):
        return payload.encode(), "text/plain; charset=utf-8"
    return orjson.dumps(payload), "application/json"


def _as_envelope(body: Any) -> Envelope | None:
    if not looks_like_envelope(body):
        return None
    try:
        return Envelope.model_validate(body)
    except ValidationError:
        return None


__all__ = ["Attempt", "CallFailed", "CallRejected", "CallResult", "CallTimeout", "ClientError", "ClientState",
           "EnvelopeType", "HeartbeatStats", "NodeRejected", "NodeUnreachable", "ReachClient", "RetryPolicy",
           "SendResult", "node_error"]
