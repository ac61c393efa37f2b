"""The parts of ``ReachClient.call()`` around the delivery: the envelope as sent, what a prepared
one routes by, and what a call returns (:class:`CallResult`) or raises once the delivery ended.
What the call asks of its route and delivery is :class:`~node.client.CallOptions` (``_options``)."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ..core import PASSTHROUGH, Envelope, EnvelopeExpired, HopLimitExceeded
from ..core.models import Match, MatchKind
from ..delivery import Delivery, End, Tried
from ._errors import Attempt, CallFailed, CallRejected, CallTimeout
from ._http import as_envelope
from ._options import CallOptions


@dataclass(slots=True)
class CallResult:
    """A successful call: who answered, what, how the route was found, and the attempts it took.

    ``match`` is the answering target's ticket's: ``match.kind`` says whether the agent had the
    capability by name (``exact``), was named (``agent_id``, ``pattern``) or was found by the
    semantic fallback (``semantic``, with ``match.score``); ``match.capability`` is the
    capability of the agent that matched.
    """

    agent_id: str
    region: str
    endpoint: str
    status: int
    body: Any
    envelope: Envelope | None
    trace_id: str
    request: Envelope
    match: Match
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def payload(self) -> Any:
        """The response envelope's payload, or the raw body when the target is not envelope-aware."""
        return self.envelope.payload if self.envelope is not None else self.body

    @property
    def semantic(self) -> bool:
        """Whether the semantic fallback chose the agent (nobody had the capability by name)."""
        return self.match.kind is MatchKind.SEMANTIC


def new_envelope(options: CallOptions, *, source_agent: str | None, target_agent: str | None,
                 capability: str | None, payload: Any, expire_at_ms: int, idempotent: bool) -> Envelope:
    """The envelope ``call()`` builds: ``options``' operation (default: the capability), trace and extensions."""
    return Envelope(source_agent=source_agent, target_agent=target_agent, operation=options.operation or capability,
                    payload=payload, expire_at_ms=expire_at_ms, idempotent=idempotent,
                    extensions=dict(options.extensions),
                    **({"trace_id": options.trace_id} if options.trace_id else {}))


def prepared_route(envelope: Envelope) -> tuple[str | None, str | None, str | None]:
    """(capability, agent_id, pattern) of a prepared envelope, routed as the proxy routes it: by its
    target (an id, or a pattern with ``*``), else by its operation."""
    target = envelope.target_agent
    if target and "*" in target:
        return envelope.operation, None, target
    if target:
        return None, target, None
    return envelope.operation, None, None


def conversation_of(envelope: Envelope, options: CallOptions) -> str | None:
    """The conversation a call keeps to: the options', else the one the envelope's extensions name."""
    if options.conversation_id is not None:
        return options.conversation_id
    carried = envelope.extensions.get("conversation_id")
    return carried if isinstance(carried, str) else None


@dataclass(frozen=True, slots=True)
class Incoming:
    """The delivery an agent's handler is acting on: its hop count, and the node's signed stamp of
    it (``X-Reach-Hop``; None for a direct call, which the node does not see)."""

    hop: int
    stamp: str | None = None


INCOMING: ContextVar[Incoming | None] = ContextVar("agent_reach_incoming", default=None)
"""Set by :class:`~node.client.AgentHost` while a handler runs: what its calls and sends carry on."""


def with_incoming_hops(envelope: Envelope) -> Envelope:
    """``envelope`` with at least the hop count of the delivery being handled, if any: a handler
    that writes a fresh envelope (``hop_count`` 0) still counts the hops that led to it."""
    incoming = INCOMING.get()
    if incoming is None or incoming.hop <= envelope.hop_count:
        return envelope
    return envelope.model_copy(update={"hop_count": incoming.hop})


def forwarded(envelope: Envelope, *, max_hops: int) -> Envelope:
    """The envelope as sent: refused like the proxy refuses it, then counted as a hop.

    A direct call is a hop too, so A→B→A loops end at ``max_hops`` as they do in the proxy.
    """
    if envelope.expired():
        raise EnvelopeExpired(f"envelope {envelope.id} expired at {envelope.expire_at_ms} ms; send a new one",
                              field="expire_at_ms")
    if envelope.hop_count >= max_hops:
        raise HopLimitExceeded(f"envelope {envelope.id} already made {envelope.hop_count} hops (the limit is "
                               f"{max_hops}): a loop between agents, or a chain too long", field="hop_count")
    return envelope.forwarded()


def call_result(envelope: Envelope, delivery: Delivery, *, idempotent: bool, overall_s: float) -> CallResult:
    """The result of a delivery, or the error that says why there is none."""
    attempts = [Attempt(t.pick.target.agent_id, t.pick.target.endpoint, t.outcome, t.latency_ms, t.status,
                        attempt_error(t)) for t in delivery.tried]
    what = envelope.operation or "call"
    answered = delivery.answered
    if answered is not None and answered.answer is not None:
        target, answer = answered.pick.target, answered.answer
        if delivery.end is End.REJECTED:
            raise CallRejected(f"{target.agent_id} rejected {envelope.operation or 'the call'}: "
                               f"{attempt_error(answered)}", attempts=attempts, trace_id=envelope.trace_id,
                               response_status=answer.status, body=answer.decoded())
        body = answer.decoded()
        return CallResult(agent_id=target.agent_id, region=target.region, endpoint=target.endpoint,
                          status=answer.status, body=body,
                          envelope=None if target.transport == PASSTHROUGH else as_envelope(body),
                          trace_id=envelope.trace_id, request=envelope, match=answered.pick.ticket.match,
                          attempts=attempts)
    if delivery.end is End.TIMED_OUT:
        raise CallTimeout(f"{what} did not succeed within {overall_s:g}s ({len(attempts)} attempt(s))",
                          attempts=attempts, trace_id=envelope.trace_id)
    why = "; ".join(f"{a.agent_id}: {a.error}" for a in attempts) or "no agent to try"
    if delivery.decision_error is not None and attempts:  # why nobody else was tried
        why += f"; then nobody else to try: {delivery.decision_error.message}"
    retry_note = "" if idempotent else " (not retried: the operation is not marked idempotent)"
    raise CallFailed(f"{what} failed after {len(attempts)} attempt(s){retry_note}: {why}",
                     attempts=attempts, trace_id=envelope.trace_id) \
        from delivery.last_failure or delivery.decision_error


def attempt_error(tried: Tried) -> str | None:
    """How an attempt's error reads in ``Attempt.error`` and the trace (None when it succeeded)."""
    if tried.failure is not None:
        return str(tried.failure)
    if tried.answer is not None and tried.answer.rejected:
        return f"HTTP {tried.status}: {str(tried.answer.decoded())[:200]}"
    return None


__all__ = ["CallResult", "attempt_error", "call_result", "conversation_of", "forwarded", "new_envelope",
           "prepared_route"]
