"""``ReachClient``: an agent's (or a plain caller's) connection to its region's registry node.

What it guarantees is on :mod:`node.client`'s page; the parts it composes live beside it:
``_http`` (the node's API), ``_heartbeat``, ``_session``, ``_reports``, ``_tickets``, ``_retry`` and
:mod:`node.delivery.attempts` (the attempt and the failover the proxy shares).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from ..core import (HOP_HEADER, Envelope, NoAgentAvailable, NodeError, Policy, RouteEvent, RouteEventKind,
                    SpanKind, Trace, UnknownAgent, application_spans, carried, epoch_ms)
from ..core.a2a import CardRegistration
from ..core.models import (CredentialRequest, OutcomeReport, RegisterResponse, Registration, RouteRequest, RouteTarget,
                           RouteTicket, Scope, SearchResponse, Status, compat)
from ..delivery import BreakerState, ClientBreakers, Failover, OutcomeTracker, Pacing, Sleep, Tried, deliver
from ._calls import (INCOMING, CallResult, attempt_error, call_result, conversation_of, forwarded, new_envelope,
                     prepared_route, with_incoming_hops)
from ._config import (
    TOKEN_ENV,
    URL_ENV,
    AgentConfig,
    AgentConfigError,
    ClientSettings,
    load_agent_config,
    registration_of,
    tls_context,
)
from ._errors import ClientError
from ._heartbeat import Heartbeater, HeartbeatStats, LoadCallback
from ._http import NodeApi, SendResult
from ._options import RESOLVE_OPTIONS, CallOptions, options_for
from ._registration import register_with_backoff
from ._reports import Reporter
from ._session import NodeSession
from ._tickets import TicketCache
from .verifier import CallVerifier

RESOLVE_PARAMS = {"weights": "true"}  # the targets' weights, which call() draws among (a node that predates them ignores it)
log = logging.getLogger("node.client")  # the SDK logs under one name, whichever module it is in


class ClientState(enum.Enum):
    """Where a :class:`ReachClient` is in its life; it is started once and closed once."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class ReachClient:
    """An agent's (or a plain caller's) connection to its region's registry node.

    Build it with keywords or from an agent TOML file (:class:`AgentConfig`)::

        ReachClient("http://127.0.0.1:7101", token=token, registration={...}, connect_timeout_ms=1000)
        ReachClient(config="agent.toml", load=current_load)
        ReachClient("http://127.0.0.1:7101", token=token, card=CardRegistration(...))  # an A2A agent
        ReachClient()   # $AGENT_REACH_URL and $AGENT_REACH_TOKEN

    The node URL is ``node_url``, else the config's ``[node] url``, else ``$AGENT_REACH_URL``; the
    token is ``token``, else the config's, else ``$AGENT_REACH_TOKEN``.

    Keywords beyond the named ones are :class:`ClientSettings` fields and override the file.
    ``clock`` (monotonic seconds), ``sleep`` and ``rng`` are injectable so tests can check the
    backoff and breaker without wall time; ``draw_rng`` draws which of a ticket's targets a call
    goes to first. Without a ``registration`` or ``card`` it only calls
    others.
    """

    def __init__(self, node_url: str | None = None, *, token: str | None = None,
                 registration: Registration | Mapping[str, Any] | None = None,
                 card: CardRegistration | None = None,
                 config: AgentConfig | str | Path | None = None, settings: ClientSettings | None = None,
                 load: LoadCallback | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Sleep = asyncio.sleep, rng: random.Random | None = None,
                 draw_rng: random.Random | None = None, **options: Any) -> None:
        if isinstance(config, (str, Path)):
            config = load_agent_config(config)
        self.settings = (settings or (config.client if config is not None else ClientSettings())).with_options(options)
        # what https is checked against: [client] ca_file (and a client certificate), else $AGENT_REACH_CA_FILE
        self.ssl_context = tls_context(self.settings)
        url = node_url or (config.node.url if config is not None else None) or os.environ.get(URL_ENV, "").strip()
        if not url:
            raise AgentConfigError(f"give the node URL (node_url=, [node] url in the config, or ${URL_ENV})",
                                   field="node.url")
        self.node_url = url.rstrip("/")
        self.token = (token or (config.resolve_token() if config is not None else None)
                      or os.environ.get(TOKEN_ENV, "").strip())
        if not self.token:
            raise AgentConfigError(f"give a bearer token (token=, [node] token* in the config, or ${TOKEN_ENV}; "
                                   "'agent-reach token issue' prints one)", field="node.token")
        if registration is None and config is not None:
            registration = config.agent
        if registration is not None and card is not None:
            raise AgentConfigError("give a registration or an A2A card, not both", field="card")
        self.registration: Registration | None = registration_of(registration)
        self.card = card
        self.load = load
        self.clock = clock
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.draw_rng = draw_rng or random.Random()  # which target of a ticket each call goes to first
        self.retry_policy = self.settings.retry_policy()
        self.breakers = OutcomeTracker(failure_threshold=self.settings.breaker_failures,
                                       window_ms=self.settings.breaker_window_ms,
                                       cooldown_ms=self.settings.breaker_cooldown_ms)
        self._target_breakers = ClientBreakers(self.breakers, now_ms=self._now_ms)  # on this client's clock
        self.state = ClientState.NEW
        self.registered: RegisterResponse | None = None
        self.backoffs_s: list[float] = []  # every wait call() slept, in order (observability and tests)
        self._status: Status | None = None
        self._session: aiohttp.ClientSession | None = None
        self._api: NodeApi | None = None
        self._heartbeater: Heartbeater | None = None
        self._reporter: Reporter | None = None
        self._tickets = TicketCache(clock=clock, reuse_ms=self.settings.ticket_reuse_ms,
                                    pushed_reuse_ms=self.settings.session_ticket_reuse_ms)
        self._node_session: NodeSession | None = None  # the process's, shared with its other clients
        self._unfollow: Callable[[], None] = lambda: None  # the tickets stop following its pushes

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
        """Open the session; with a registration or card, register (with backoff) and start heartbeats."""
        if self.state is not ClientState.NEW:
            return
        self.state = ClientState.STARTING
        try:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl_context))
            self._api = NodeApi(self._session, self.node_url, self.token,
                                timeout_s=self.settings.node_timeout_ms / 1000)
            self._reporter = Reporter(self._api, batch_size=self.settings.report_batch_size,
                                      flush_interval_s=self.settings.report_flush_interval_ms / 1000,
                                      queue_limit=self.settings.report_queue_limit,
                                      flush_timeout_s=2 * self.settings.node_timeout_ms / 1000)
            self._reporter.start()
            if self.settings.session:
                self._node_session = NodeSession.acquire(self.node_url, token=self.token, ssl_context=self.ssl_context)
                self._unfollow = self._tickets.follow(self._node_session, asyncio.get_running_loop())
            if self.registration is not None or self.card is not None:
                await self.register()
        except BaseException:
            await self.aclose()
            raise
        self.state = ClientState.RUNNING

    async def register(self) -> RegisterResponse:
        """Register (retrying until the node answers) and make sure heartbeats run."""
        agent_id = self.agent_id
        if agent_id is None:
            raise AgentConfigError("this client has no registration", field="agent")
        api = self._require_api()
        max_wait = self.settings.register_max_wait_ms
        self.registered = await register_with_backoff(
            lambda: self._register_on(api, self._status), agent_id=agent_id, policy=self.retry_policy,
            rng=self.rng, sleep=self.sleep, clock=self.clock, max_wait_s=None if max_wait is None else max_wait / 1000,
            stopping=lambda: self.state in (ClientState.CLOSING, ClientState.CLOSED))
        if self._node_session is not None:
            self._node_session.join(agent_id, self.token)
        if self._heartbeater is None:
            interval_ms = self.settings.heartbeat_interval_ms or self.registered.heartbeat_interval_ms
            self._heartbeater = Heartbeater(
                base_url=self.node_url, token=self.token, agent_id=agent_id, reregister=self._register_on,
                interval_s=interval_ms / 1000, node_timeout_s=min(self.settings.node_timeout_ms, interval_ms) / 1000,
                policy=self.retry_policy, load=self.load, status=lambda: self._status, rng=self.rng,
                load_interval_s=(self.settings.load_report_interval_ms or 0) / 1000 or None,
                ssl_context=self.ssl_context, session=self._node_session)
            if self.settings.heartbeat_in_thread:
                self._heartbeater.start_thread()
            else:
                self._heartbeater.start_task()
        return self.registered

    async def register_card(self, card: CardRegistration) -> RegisterResponse:
        """Register an agent from its A2A card once: no heartbeats, no deregistration at close.

        For a one-shot registration whose lease something else renews (or lets lapse); give
        ``card=`` to the constructor instead to keep the agent registered while the client runs.
        """
        return await self._require_api().register_card(card)

    async def _register_on(self, api: NodeApi, status: Status | None) -> RegisterResponse:
        """One registration request through ``api`` (the heartbeat thread has its own)."""
        if self.card is not None:
            return await api.register_card(self.card)
        if self.registration is None:
            raise AgentConfigError("this client has no registration", field="agent")
        registration = self.registration
        if status is not None:
            registration = registration.model_copy(update={"status": status})
        return await api.register(registration)

    async def aclose(self) -> None:
        """Stop heartbeats, flush reports, deregister, close the session. Idempotent."""
        if self.state in (ClientState.CLOSING, ClientState.CLOSED):
            return
        self.state = ClientState.CLOSING
        try:
            if self._heartbeater is not None:
                await self._heartbeater.stop()
            if self._node_session is not None and self.registered is not None and self.agent_id is not None:
                await self._node_session.leave(self.agent_id)  # a clean leave: the node marks nothing
            if self._reporter is not None:
                await self._reporter.aclose()
            agent_id = self.agent_id
            if self.registered is not None and agent_id is not None and self._api is not None:
                try:
                    await self._api.deregister(agent_id)
                except UnknownAgent:
                    pass
                except NodeError as exc:
                    log.warning("could not deregister %s (its lease will lapse instead): %s", agent_id, exc.message)
        finally:
            self._unfollow()
            if self._node_session is not None:
                await self._node_session.release()
            if self._session is not None:
                await self._session.close()
            self.state = ClientState.CLOSED

    # -- status and observability ------------------------------------------------------------

    @property
    def agent_id(self) -> str | None:
        if self.registration is not None:
            return self.registration.agent_id
        return self.card.agent_id if self.card is not None else None

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

    @property
    def reports_dropped(self) -> int:
        """Outcome reports and route events not delivered: shed when the queue was full, or refused."""
        return self._reporter.dropped if self._reporter is not None else 0

    def set_status(self, status: Status | None, *, push: bool = True) -> None:
        """The status heartbeats carry from now on (thread-safe); ``push`` sends one at once."""
        self._status = status
        if push and self._heartbeater is not None:
            self._heartbeater.wake()

    def breaker_state(self, agent_id: str) -> BreakerState:
        """This client's breaker for one target."""
        return self._target_breakers.state(agent_id)

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
        return compat.read_python(Policy, await self._require_api().request("GET", "/v1/policy"))

    async def trace(self, trace_id: str) -> Trace:
        """One trace (``GET /v1/traces/{id}``): the node's decisions, deliveries and outcomes this client took part
        in and the deliveries it posted itself, by time; never another caller's posts."""
        return compat.read_python(Trace, await self._require_api().request("GET", f"/v1/traces/{quote(trace_id)}"))

    async def resolve(self, capability: str | None = None, *, agent_id: str | None = None,
                      pattern: str | None = None, tags: list[str] | None = None, exclude: list[str] | None = None,
                      fresh: bool = False, options: CallOptions | None = None, **overrides: Any) -> RouteTicket:
        """A route ticket, from the cache while it is valid (``fresh`` or ``exclude`` skip the cache).

        Routed by ``options`` (:class:`CallOptions`; the same object as ``call()``'s routes the same
        way and shares its cached ticket) with its routing fields as keyword ``overrides``
        (``version=``, ``labels=``, ``scope=``, ``preferred_region=``, ``semantic=``,
        ``conversation_id=``, ``trace_id=``); its delivery fields are not resolve()'s.
        ``semantic=False``: no semantic fallback, only an agent with the capability by name
        (default: the ``semantic`` client setting, true). ``tags``: only an agent whose capability
        (an A2A skill) carries them all; alone, any such agent. The ticket's target carries its route
        credential and, for an A2A agent, its ``binding``; ``ticket.match`` says how it was found. Raises
        :class:`NoAgentAvailable` (with the node's reason per stage), :class:`NodeUnreachable`, and
        :class:`ValidationFailed` for a bad or unknown option.
        """
        options = options_for("resolve", options, overrides, takes=RESOLVE_OPTIONS)
        request = options.route_request(capability=capability, agent_id=agent_id, pattern=pattern, tags=tags,
                                        exclude=exclude, trace_id=options.trace_id,
                                        client_semantic=self.settings.semantic)
        return await self._resolve(request, fresh=fresh)

    async def search(self, query: str, *, k: int | None = None, scope: Scope | str | None = None,
                     routable: bool = False) -> SearchResponse:
        """Agents for a plain-language description, best first (``GET /v1/search``).

        ``scope`` defaults to ``global`` (every region); ``routable=True`` keeps only agents the
        router would consider now. Each hit says its agent, region, the capability that matched
        (``None``: the description did) and its score. Raises :class:`ValidationFailed` for an
        empty query, :class:`NodeError` (``search_unavailable``) when the node has no search.
        """
        params: dict[str, str] = {"q": query}
        if k is not None:
            params["k"] = str(k)
        if scope is not None:
            params["scope"] = Scope(scope).value
        if routable:
            params["routable"] = "true"
        return compat.read_python(SearchResponse, await self._require_api().request("GET", "/v1/search", params=params))

    def call_verifier(self, **options: Any) -> CallVerifier:
        """A :class:`CallVerifier` for this client's agent (its id and ``allowed_callers``), on its node.

        ``options`` are CallVerifier keywords (``leeway_s``, ``cache_ttl_s`` …). Close it after use.
        """
        if self.registration is None:
            raise AgentConfigError("call_verifier() needs this client's registration (the agent being called)",
                                   field="agent")
        return CallVerifier(self.node_url, agent_id=self.registration.agent_id,
                            allowed_callers=self.registration.allowed_callers,
                            **{"ssl_context": self.ssl_context, **options})

    # -- calls -------------------------------------------------------------------------------

    async def call(self, capability: str | None = None, payload: Any = None, *, idempotent: bool = False,
                   options: CallOptions | None = None, envelope: Envelope | None = None,
                   agent_id: str | None = None, pattern: str | None = None, **overrides: Any) -> CallResult:
        """Resolve and call an agent directly; :mod:`node.delivery.attempts` has the retry rules.

        ``capability`` routes the call (an agent offering it by name; else, unless
        ``semantic=False``, the semantic fallback reads it as plain language), or ``agent_id`` or
        ``pattern`` name the agent; ``payload`` is the business data. Only idempotent calls are
        retried: ``idempotent=True``, or options or an envelope marked so. ``options``
        (:class:`CallOptions`) route and deliver the call (version, labels, scope, timeouts,
        ``operation`` — what the agent dispatches on, default the capability — …); keyword
        ``overrides`` are its fields, on top of it for this call. The target gets the envelope with
        ``Authorization: Bearer <route credential>``; the result says who answered and how it was
        found (``result.match``). A call never goes to the calling agent itself. ``envelope`` sends
        a prepared envelope (e.g. ``incoming.child(...)``, which carries the trace and hop count)
        instead of building one. Raises :class:`CallFailed` (``CallRejected``, ``CallTimeout``),
        :class:`NoAgentAvailable`, :class:`NodeUnreachable`, and before sending
        :class:`HopLimitExceeded`, :class:`EnvelopeExpired` or :class:`ValidationFailed` (a bad or
        unknown option).
        """
        options = options_for("call", options, overrides)
        settings = options.delivery_settings(self.settings)
        overall_s = settings.request_timeout_ms / 1000
        deadline = self.clock() + overall_s
        idempotent = idempotent or options.idempotent
        if envelope is None:
            envelope = new_envelope(options, source_agent=self.agent_id, target_agent=agent_id or pattern,
                                    capability=capability, payload=payload, idempotent=idempotent,
                                    expire_at_ms=epoch_ms() + int(overall_s * 1000))
        elif capability is None and agent_id is None and pattern is None:
            capability, agent_id, pattern = prepared_route(envelope)
        with application_spans().invoke_agent(envelope, kind=SpanKind.CLIENT) as span:  # when the program traces
            envelope = carried(forwarded(with_incoming_hops(envelope), max_hops=settings.max_hops),
                               span.context)
            idempotent = envelope.idempotent or idempotent
            request = options.route_request(capability=capability, agent_id=agent_id, pattern=pattern,
                                            trace_id=envelope.trace_id,
                                            conversation_id=conversation_of(envelope, options),
                                            client_semantic=settings.semantic)
            delivery = await deliver(
                envelope, Failover(request, resolve=self._resolve, breakers=self._target_breakers, issue=self._issue,
                                   draw=self.draw_rng),
                session=self._open_session, limits=settings.attempt_limits(owner="this client's"), deadline=deadline,
                pacing=Pacing(self.retry_policy, self.rng, clock=self.clock, sleep=self._backoff),
                max_attempts=settings.max_attempts if idempotent else 1,
                on_attempt=lambda tried: self._after_attempt(envelope, tried))
            result = call_result(envelope, delivery, idempotent=idempotent, overall_s=overall_s)
            span.set("gen_ai.agent.id", result.agent_id)
            span.set("agent_reach.attempts", len(result.attempts))
            return result

    async def send(self, envelope: Envelope, *, delivery: str = "sync", version: str | None = None,
                   scope: Scope | str | None = None, options: CallOptions | None = None) -> SendResult:
        """Proxy mode: the node routes and delivers ``envelope`` itself (``POST /v1/send``).

        ``delivery="callback"`` returns at once (202); the result goes to this agent's
        registered ``callback_endpoint``. The node routes by ``version`` and ``scope`` (keywords,
        on top of ``options``'); ``options`` that ask for more (labels, a region, a conversation,
        no semantic fallback) raise :class:`ValidationFailed` rather than be dropped, and its
        delivery and envelope fields are the node's and the envelope's here. Raises the node's
        error (``hop_limit_exceeded``, ``envelope_expired``, ``delivery_failed`` …) as a
        :class:`NodeError`. Sent from an :class:`AgentHost` handler, the envelope carries at least
        the hop count of the delivery being handled, and the node's stamp of it goes back
        (``X-Reach-Hop``): a fresh envelope does not restart a loop's count.
        """
        given = {name: value for name, value in (("version", version), ("scope", scope)) if value}
        query = {"delivery": delivery, **options_for("send", options, given).proxy_query()}
        timeout_s = self.settings.request_timeout_ms / 1000
        api = self._require_api()
        incoming = INCOMING.get()  # sent from a handler: the node's stamp of what it handles goes back
        stamp = {HOP_HEADER: incoming.stamp} if incoming is not None and incoming.stamp else {}
        with application_spans().invoke_agent(envelope, kind=SpanKind.CLIENT) as span:  # when the program traces
            result = await api.send(carried(with_incoming_hops(envelope), span.context), query=query,
                                    timeout_s=timeout_s, headers=stamp)
            span.set("gen_ai.agent.id", result.agent_id)
            if result.status >= 400:
                span.fail(f"the agent answered {result.status}")
            return result

    # -- internals ---------------------------------------------------------------------------

    def _require_api(self) -> NodeApi:
        if self._api is None or self.state in (ClientState.CLOSING, ClientState.CLOSED):
            raise ClientError("the client is not started: use 'async with ReachClient(...)' or await start()",
                              code="client_not_started")
        return self._api

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def _resolve(self, request: RouteRequest, *, fresh: bool = False) -> RouteTicket:
        if not fresh and not request.exclude:
            cached = self._tickets.get(request)
            if cached is not None:
                return cached
        try:
            answer = await self._require_api().request("POST", "/v1/resolve", request, params=RESOLVE_PARAMS)
        except NoAgentAvailable:
            if not request.exclude:  # the node knows nobody for this request: a cached ticket is stale
                self._tickets.drop(request)
            raise
        ticket = compat.read_python(RouteTicket, answer)
        if not request.exclude:  # a decision that excludes agents answers one call, not the next
            self._tickets.put(request, ticket)
        return ticket

    async def _issue(self, ticket: RouteTicket, target: RouteTarget) -> str:
        """The route credential of one of ``ticket``'s alternates (``POST /v1/credentials``)."""
        request = CredentialRequest(signature=ticket.signature, agent_id=target.agent_id)
        return (await self._require_api().credential(request)).credential

    def _open_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise ClientError("the client is closed", code="client_not_started")
        return self._session

    async def _backoff(self, seconds: float) -> None:
        self.backoffs_s.append(seconds)
        await self.sleep(seconds)

    def _after_attempt(self, envelope: Envelope, tried: Tried) -> None:
        """The outcome sink: this client's breaker, the tickets, and the node's reports and trace."""
        target, ticket = tried.pick.target, tried.pick.ticket
        self._target_breakers.record(target.agent_id, tried.outcome)
        if tried.failure is not None:
            self._tickets.evict(target.agent_id)
        reporter = self._reporter
        if reporter is None or not self.settings.report_outcomes:
            return
        reporter.put(OutcomeReport(signature=ticket.signature, agent_id=target.agent_id, outcome=tried.outcome,
                                   latency_ms=round(tried.latency_ms, 3)))
        if self.settings.record_traces:
            error = attempt_error(tried)
            reporter.put(RouteEvent(event=RouteEventKind.DELIVERY, at_ms=epoch_ms(), trace_id=envelope.trace_id,
                                    mode="direct", caller=self.agent_id or ticket.caller, envelope_id=envelope.id,
                                    agent_id=target.agent_id, region=target.region, endpoint=target.endpoint,
                                    attempt=tried.index, result=tried.outcome.value, status=tried.status,
                                    latency_ms=round(tried.latency_ms, 3), detail=error[:1000] if error else None))

__all__ = ["CallResult", "ClientState", "ReachClient"]
