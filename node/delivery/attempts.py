"""Delivering an envelope: ONE attempt at one target, and ONE failover across targets.

The SDK's direct calls (``ReachClient.call``) and the node's proxy mode (``POST /v1/send``,
:mod:`node.http.proxy`) both deliver through :func:`deliver`. They differ only in what they pass in:

================  ===========================================  ==========================================
                  SDK (``ReachClient.call``)                   proxy (``node.proxy``)
================  ===========================================  ==========================================
tickets           ``POST /v1/resolve``; the first one from     ``RegistryNode.resolve`` in process
                  the client's ticket cache
alternates'       ``POST /v1/credentials``                     ``RegistryNode.issue_credential``
credentials
HTTP session      the client's                                 the egress-checked one, plus an
                                                               :class:`EgressGuard` for the static checks
breakers          the client's own (:class:`Breakers`)         none here: the router that made the
                                                               ticket applied the region's breakers
outcome sink      its breaker, batched ``/v1/reports`` and     ``RegistryNode.report`` and the trace log
                  direct-call trace events
answer-size cap   ``max_response_bytes``, 64 MiB by default    ``proxy.max_response_bytes``, 4 MiB
a 4xx answer      raised as ``CallRejected``                   passed through to the proxy's caller
================  ===========================================  ==========================================

The decisions, written once:

* **What an answer means.** 2xx: delivered. A 4xx other than 408 and 429: the target judged the
  request itself wrong — a final answer, *not retried* (another agent would judge it the same
  way) and a success for the breaker (the target works); :attr:`End.REJECTED` hands it to the
  caller, which raises or passes it on (table above). 429: overloaded — outcome ``rejected``
  (lowers the weight, never trips a breaker), tried elsewhere. 408, 5xx, a 3xx, a connection
  error, an egress denial, an answer over the cap: ``failure``; no answer in time: ``timeout``;
  both tried elsewhere.
* **Only idempotent envelopes are tried more than once** (the caller passes ``max_attempts=1``
  otherwise): a non-idempotent operation that failed may still have run.
* **Which target first.** With ``draw`` (the SDK) and no ``conversation_id``, each delivery draws
  its first target among the ticket's targets that carry a weight (``?weights=true``: the target
  and the alternates of its level) in proportion to it, among those the caller's breakers admit:
  a cached ticket spreads calls over its targets instead of pinning one for its lifetime, and since
  the node drew them as Midzuno's sample, each agent gets its weight's share over many tickets. A
  conversation keeps the ticket's target (the node pinned it by rendezvous hashing) while it works.
* **What is tried, in order.** The first target, the ticket's other targets, then fresh decisions (at
  most ``MAX_RESOLVES_PER_PICK + 1`` per attempt) that exclude every agent tried, every agent
  behind an address tried and, when the caller keeps breakers, every agent they hold open.
  Untried agents and addresses first (two agents behind one address are one failure), never an
  agent the caller's breaker does not admit. **When nobody untried is left** — the only instance
  died — the next attempt, after its backoff, asks for a decision again *without* excluding what
  was tried, so an instance restarted within the deadline is reached (the breakers, fed by the
  failures, still keep out an agent that keeps failing). The first decision's error is raised; a
  later decision that fails (the node unreachable, nobody at all) ends the failover with what
  was tried (:attr:`Delivery.decision_error` keeps why).
* **Waits and budget.** Before retry *n* the policy's ``backoff_s(n - 1)``; a wait that would
  pass the deadline ends the delivery as :attr:`End.TIMED_OUT`, and so does a deadline passed
  before an attempt. Each attempt's total timeout is what remains of the deadline, with the
  connect and read timeouts of :class:`AttemptLimits` inside it.
* **What is sent.** A target whose ticket names an A2A binding gets an A2A request in it
  (:mod:`node.delivery.a2a_wire`: JSON-RPC ``SendMessage``/``message/send``, or HTTP+JSON
  ``message:send``), and a JSON-RPC error in a 2xx answer is a ``failure``; a binding the SDK
  does not speak (GRPC) raises :class:`~node.delivery.a2a_wire.UnsupportedBinding` before sending.
  Envelope transports get the envelope with ``target_agent`` set to the agent
  tried; ``passthrough`` targets get the raw payload. Headers: ``Authorization: Bearer <route
  credential>`` (the target's, from the ticket; an alternate's is issued when it is picked, by
  the caller's ``issue``), ``Content-Type``, ``X-Reach-Trace-Id``, ``X-Reach-Envelope-Id`` and
  ``X-Reach-Hop-Count`` — the envelope's hop count as sent, i.e. already counting this hop (the
  caller forwards the envelope first).
* **Redirects are never followed.** A 3xx fails the attempt: following it would re-send the body
  to an address nobody registered and no egress policy judged. Register the final URL.
* **Answers are bounded.** The body is counted as it arrives; past ``max_response_bytes`` the
  attempt fails and the connection is closed instead of read on.

The outcome of each attempt goes to ``on_attempt`` as soon as it is known (a :class:`Tried`),
so breakers and reports see a failure before the next pick — also by concurrent calls.
"""

from __future__ import annotations

import asyncio
import enum
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import orjson

from ..core import (PASSTHROUGH, TRACEPARENT, BodyTooLarge, Envelope, NoAgentAvailable, NodeError, TraceParent,
                    raw_payload, read_bounded)
from ..core.models import Outcome, RouteRequest, RouteTarget, RouteTicket
from .a2a_wire import A2A_JSON_TYPES, UnsupportedBinding, a2a_request, jsonrpc_result
from .retry import RetryPolicy, Sleep

MAX_RESOLVES_PER_PICK = 3
MAX_EXCLUDE = 64  # RouteRequest.exclude's limit
REDIRECT_ADVICE = "the reach layer never follows redirects (register the final URL)"


# -- one attempt -----------------------------------------------------------------------------


class AttemptError(Exception):
    """One attempt failed: its outcome for breakers and reports; another agent may be tried.

    ``denied`` is the egress guard's error when the policy refused the address.
    """

    def __init__(self, outcome: Outcome, message: str, *, status: int | None = None,
                 denied: NodeError | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.status = status
        self.denied = denied


Stamp = Callable[[RouteTarget], dict[str, str]]
"""Headers of the sender's own for one target (the proxy's ``X-Reach-Hop``, ``node.http.proxy.hops``)."""


class EgressGuard(Protocol):
    """What the caller may dial; the proxy's wraps its region's ``EgressPolicy``."""

    def check_url(self, url: str) -> None:
        """Raise a :class:`NodeError` if ``url`` may not be dialled (no DNS: the static half)."""

    def denial(self, exc: BaseException) -> NodeError | None:
        """The guard's refusal behind a connection error (its session's connector), if it was one."""


@dataclass(frozen=True, slots=True)
class AttemptLimits:
    """Time and size limits of one attempt; ``owner`` names whose cap it is in messages."""

    connect_timeout_s: float
    read_timeout_s: float
    max_response_bytes: int
    owner: str = "the client's"


@dataclass(slots=True)
class TargetAnswer:
    """What a target answered (2xx or a final 4xx), as it came."""

    status: int
    content_type: str  # the Content-Type header ("application/octet-stream" when absent)
    body: bytes
    is_json: bool

    @property
    def rejected(self) -> bool:
        """A 4xx: the target refused the request itself (final, not retried)."""
        return 400 <= self.status < 500

    def decoded(self) -> Any:
        """The body as JSON when it is declared and parses as JSON, else the bytes."""
        if self.is_json and self.body:
            try:
                return orjson.loads(self.body)
            except orjson.JSONDecodeError:
                return self.body
        return self.body


async def attempt(session: aiohttp.ClientSession, target: RouteTarget, envelope: Envelope, *,
                  remaining_s: float, limits: AttemptLimits, guard: EgressGuard | None = None,
                  stamp: Stamp | None = None) -> TargetAnswer:
    """POST ``envelope`` (or its raw payload) to ``target`` once; see the module docstring.

    ``remaining_s`` caps the whole attempt; ``stamp`` adds headers of the sender's for ``target``
    (the proxy's hop stamp). Returns a 2xx or 4xx answer; raises
    :class:`AttemptError` for everything that should be tried elsewhere.
    """
    wire = a2a_request(target, envelope)  # raises UnsupportedBinding before anything is sent
    url = target.endpoint if wire is None else wire.url
    if wire is not None:
        data, content_type = wire.body, "application/json"
    elif target.transport == PASSTHROUGH:
        data, content_type = raw_payload(envelope.payload)
    else:
        data = envelope.model_copy(update={"target_agent": target.agent_id}).to_json()
        content_type = "application/json"
    headers = {"Content-Type": content_type, "X-Reach-Trace-Id": envelope.trace_id,
               "X-Reach-Envelope-Id": envelope.id, "X-Reach-Hop-Count": str(envelope.hop_count),
               **(wire.headers if wire is not None else {})}
    context = TraceParent.parse(envelope.extensions.get(TRACEPARENT))  # W3C trace context, for the agent's tracer
    if context is not None:
        headers[TRACEPARENT] = context.header()
    if target.credential is not None:
        headers["Authorization"] = f"Bearer {target.credential}"
    if stamp is not None:
        headers.update(stamp(target))
    timeout = aiohttp.ClientTimeout(total=remaining_s, sock_connect=limits.connect_timeout_s,
                                    sock_read=limits.read_timeout_s)
    if guard is not None:
        try:
            guard.check_url(target.endpoint)
        except NodeError as denied:
            raise AttemptError(Outcome.FAILURE, f"{denied.code}: {denied.message}", denied=denied) from denied
    try:
        async with session.post(url, data=data, headers=headers, timeout=timeout,
                                allow_redirects=False) as response:
            status = response.status
            if 300 <= status < 400:
                raise AttemptError(Outcome.FAILURE, f"HTTP {status}: the target answered a redirect"
                                   f"{_location(response)}; {REDIRECT_ADVICE}", status=status)
            body = await read_bounded(response, limits.max_response_bytes)
            answer = TargetAnswer(status, response.headers.get("Content-Type", "application/octet-stream"), body,
                                  response.content_type in (A2A_JSON_TYPES if wire else ("application/json",)))
    except asyncio.CancelledError:
        raise
    except BodyTooLarge as exc:
        raise AttemptError(Outcome.FAILURE, f"the answer exceeds {limits.owner} limit of "
                           f"{limits.max_response_bytes} bytes (max_response_bytes); send large results by "
                           "reference") from exc
    except TimeoutError as exc:
        raise AttemptError(Outcome.TIMEOUT, f"timed out: {exc or 'no answer in time'}") from exc
    except (aiohttp.ClientError, OSError) as exc:
        denied = guard.denial(exc) if guard is not None else None
        if denied is not None:
            raise AttemptError(Outcome.FAILURE, f"{denied.code}: {denied.message}", denied=denied) from exc
        raise AttemptError(Outcome.FAILURE, f"{type(exc).__name__}: {exc}") from exc
    if status == 429:
        raise AttemptError(Outcome.REJECTED, "HTTP 429 (the target is overloaded)", status=status)
    if status >= 500 or status == 408:
        raise AttemptError(Outcome.FAILURE, f"HTTP {status}", status=status)
    if wire is not None and target.binding == "JSONRPC" and not answer.rejected:
        result, why = jsonrpc_result(answer.body)
        if result is None:  # a JSON-RPC error is a failure, whatever the HTTP status said
            raise AttemptError(Outcome.FAILURE, f"HTTP {status} with {why}", status=status)
        answer = TargetAnswer(status, "application/json", result, True)
    return answer


def _location(response: aiohttp.ClientResponse) -> str:
    location = response.headers.get("Location")
    return f" to {location[:200]!r}" if location else ""


# -- the failover order ----------------------------------------------------------------------


class Resolve(Protocol):
    """A route ticket for ``request``; ``fresh`` is False only for a delivery's first decision."""

    def __call__(self, request: RouteRequest, *, fresh: bool) -> Awaitable[RouteTicket]: ...


class Issue(Protocol):
    """The route credential of ``target``, one of ``ticket``'s alternates (the target's came with it)."""

    def __call__(self, ticket: RouteTicket, target: RouteTarget) -> Awaitable[str]: ...


class Breakers(Protocol):
    """A caller's own breakers: which targets they admit now, and which they hold open."""

    def admits(self, agent_id: str) -> bool: ...

    def issued(self, agent_id: str) -> None: ...

    def open_agents(self) -> list[str]: ...


@dataclass(slots=True)
class Pick:
    """One attempt's target and the ticket it came from (whose signature the outcome report carries)."""

    ticket: RouteTicket
    target: RouteTarget


class Failover:
    """The targets of one delivery, in the order the module docstring gives."""

    def __init__(self, request: RouteRequest, *, resolve: Resolve, breakers: Breakers | None = None,
                 issue: Issue | None = None, draw: random.Random | None = None) -> None:
        self.request = request
        self.tried: list[str] = []
        self.tried_endpoints: set[str] = set()
        self.decision_error: NodeError | None = None  # why a later decision found nobody
        self._resolve = resolve
        self._breakers = breakers
        self._issue = issue
        self._draw = None if request.conversation_id else draw
        self._queue: list[Pick] = []
        self._behind_tried_endpoints: set[str] = set()  # agents skipped: their address failed already
        self._started = False

    async def next(self) -> Pick | None:
        """The next target to try, or ``None`` when nobody is left; raises the first decision's error."""
        if not self._started:
            self._started = True
            ticket = await self._resolve(self.request, fresh=False)
            self._queue.extend(Pick(ticket, target) for target in self._first_drawn(ticket))
        for _ in range(MAX_RESOLVES_PER_PICK + 1):
            while self._queue:
                pick = self._queue.pop(0)
                if self._untried(pick.target) and self._admits(pick.target.agent_id):
                    chosen = await self._chosen(pick)
                    if chosen is not None:
                        return chosen
            # Next decision: without the agents tried, those behind a tried address, those held open.
            skipped = sorted(self._behind_tried_endpoints - set(self.tried))
            exclude = list(dict.fromkeys([*self.tried, *skipped, *self._held_open()]))[:MAX_EXCLUDE]
            try:
                ticket = await self._resolve(self.request.model_copy(update={"exclude": exclude}), fresh=True)
            except NoAgentAvailable as exc:
                return await self._again(exc) if self.tried else self._none_left(exc)
            except NodeError as exc:
                return self._none_left(exc)
            self._queue.extend(Pick(ticket, target) for target in (ticket.target, *ticket.alternates)
                               if self._untried(target))
        return None

    async def _again(self, nobody_untried: NoAgentAvailable) -> Pick | None:
        """Nobody untried is left: decide again without excluding the agents tried (a sole
        instance that died may be back), keeping out only what the breakers hold open."""
        held_open = sorted(self._breakers.open_agents()) if self._breakers is not None else []
        try:
            ticket = await self._resolve(self.request.model_copy(update={"exclude": held_open[:MAX_EXCLUDE]}),
                                         fresh=True)
        except NodeError as exc:
            return self._none_left(nobody_untried if isinstance(exc, NoAgentAvailable) else exc)
        for target in (ticket.target, *ticket.alternates):
            if self._admits(target.agent_id):
                chosen = await self._chosen(Pick(ticket, target))
                if chosen is not None:
                    return chosen
        return self._none_left(nobody_untried)

    async def _chosen(self, pick: Pick) -> Pick | None:
        """``pick`` with its route credential, counted as tried; None if no credential could be had."""
        if pick.target.credential is None and self._issue is not None:
            try:
                credential = await self._issue(pick.ticket, pick.target)
            except NodeError as exc:
                self.decision_error = exc
                return None
            pick = Pick(pick.ticket, pick.target.model_copy(update={"credential": credential}))
        if self._breakers is not None:
            self._breakers.issued(pick.target.agent_id)
        if pick.target.agent_id not in self.tried:
            self.tried.append(pick.target.agent_id)
        self.tried_endpoints.add(pick.target.endpoint)
        return pick

    def _first_drawn(self, ticket: RouteTicket) -> list[RouteTarget]:
        """The ticket's targets in order, the one drawn by weight (see the module docstring) first."""
        targets = [ticket.target, *ticket.alternates]
        if self._draw is None:
            return targets
        weighted = [(position, target.weight) for position, target in enumerate(targets)
                    if target.weight is not None and target.weight > 0 and self._admits(target.agent_id)]
        total = sum(weight for _, weight in weighted)
        if len(weighted) < 2 or total <= 0:
            return targets
        remaining = self._draw.random() * total
        chosen = weighted[-1][0]
        for position, weight in weighted:
            remaining -= weight
            if remaining < 0:
                chosen = position
                break
        return [targets[chosen], *targets[:chosen], *targets[chosen + 1:]]

    def _none_left(self, why: NodeError) -> None:
        self.decision_error = why
        return None

    def _held_open(self) -> list[str]:
        return sorted(set(self._breakers.open_agents()) - set(self.tried)) if self._breakers else []

    def _untried(self, target: RouteTarget) -> bool:
        if target.agent_id in self.tried:
            return False
        if target.endpoint in self.tried_endpoints:
            self._behind_tried_endpoints.add(target.agent_id)
            return False
        return True

    def _admits(self, agent_id: str) -> bool:
        return self._breakers is None or self._breakers.admits(agent_id)


# -- the delivery loop -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pacing:
    """The waits between attempts and the clock the deadline is on (monotonic seconds)."""

    policy: RetryPolicy
    rng: random.Random
    clock: Callable[[], float] = time.monotonic
    sleep: Sleep = asyncio.sleep


class End(enum.Enum):
    """How a delivery ended."""

    DELIVERED = "delivered"  # a 2xx answer
    REJECTED = "rejected"    # a 4xx answer: final, not retried
    EXHAUSTED = "exhausted"  # every allowed attempt failed, or nobody was left to try
    TIMED_OUT = "timed_out"  # the deadline passed, or a wait would have passed it


@dataclass(slots=True)
class Tried:
    """One attempt: at whom, how it went; ``failure`` or ``answer`` says what came back."""

    pick: Pick
    index: int  # 0 for the first attempt
    outcome: Outcome
    latency_ms: float
    status: int | None
    failure: AttemptError | None = None
    answer: TargetAnswer | None = None


@dataclass(slots=True)
class Delivery:
    """What :func:`deliver` did: how it ended and every attempt, in order."""

    end: End
    tried: list[Tried] = field(default_factory=list)
    decision_error: NodeError | None = None

    @property
    def answered(self) -> Tried | None:
        """The attempt that got the answer (DELIVERED or REJECTED), else None."""
        return self.tried[-1] if self.end in (End.DELIVERED, End.REJECTED) else None

    @property
    def last_failure(self) -> AttemptError | None:
        failures = [tried.failure for tried in self.tried if tried.failure is not None]
        return failures[-1] if failures else None


async def deliver(envelope: Envelope, failover: Failover, *, session: Callable[[], aiohttp.ClientSession],
                  limits: AttemptLimits, pacing: Pacing, max_attempts: int, deadline: float,
                  on_attempt: Callable[[Tried], None], guard: EgressGuard | None = None,
                  stamp: Stamp | None = None) -> Delivery:
    """Deliver ``envelope`` (already forwarded: its hop counted) to the targets ``failover`` picks.

    ``deadline`` is on ``pacing.clock``. Raises only the first decision's error, what
    ``session()`` raises (the caller is closed) and :class:`UnsupportedBinding`; every other
    failure is in the answer.
    """
    delivery = Delivery(End.EXHAUSTED)
    for index in range(max_attempts):
        if index > 0:
            delay = pacing.policy.backoff_s(index - 1, pacing.rng)
            if pacing.clock() + delay >= deadline:
                delivery.end = End.TIMED_OUT
                break
            await pacing.sleep(delay)
        pick = await failover.next()
        if pick is None:
            break
        remaining_s = deadline - pacing.clock()
        if remaining_s <= 0:
            delivery.end = End.TIMED_OUT
            break
        started = time.perf_counter()
        try:
            answer = await attempt(session(), pick.target, envelope, remaining_s=remaining_s, limits=limits,
                                   guard=guard, stamp=stamp)
        except AttemptError as failure:
            tried = Tried(pick, index, failure.outcome, (time.perf_counter() - started) * 1000, failure.status,
                          failure=failure)
            delivery.tried.append(tried)
            on_attempt(tried)
            continue
        tried = Tried(pick, index, Outcome.SUCCESS, (time.perf_counter() - started) * 1000, answer.status,
                      answer=answer)
        delivery.tried.append(tried)
        on_attempt(tried)
        delivery.end = End.REJECTED if answer.rejected else End.DELIVERED
        break
    delivery.decision_error = failover.decision_error
    return delivery


__all__ = ["MAX_EXCLUDE", "MAX_RESOLVES_PER_PICK", "AttemptError", "AttemptLimits", "Breakers", "Delivery",
           "UnsupportedBinding",
           "EgressGuard", "End", "Failover", "Issue", "Pacing", "Pick", "Resolve", "TargetAnswer", "Tried", "attempt",
           "deliver"]
