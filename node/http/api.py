"""The node's HTTP API (v1), a thin aiohttp layer over :class:`RegistryNode`.

One middleware (:mod:`node.http.guard`) turns every error into ``{"error", "message", "field"}`` with
the right status (never a 500 for bad input), authenticates the bearer token, and counts requests. Bodies are
parsed straight into pydantic models, so a malformed body is a 400 and a wrong field a 422
naming it.

Handlers are module-level functions that read the node from the app (``request.app[NODE_KEY]``);
:data:`ROUTES` lists them all (the ``/v1/watch`` stream is :mod:`node.http.watch_stream`'s), and
:func:`build_app` assembles the app from the middleware, the routes, the node's extensions and
proxy mode.
"""

from __future__ import annotations

import logging
import re
import time

import orjson
from aiohttp import web

from ..core import (TRACEPARENT, BadRequest, Conflict, Forbidden, NodeError, NotFound, RouteEvent, RouteEventKind,
                    SpanKind, TraceParent, ValidationFailed, now_ms)
from ..core.a2a import AGENT_CARD_PATH, AGENT_CARD_ROUTE, CardRegistration
from ..core.models import (
    ACL_RULE_ID_PATTERN,
    KEY_ID_PATTERN,
    AclList,
    AclRule,
    AgentList,
    CredentialRequest,
    Heartbeat,
    KeySet,
    Load,
    OutcomeReport,
    OutcomeReports,
    Registration,
    RevocationRequest,
    RouteRequest,
    Scope,
    TokenClaims,
    TokenRole,
)
from ..routing import DEFAULT_SEARCH_K, MAX_SEARCH_K, AgentQuery, described_for
from ..service import RegistryNode
from ..trust import JWKS_PATH, AclFull, require_peer
from .a2a_routes import registry_agent_card, v1_agent_card, well_known_agent_card
from .admin import ADMIN_AGENT_ROUTES
from .console import install_console
from .guard import PUBLIC_PATHS, guard, public_path
from .openapi import build_openapi
from .plumbing import (
    CALLER,
    IN_FLIGHT_KEY,
    NODE_KEY,
    InFlight,
    json_response,
    parse_body,
    parse_json,
    query_flag,
    query_pattern,
    read_body,
)
from .proxy import PROXY_KEY, install_proxy_routes
from .sessions import install_sessions
from .server import NodeRunner
from .snapshot_stream import stream_snapshot
from .traces import TRACES_KEY, charged
from .watch_stream import end_watches, watch

__all__ = ["PUBLIC_PATHS", "ROUTES", "bound_port", "build_app", "guard", "public_path", "serve"]

log = logging.getLogger(__name__)

MAX_QUERY_CHARS = 2_000  # the spec's maxLength of /v1/search's q, as sent
_KEY_ID_RE = re.compile(KEY_ID_PATTERN)
_LEASE_ONLY = Heartbeat()  # what an empty heartbeat body parses to (read, never changed)


def _node(request: web.Request) -> RegistryNode:
    return request.app[NODE_KEY]


def _caller(request: web.Request) -> TokenClaims:
    return request[CALLER]


# -- agents ----------------------------------------------------------------------------------

async def register(request: web.Request) -> web.Response:
    registration = await parse_body(request, Registration)
    response, created = await _node(request).register(registration, _caller(request))
    return json_response(response, status=201 if created else 200)


async def heartbeat(request: web.Request) -> web.Response:
    raw = await read_body(request)
    body = parse_json(raw, Heartbeat) if raw else _LEASE_ONLY
    agent_id = request.match_info["agent_id"]
    result = await _node(request).heartbeat(agent_id, body, _caller(request))
    # HeartbeatResponse's fields, each the store's (the agent id was found there under that name).
    return json_response({"agent_id": agent_id, "version": result.version,
                          "lease_expires_at_ms": result.lease_expires_at_ms, "changed": result.changed})


async def report_load(request: web.Request) -> web.Response:
    body = await parse_body(request, Load)
    return json_response(await _node(request).report_load(request.match_info["agent_id"], body, _caller(request)))


async def deregister(request: web.Request) -> web.Response:
    agent_id = request.match_info["agent_id"]
    version = await _node(request).deregister(agent_id, _caller(request))
    return json_response({"agent_id": agent_id, "version": version, "deregistered": True})


async def get_agent(request: web.Request) -> web.Response:
    return json_response(await _node(request).lookup(request.match_info["agent_id"], _caller(request)))


async def agent_decisions(request: web.Request) -> web.Response:
    """This node's recent route decisions and outcomes about one agent (``node.decisions``)."""
    agent_id = request.match_info["agent_id"]
    node = _node(request)
    entries = node.recent_decisions(agent_id, _caller(request))
    return json_response({"agent_id": agent_id, "region": node.region, "node_id": node.node_id,
                          "count": len(entries), "decisions": entries})


async def agent_probes(request: web.Request) -> web.Response:
    """The results of an agent's liveness and readiness probes this node ran (the region's leader
    runs them: a follower has none), newest first."""
    agent_id = request.match_info["agent_id"]
    node = _node(request)
    record = node.get(agent_id, _caller(request))
    kept = record.region == node.region and node.leadership.is_leader
    return json_response({"agent_id": agent_id, "region": record.region, "node_id": node.node_id,
                          "leader": node.leadership.is_leader,
                          "probes": node.prober.history(agent_id) if kept else []})


async def register_card(request: web.Request) -> web.Response:
    card_registration = await parse_body(request, CardRegistration)
    response, created = await _node(request).register_card(card_registration, _caller(request))
    return json_response(response, status=201 if created else 200)


async def list_agents(request: web.Request) -> web.Response:
    node = _node(request)
    query = request.query
    scope = _scope(request, default=Scope.LOCAL_FIRST)
    capability = query.get("capability")
    regex = query_pattern(request)
    labels: dict[str, str] = {}
    for selector in query.getall("label", []):
        key, sep, value = selector.partition("=")
        if not sep or not key:
            raise ValidationFailed("label must be key=value", field="label")
        labels[key] = value
    tags = query.getall("tag", [])
    if len(tags) > 8 or any(not tag or len(tag) > 64 for tag in tags):
        raise ValidationFailed("tag: at most 8 tags of 1 to 64 characters each", field="tag")
    selected = AgentQuery(scope=scope, capability=capability, agent_id=regex, labels=labels, tags=tags,
                          routable_only=query_flag(request, "routable"))
    found = node.list_agents(selected, _caller(request))
    return json_response(AgentList(agents=found, region=node.region, count=len(found)))


# -- discovery and routing -------------------------------------------------------------------

async def search(request: web.Request) -> web.Response:
    raw_query = request.query.get("q", "")
    if len(raw_query) > MAX_QUERY_CHARS:  # as sent, like the spec's maxLength
        raise ValidationFailed(f"q is longer than {MAX_QUERY_CHARS} characters", field="q")
    query = raw_query.strip()
    if not query:
        raise ValidationFailed("q is required: what should the agent do?", field="q")
    try:
        k = int(request.query.get("k", DEFAULT_SEARCH_K))
    except ValueError:
        raise ValidationFailed("k must be an integer", field="k") from None
    if not 1 <= k <= MAX_SEARCH_K:
        raise ValidationFailed(f"k must be within 1..{MAX_SEARCH_K}", field="k")
    scope = _scope(request, default=Scope.GLOBAL)
    routable_only = query_flag(request, "routable")
    return json_response(await _node(request).search(query, k=k, scope=scope, routable_only=routable_only,
                                                     caller=_caller(request)))


async def resolve(request: web.Request) -> web.Response:
    started = time.perf_counter()
    node, caller, weights = _node(request), _caller(request), query_flag(request, "weights")  # old SDKs: no weights
    remote = query_flag(request, "remote")  # forwarded from another region (federation.forward)
    route_request = await parse_body(request, RouteRequest)
    context = TraceParent.parse(request.headers.get(TRACEPARENT))  # W3C: a request without trace_id takes its trace
    if context is not None and route_request.trace_id is None:
        route_request = route_request.model_copy(update={"trace_id": context.trace_id})
    if route_request.capability:
        node.budgets.spend(caller, route_request.capability)
    if route_request.trace_id:
        request.app[TRACES_KEY].refuse_if_over(charged(caller))
    wanted = route_request.capability or route_request.agent_id or route_request.pattern
    with node.tracing.spans.start(f"resolve {wanted}", kind=SpanKind.SERVER, parent=context,
                                  trace_id=route_request.trace_id, attributes={
                                      "agent_reach.region": node.region, "agent_reach.caller": caller.sub}) as span:
        try:
            decision = await node.decide(route_request, caller)
        except NodeError as exc:
            node.metrics.count(node.metrics.resolves, "none", "none", "none")
            span.fail(exc.code)
            if route_request.trace_id:
                await _trace_decision(request, route_request.trace_id, caller, result=exc.code, detail=exc.message)
            raise
        span.set("gen_ai.agent.id", decision.target.target["agent_id"])
    node.metrics.resolve_seconds.observe(time.perf_counter() - started)
    node.metrics.count(node.metrics.resolves, "ok", decision.match["kind"], decision.target.target["locality"])
    if route_request.trace_id:
        target = decision.target.target
        await _trace_decision(request, route_request.trace_id, caller, result="ok", agent_id=target["agent_id"],
                              region=target["region"], endpoint=target["endpoint"],
                              detail=f"match {decision.match['kind']}; ticket {decision.ticket_id}")
    return web.Response(body=decision.to_json(weights=weights, remote=remote), content_type="application/json")


async def _trace_decision(request: web.Request, trace_id: str, caller: TokenClaims, **fields: object) -> None:
    """A direct-mode routing decision joins the caller's trace (only when it names one)."""
    event = RouteEvent(event=RouteEventKind.DECISION, at_ms=now_ms(), trace_id=trace_id, mode="direct",
                       caller=caller.sub, **fields)
    await request.app[TRACES_KEY].append([event], charge=charged(caller))


async def reports(request: web.Request) -> web.Response:
    raw = await read_body(request)
    if not raw:
        raise BadRequest("a JSON body (OutcomeReport or OutcomeReports) is required", code="missing_body")
    # One report or a batch: an object with a "reports" key is a batch. The bytes alone cannot
    # tell (a signature may read "reports", a key may be spelled "\u0072eports").
    try:
        decoded = orjson.loads(raw)
    except orjson.JSONDecodeError:
        batched = b'"reports"' in raw  # pydantic names what is wrong with it below
    else:
        batched = isinstance(decoded, dict) and "reports" in decoded
    batch = parse_json(raw, OutcomeReports).reports if batched else [parse_json(raw, OutcomeReport)]
    node, caller = _node(request), _caller(request)
    for item in batch:
        node.report(item, caller)
    return json_response({"accepted": len(batch)})


async def credentials(request: web.Request) -> web.Response:
    """The route credential of one of a ticket's alternates (the target's came with the ticket)."""
    body = await parse_body(request, CredentialRequest)
    return json_response(_node(request).issue_credential(body, _caller(request)))


async def jwks(request: web.Request) -> web.Response:
    """The public keys route credentials valid in this region are signed with (a JWK Set; public)."""
    kid = request.query.get("kid")
    if kid is not None and not _KEY_ID_RE.match(kid):
        raise ValidationFailed("kid must be a key id, <region>.<thumbprint>", field="kid")
    keys = await _node(request).keys.key_set(kid=kid)
    response = json_response(KeySet(keys=keys))
    # Verifiers cache the set; a new kid makes them fetch it again, so a short max-age is enough.
    response.headers["Cache-Control"] = "public, max-age=60"
    return response


async def rotate_keys(request: web.Request) -> web.Response:
    """Sign with a new key from now on (admin); the old one verifies until its credentials expired."""
    if _caller(request).role is not TokenRole.ADMIN:
        raise Forbidden("rotating the signing key is for admins", code="admins_only")
    keys = _node(request).keys
    key = await keys.rotate()
    return json_response({"region": keys.region, "kid": key.kid, "rotations": keys.rotations})


# -- the region, federation and admin --------------------------------------------------------

async def regions(request: web.Request) -> web.Response:
    node, remote = _node(request), _node(request).router.remote
    peers = described_for(remote.describe(), _caller(request)) if remote is not None else []
    return json_response({
        "region": node.region, "node_id": node.node_id, "version": node.cache.index.version,
        "agents": len(node.cache.index), "leader": node.leadership.is_leader, "peers": peers,
    })


async def breakers(request: web.Request) -> web.Response:
    """This node's open, half-open or penalised agents (from call outcome reports) the caller may see."""
    node = _node(request)
    return json_response({"region": node.region, "node_id": node.node_id, "breakers": node.breakers(_caller(request))})


async def revoke_token(request: web.Request) -> web.Response:
    """Refuse a token on every node of this region until it expires (admin; ``node.trust.revocation``);
    ``peers`` are the regions the federation sends it to (``federation.revocations``)."""
    body = await parse_body(request, RevocationRequest)
    node = _node(request)
    done = await node.revoke_token(body, _caller(request))
    return json_response({"region": node.region, "jti": done.jti, "revoked_until_ms": done.until_ms,
                          "new": done.new, "expired": done.expired,
                          "poll_interval_ms": node.config.revocation_poll_interval_ms,
                          "peers": list(node.revocations.peers)})


async def acl_rules(request: web.Request) -> web.Response:
    """The region's ACL rules in force (``node.trust.acl``), from every region (admins and peers)."""
    node = _node(request)
    require_peer(_caller(request), "the ACL rules")
    return json_response(AclList(region=node.region, version=node.acl.version, rules=node.acl.entries()))


async def acl_rule_set(request: web.Request) -> web.Response:
    """Set (PUT, body an ``AclRule``) or delete (DELETE) one ACL rule (admin): it holds on every
    node of the region within ``acl_poll_interval_ms`` and in every region the federation reaches."""
    node, caller = _node(request), _caller(request)
    if caller.role is not TokenRole.ADMIN:
        raise Forbidden("ACL rules are set by admins", code="admins_only")
    rule_id = request.match_info["rule_id"]
    if not re.fullmatch(ACL_RULE_ID_PATTERN[1:-1], rule_id):
        raise ValidationFailed("rule_id must be 1-64 characters of [a-z0-9_.-], starting with a letter or digit",
                               field="rule_id")
    rule = await parse_body(request, AclRule) if request.method == "PUT" else None
    if rule is None and rule_id not in {entry.id for entry in node.acl.entries()}:
        raise NotFound(f"region {node.region} has no ACL rule {rule_id}", field="rule_id", code="unknown_rule")
    try:
        entry = await node.acl.set(rule_id, rule)
    except AclFull as exc:
        raise Conflict(str(exc), code="acl_full") from None
    log.info("region %s: ACL rule %s %s by %s", node.region, rule_id, "set" if rule else "deleted", caller.sub)
    return json_response({"region": node.region, "rule": entry.model_dump(mode="json"), "version": node.acl.version,
                          "poll_interval_ms": node.config.acl_poll_interval_ms})


async def snapshot(request: web.Request) -> web.Response:
    require_peer(_caller(request), "the federation snapshot")
    return await stream_snapshot(request, _node(request))


async def quarantine(request: web.Request) -> web.Response:
    if _caller(request).role is not TokenRole.ADMIN:
        raise Forbidden("the quarantine list is for admins", code="admins_only")
    node = _node(request)
    items = node.store.quarantine.items()
    return json_response({"region": node.region, "count": len(items), "total": node.store.quarantine.total,
                          "items": [item.as_dict() for item in items]})


# -- the service (public paths) --------------------------------------------------------------

async def openapi(request: web.Request) -> web.Response:
    # The routes this app serves (attachments add theirs), so the spec documents no other.
    served = frozenset((route.method.lower(), route.resource.canonical) for route in request.app.router.routes()
                       if route.resource is not None and route.method != "HEAD")
    return json_response(build_openapi(_node(request).region, served=served,
                                       max_hops=request.app[PROXY_KEY].settings.max_hops))


async def healthz(request: web.Request) -> web.Response:
    node = _node(request)
    return json_response({"status": "ok", "region": node.region, "node_id": node.node_id})


async def readyz(request: web.Request) -> web.Response:
    node = _node(request)
    if node.ready:
        return json_response({"status": "ready", "region": node.region, "version": node.cache.index.version})
    return json_response({"status": "unready", "region": node.region, "state": node.state.value,
                          "store": node.cache.state.value}, status=503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=_node(request).metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"})


# -- query parameters ------------------------------------------------------------------------

def _scope(request: web.Request, *, default: Scope) -> Scope:
    value = request.query.get("scope", default.value)
    if value == "all":  # ARCHITECTURE.md's name for it
        return Scope.GLOBAL
    try:
        return Scope(value)
    except ValueError:
        raise ValidationFailed("scope must be local, local-first or global (or all)", field="scope") from None


# -- assembly --------------------------------------------------------------------------------

ROUTES: tuple[web.RouteDef, ...] = (
    web.post("/v1/agents", register),
    web.put("/v1/agents/{agent_id}/heartbeat", heartbeat),
    web.put("/v1/agents/{agent_id}/load", report_load),
    web.delete("/v1/agents/{agent_id}", deregister),
    web.get("/v1/agents/{agent_id}", get_agent),
    web.get("/v1/agents/{agent_id}/agent-card.json", v1_agent_card),
    web.get("/v1/agents/{agent_id}/decisions", agent_decisions),
    web.get("/v1/agents/{agent_id}/probes", agent_probes),
    web.post("/v1/agent-cards", register_card),
    web.get("/v1/search", search),
    web.get("/v1/agents", list_agents),
    web.post("/v1/resolve", resolve),
    web.post("/v1/reports", reports),
    web.post("/v1/credentials", credentials),
    web.get("/v1/watch", watch),
    web.get("/v1/regions", regions),
    web.get("/v1/breakers", breakers),
    web.get("/v1/federation/snapshot", snapshot),
    web.get("/v1/admin/quarantine", quarantine),
    web.post("/v1/admin/keys/rotate", rotate_keys),
    web.post("/v1/admin/tokens/revoke", revoke_token),
    web.get("/v1/acl", acl_rules),
    web.put("/v1/acl/{rule_id}", acl_rule_set),
    web.delete("/v1/acl/{rule_id}", acl_rule_set),
    web.get(JWKS_PATH, jwks),
    web.get(AGENT_CARD_PATH, registry_agent_card),
    web.get(AGENT_CARD_ROUTE, well_known_agent_card),
    web.get("/v1/openapi.json", openapi),
    web.get("/healthz", healthz),
    web.get("/readyz", readyz),
    web.get("/metrics", metrics),
)
"""Every route of the v1 API, in registration order (proxy mode and extensions add theirs)."""


def build_app(node: RegistryNode) -> web.Application:
    """The aiohttp application of ``node`` (extensions add their routes here)."""
    in_flight = InFlight()
    app = web.Application(middlewares=[guard(node, in_flight)], client_max_size=node.config.max_body_bytes)
    app[NODE_KEY] = node
    app[IN_FLIGHT_KEY] = in_flight
    app.on_shutdown.append(end_watches)
    app.add_routes(ROUTES)
    app.add_routes(ADMIN_AGENT_ROUTES)
    for extension in node.extensions:
        extension(app)
    install_proxy_routes(app, node)
    install_sessions(app, node)
    install_console(app)
    return app


async def serve(node: RegistryNode, *, host: str | None = None, port: int | None = None,
                reuse_port: bool = False) -> web.AppRunner:
    """Start the HTTP server of a started node; returns the runner (``await runner.cleanup()``).

    The server enforces the node's connection limits (``NodeConfig`` is a ``ServerLimits``:
    ``header_read_timeout_ms``, ``keepalive_timeout_ms``, ``max_connections``; see :mod:`node.http.server`)
    and serves https with the node's ``tls_cert_file`` (``ServerTlsSettings``: mutual TLS with
    ``tls_client_ca_file``); raises :class:`~node.core.TlsConfigError` for a file it cannot use.
    """
    config = node.config
    ssl_context = config.server_ssl_context()  # before the app starts: a bad file is one error, nothing to undo
    runner = NodeRunner(build_app(node), limits=config, metrics_registry=node.metrics.registry,
                        access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host or config.host, config.port if port is None else port, reuse_address=True,
                       reuse_port=reuse_port or None,  # several processes on one port: node --workers
                       ssl_context=ssl_context)
    await site.start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The TCP port a runner listens on (useful with port 0)."""
    for address in runner.addresses:
        if isinstance(address, tuple):
            return address[1]
    raise RuntimeError("the runner has no listening TCP site")
