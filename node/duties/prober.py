"""Active health: the region leader probes each agent's liveness and readiness URLs.

A probe is an HTTP GET; any 2xx within ``timeout_ms`` is a success — or, for a probe with
``accept: listening`` (what the node gives an agent registered from its A2A card: its interface
need not answer a GET), any answer below 500 and a server that accepted the connection but
speaks another protocol (gRPC). ``failure_threshold``
consecutive failures mark the agent not-ready (readiness) or not-live (liveness);
``success_threshold`` consecutive successes bring it back — hysteresis, so one lost packet does
not flap routing. An agent registered with a readiness probe starts not-ready and becomes ready
after its first success (alive ≠ ready). Every flip is a versioned status change in the store,
so all replicas and peer regions see it.

Probes go out under the region's egress policy (:mod:`node.trust.egress`): a probe URL the policy
denies is never connected — the probe fails with ``egress_denied`` and the reason — so probe
URLs cannot turn the leader into an open-port scanner of its own network. Redirects are not
followed (a 3xx is a failed probe) and response bodies are never read.

The leader keeps the last ``history`` results of each probe in memory (:meth:`Prober.history`,
``GET /v1/agents/{agent_id}/probes``, the console's probe chart): when, how long, and why one
failed. They are this process's, and start again when another node becomes the leader.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import aiohttp

from ..core import (NO_SPANS, TRACEPARENT, ClientTlsSettings, NodeError, SpanKind, Spans, TraceParent, cancel_and_wait,
                    now_ms)
from ..core.models import AgentRecord, ChangeEvent, ChangeKind, Probe
from ..store import RegionStore
from ..trust import DEFAULT_EGRESS_POLICY, EgressDenied, EgressPolicy, egress_denial, egress_session
from ..view import RegionCache

log = logging.getLogger(__name__)

DEFAULT_MAX_CONCURRENT_PROBES = 64
DEFAULT_PROBE_HISTORY = 30
# After connecting: the server closed or answered what is not HTTP/1.1 (a probe with accept=listening passes).
_ANSWERED_OTHERWISE = (aiohttp.ServerDisconnectedError, aiohttp.ClientResponseError, aiohttp.ClientPayloadError)
LIVENESS = "liveness"
READINESS = "readiness"


@dataclass(slots=True)
class ProbeState:
    successes: int = 0
    failures: int = 0
    probed: int = 0
    last_error: str | None = None
    registered_at_ms: int = 0
    # (at_ms, latency_ms, error or None), oldest first; kept across a re-registration
    history: deque[tuple[int, float, str | None]] = field(default_factory=deque)


class Prober:
    """Schedules and runs probes; call :meth:`run` as a leader duty.

    ``egress``: the region's policy (``NodeConfig.egress``); the default allows public addresses only.
    ``tls``: what an https probe URL is checked against (``NodeConfig`` is one: its ``ca_file``).
    ``spans``: each probe a ``probe {kind}`` span (the node's OpenTelemetry tracer, if any).
    ``history``: results kept per probe (0: none).
    """

    def __init__(self, store: RegionStore, cache: RegionCache, *,
                 max_concurrent: int = DEFAULT_MAX_CONCURRENT_PROBES,
                 egress: EgressPolicy = DEFAULT_EGRESS_POLICY, tls: ClientTlsSettings | None = None,
                 spans: Spans = NO_SPANS, history: int = DEFAULT_PROBE_HISTORY) -> None:
        self.store = store
        self.spans = spans
        self.cache = cache
        self.max_concurrent = max_concurrent
        self.history_size = history
        self.egress = egress
        self.tls = tls or ClientTlsSettings()
        self.probes_run = 0
        self.flips = 0
        self._states: dict[tuple[str, str], ProbeState] = {}
        self._heap: list[tuple[int, str, str, int]] = []
        self._wake = asyncio.Event()

    async def run(self) -> None:
        unsubscribe = self.cache.subscribe(self._on_change)
        for record in list(self.cache.index):
            self._schedule_new(record)
        semaphore = asyncio.Semaphore(self.max_concurrent)
        inflight: set[asyncio.Task[None]] = set()
        timeout = aiohttp.ClientTimeout(total=None)
        try:
            tls = self.tls.client_ssl_context()
            async with egress_session(self.egress, ssl_context=tls, timeout=timeout) as session:
                while True:
                    now = now_ms()
                    while self._heap and self._heap[0][0] <= now:
                        _, agent_id, kind, generation = heapq.heappop(self._heap)
                        record = self.cache.index.get(agent_id)
                        probe = _probe_of(record, kind)
                        state = self._states.get((agent_id, kind))
                        if state is None or state.registered_at_ms != generation:
                            continue  # superseded by a re-registration
                        if record is None or probe is None:
                            del self._states[(agent_id, kind)]
                            continue
                        await semaphore.acquire()
                        task = asyncio.create_task(self._probe(session, record, kind, probe))
                        inflight.add(task)
                        task.add_done_callback(lambda t: (inflight.discard(t), semaphore.release()))
                        heapq.heappush(self._heap, (now + probe.interval_ms, agent_id, kind, generation))
                    self._wake.clear()
                    delay = (self._heap[0][0] - now_ms()) / 1000 if self._heap else 1.0
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=max(0.005, min(delay, 1.0)))
                    except TimeoutError:
                        pass
        finally:
            unsubscribe()
            await cancel_and_wait(inflight)

    def _on_change(self, event: ChangeEvent) -> None:
        if event.kind is ChangeKind.UPSERT and event.record is not None:
            self._schedule_new(event.record)

    def _schedule_new(self, record: AgentRecord) -> None:
        for kind in (LIVENESS, READINESS):
            if _probe_of(record, kind) is None:
                continue
            state = self._states.get((record.agent_id, kind))
            if state is not None and state.registered_at_ms == record.registered_at_ms:
                continue
            kept = state.history if state is not None else deque(maxlen=self.history_size)
            self._states[(record.agent_id, kind)] = ProbeState(registered_at_ms=record.registered_at_ms, history=kept)
            heapq.heappush(self._heap, (now_ms(), record.agent_id, kind, record.registered_at_ms))
            self._wake.set()

    def last_error(self, agent_id: str, kind: str) -> str | None:
        """Why the last ``kind`` (liveness/readiness) probe of ``agent_id`` failed; None if it passed or never ran."""
        state = self._states.get((agent_id, kind))
        return None if state is None else state.last_error

    def history(self, agent_id: str) -> list[dict[str, object]]:
        """The results this process kept of ``agent_id``'s probes, newest first: ``kind``
        (liveness/readiness), ``at_ms``, ``ok``, ``latency_ms`` and ``error`` (None when it passed)."""
        found = [{"kind": kind, "at_ms": at_ms, "ok": error is None, "latency_ms": latency_ms, "error": error}
                 for kind in (LIVENESS, READINESS) if (state := self._states.get((agent_id, kind))) is not None
                 for at_ms, latency_ms, error in state.history]
        return sorted(found, key=lambda result: result["at_ms"], reverse=True)  # type: ignore[arg-type,return-value]

    async def _probe(self, session: aiohttp.ClientSession, record: AgentRecord, kind: str, probe: Probe) -> None:
        started = time.perf_counter()
        with self.spans.start(f"probe {kind}", kind=SpanKind.CLIENT, attributes={
                "gen_ai.agent.id": record.agent_id, "agent_reach.probe.kind": kind, "url.full": probe.url}) as span:
            error = await self._probe_error(session, kind, probe, span.context)
            if error is not None:
                span.fail(error)
        latency_ms = round((time.perf_counter() - started) * 1000, 1)
        self.probes_run += 1
        state = self._states.get((record.agent_id, kind))
        if state is None:
            return
        state.history.append((now_ms(), latency_ms, error))
        state.probed += 1
        if error is None:
            state.successes += 1
            state.failures = 0
        else:
            state.failures += 1
            state.successes = 0
        state.last_error = error
        await self._maybe_flip(record.agent_id, kind, probe, state)

    async def _maybe_flip(self, agent_id: str, kind: str, probe: Probe, state: ProbeState) -> None:
        record = self.cache.index.get(agent_id)
        if record is None:
            return
        healthy = record.live if kind == LIVENESS else record.ready
        # The very first success of a fresh registration makes it ready at once; afterwards the
        # success threshold applies (hysteresis).
        needed = 1 if state.probed == state.successes == 1 else probe.success_threshold
        if healthy and state.failures >= probe.failure_threshold:
            verdict = False
        elif not healthy and state.successes >= needed:
            verdict = True
        else:
            return

        def mutate(current: AgentRecord) -> AgentRecord | None:
            if (current.live if kind == LIVENESS else current.ready) == verdict:
                return None
            return current.model_copy(update={"live" if kind == LIVENESS else "ready": verdict,
                                              "probe_error": None if verdict else state.last_error})

        try:
            result = await self.store.update(agent_id, mutate, at_ms=now_ms(), known=record)
        except NodeError as exc:
            log.warning("region %s: could not record %s of %s: %s", self.store.region, kind, agent_id, exc)
            return
        if result.changed:
            self.flips += 1
            log.info("region %s: %s is now %s", self.store.region, agent_id,
                     f"{'live' if kind == LIVENESS else 'ready'}" if verdict
                     else f"{'down' if kind == LIVENESS else 'not ready'} ({state.last_error})")
            self.cache.apply_local(ChangeEvent(kind=ChangeKind.STATUS, region=self.store.region,
                                               version=result.record.version, agent_id=agent_id,
                                               at_ms=result.record.updated_at_ms, record=result.record))


    async def _probe_error(self, session: aiohttp.ClientSession, kind: str, probe: Probe,
                           context: TraceParent | None) -> str | None:
        headers = {TRACEPARENT: context.header()} if context is not None else None
        try:
            self.egress.check_url(probe.url)
            async with session.get(probe.url, timeout=aiohttp.ClientTimeout(total=probe.timeout_ms / 1000),
                                   allow_redirects=False, headers=headers) as response:
                listening = probe.accept == "listening" and response.status < 500
                if not (listening or 200 <= response.status < 300):
                    return f"{kind} probe answered HTTP {response.status}"
        except asyncio.CancelledError:
            raise
        except EgressDenied as denied:
            return f"{kind} probe not sent: egress_denied: {denied.message}"
        except TimeoutError:
            return f"{kind} probe timed out after {probe.timeout_ms} ms"
        except aiohttp.ClientError as exc:
            denied = egress_denial(exc)
            if denied is not None:
                return f"{kind} probe not sent: egress_denied: {denied.message}"
            if probe.accept == "listening" and isinstance(exc, _ANSWERED_OTHERWISE):
                return None  # connected, and the server spoke something else than HTTP/1.1 (gRPC's HTTP/2)
            return f"{kind} probe failed: {exc.__class__.__name__}: {exc}"
        return None


def _probe_of(record: AgentRecord | None, kind: str) -> Probe | None:
    if record is None:
        return None
    return record.liveness_probe if kind == LIVENESS else record.readiness_probe
