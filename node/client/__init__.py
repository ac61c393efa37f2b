"""The agent SDK: register, stay alive, find others and call them — ``ReachClient``.

::

    from node.client import CallOptions, Load, ReachClient

    async with ReachClient("http://127.0.0.1:7101", token=TOKEN, registration=registration,
                           load=lambda: Load(inflight=server.inflight)) as reach:
        result = await reach.call("translate.text", {"text": "退款说明", "target_lang": "en"},
                                  idempotent=True)
        result.payload, result.agent_id, result.match.kind   # the answer, who gave it, how it was found

        # how calls are routed and delivered, built (and checked) once, kept for many calls
        nearby = CallOptions(scope="local", version=">=2", idempotent=True, timeout_ms=5_000)
        result = await reach.call("translate.text", payload, options=nearby)

    # on the called agent's side: who calls (see CallVerifier; node.client.host.AgentHost does it all)
    async with CallVerifier("http://127.0.0.1:7101", agent_id="lang.translate.prod_01") as verifier:
        caller = await verifier.verify(request.headers.get("Authorization"))

The SDK runs without the server: importing it loads no Redis client, no Prometheus, no
``aiohttp.web`` and none of the node's server modules — only the shared models
(:mod:`node.core.models`, :mod:`node.core.envelope`, :mod:`node.core.errors`, :mod:`node.core.a2a`) and the breaker
logic of :mod:`node.delivery.outcomes`. The names an agent needs are exported here.

What it guarantees:

* **Registration** retries with backoff until the node answers (``register_max_wait_ms`` caps
  it; ``0`` tries once); a rejection (bad token, forbidden transport, invalid field) raises at
  once. An agent registers from a :class:`Registration` or from its A2A card
  (``card=CardRegistration(...)``).
* **Heartbeats** run on their own thread with their own event loop and HTTP session
  (``heartbeat_in_thread=True``, the default): an agent handler that blocks the caller's event
  loop — synchronous I/O, a CPU-bound step — does not stop them. The ``load`` callback is
  called on that thread, so it must be thread-safe (reading counters is). A pure-Python busy
  loop holding the GIL still lets the heartbeat thread run every ``sys.getswitchinterval()``
  (5 ms); only a C extension that holds the GIL for longer than the lease can starve it.
  ``unknown_agent`` (the lease lapsed) re-registers from the same thread.
* **Close** stops heartbeats, flushes outcome reports and deregisters.
* ``resolve()`` caches a ticket for ``ticket_reuse_ms`` (1 s: agents report load every second, and
  a ticket's weights are the load when it was issued) or until just before it expires, whichever
  is first; a failure of any agent it names evicts it, and
  so does the node saying nobody serves the request. ``call()`` draws each call's first target
  among the ticket's target and the alternates of its level, by the weights the node gave them,
  so a cached ticket spreads calls instead of pinning one agent for its lifetime; a call with a
  ``conversation_id`` keeps the ticket's target. ``semantic=False`` (or ``[client] semantic``)
  keeps the semantic fallback out; the node never routes a caller to itself.
* **Call options** are one frozen object, :class:`CallOptions` — routing (version, labels,
  scope, preferred region, semantic, conversation), delivery (idempotent, timeouts, attempts)
  and the fields of the envelope ``call()`` builds — validated when built; ``call()``,
  ``resolve()`` and ``send()`` take it as ``options=`` and its fields as keyword overrides.
* ``search()`` answers a plain-language query with typed hits (:class:`SearchResponse`).
* ``call()`` delivers an :class:`Envelope` to the target with the attempt and failover the
  node's proxy mode uses too (:mod:`node.delivery.attempts` writes the rules down): separate
  connect, read and overall timeouts; only ``idempotent=True`` calls are retried, after the
  wait of :class:`RetryPolicy`, on an alternate or a fresh decision — an agent or address
  already tried only when nobody else is left (a sole instance restarted within the deadline is
  reached); a breaker per target skips agents that keep failing; every attempt carries the
  target's route credential (``Authorization: Bearer``); redirects are
  never followed; answers beyond ``max_response_bytes`` fail the attempt. An agent registered
  from its A2A card is called in its binding (:mod:`node.delivery.a2a_wire`: JSON-RPC
  ``SendMessage``/``message/send`` or HTTP+JSON ``message:send``); a JSON-RPC error is a failed
  call, and a binding the SDK does not speak is refused with :class:`UnsupportedBinding`. Every attempt's
  outcome goes to ``/v1/reports`` in the background, batched.

Errors (the node's tree, :mod:`node.core.errors`, plus)::

    NodeError
    └── ClientError               base of what only the SDK raises
        ├── NodeUnreachable       503 the node did not answer (connection refused, timeout)
        ├── NodeRejected          the node answered with an error this SDK has no class for
        ├── CredentialRejected    401/403/503 (CallVerifier) a call's route credential is not good for this agent
        └── CallFailed            502 no attempt of call() succeeded; ``.attempts`` says why each failed
            ├── CallRejected      the target answered 4xx (not retried: the request is wrong)
            └── CallTimeout       504 the overall request timeout passed
    UnsupportedBinding            502 the agent speaks an A2A binding this SDK does not (GRPC); nothing was sent
    ValidationFailed
    └── AgentConfigError          422 the agent configuration (TOML or keywords) is invalid; names the key

A node error with a known code is raised as its own class (``NoAgentAvailable``,
``UnknownAgent``, ``Unauthorized``, :class:`HopLimitExceeded`, :class:`EnvelopeExpired` …) with
the node's code, message, field and details. ``call()`` raises those last two itself before
sending: a direct call is a hop, like a proxied one, so ``hop_count`` is incremented and an
A→B→A loop stops at ``max_hops`` (5).

The parts live in private modules: ``_reach_client`` (the facade), ``_options``
(:class:`CallOptions`, the route request), ``_calls`` (the envelope as sent,
:class:`CallResult`), ``_config`` (the agent TOML file and
:class:`ClientSettings`), ``_local`` (the node a client on this machine goes to by default:
:func:`default_node_url`, reading what ``agent-reach up`` wrote), ``_errors`` (the tree above), ``_http`` (the node's API),
``_heartbeat``, ``_registration`` (registration with backoff), ``_reports`` (batched outcome
reports), ``_tickets`` (the ticket cache); the attempt, the failover, the backoff and the breakers
are the delivery room's (:mod:`node.delivery`, shared with the node's proxy); public here:
:mod:`node.client.verifier` (:class:`CallVerifier`) and
:mod:`node.client.host` (:class:`~node.client.host.AgentHost`, which loads ``aiohttp.web`` and
so is not imported here).
"""

from ..core import (
    Envelope,
    EnvelopeExpired,
    EnvelopeType,
    HopLimitExceeded,
    NoAgentAvailable,
    NodeError,
    Policy,
    Trace,
    Unauthorized,
    UnknownAgent,
    ValidationFailed,
)
from ..core.a2a import CardRegistration
from ..core.models import (
    CallClaims,
    Capability,
    Load,
    Match,
    MatchKind,
    Registration,
    RouteTicket,
    SearchHit,
    SearchResponse,
    Status,
    TokenRole,
)
from ..delivery import BreakerState, RetryPolicy, UnsupportedBinding
from ._calls import CallResult
from ._config import (
    TOKEN_ENV,
    URL_ENV,
    AgentConfig,
    AgentConfigError,
    ClientSettings,
    NodeSection,
    SidecarSettings,
    load_agent_config,
    parse_agent_config,
)
from ._errors import (
    Attempt,
    CallFailed,
    CallRejected,
    CallTimeout,
    ClientError,
    NodeRejected,
    NodeUnreachable,
    node_error,
)
from ._heartbeat import HeartbeatStats
from ._http import SendResult
from ._local import (
    DEFAULT_NODE_URL,
    LOCAL_CLUSTER_FILE,
    LocalClusterFile,
    default_node_url,
    running_local_cluster,
)
from ._options import CallOptions
from ._reach_client import ClientState, ReachClient
from .verifier import CallVerifier, CredentialRejected

__all__ = [
    # the client
    "ReachClient",
    "ClientState",
    "CallOptions",
    "CallResult",
    "Attempt",
    "SendResult",
    "HeartbeatStats",
    "BreakerState",
    "SearchResponse",
    "SearchHit",
    "Match",
    "MatchKind",
    # the called agent's side
    "CallVerifier",
    "CallClaims",
    "CredentialRejected",
    # configuration
    "AgentConfig",
    "ClientSettings",
    "SidecarSettings",
    "NodeSection",
    "TOKEN_ENV",
    "URL_ENV",
    "DEFAULT_NODE_URL",
    "default_node_url",
    "LOCAL_CLUSTER_FILE",
    "LocalClusterFile",
    "running_local_cluster",
    "RetryPolicy",
    "load_agent_config",
    "parse_agent_config",
    # errors
    "ClientError",
    "NodeUnreachable",
    "NodeRejected",
    "CallFailed",
    "CallRejected",
    "CallTimeout",
    "UnsupportedBinding",
    "AgentConfigError",
    "node_error",
    "NodeError",
    "ValidationFailed",
    "NoAgentAvailable",
    "UnknownAgent",
    "Unauthorized",
    "HopLimitExceeded",
    "EnvelopeExpired",
    # what agents send and register
    "Envelope",
    "EnvelopeType",
    "Registration",
    "CardRegistration",
    "Capability",
    "Load",
    "Status",
    "RouteTicket",
    "Policy",
    "Trace",
    "TokenRole",
]
