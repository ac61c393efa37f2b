"""The API's one middleware: authentication, the tenant's rate budget (``node.trust.budgets``), the JSON error shape,
request metrics, the access log and the count of requests in flight.

One middleware rather than one per concern: aiohttp calls each layer as a coroutine of its own
on every request, and these run on every request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from ..core import BadRequest, NodeError, PayloadTooLarge
from ..core.a2a import AGENT_CARD_PATH, AGENT_CARD_ROUTE
from ..ops import ACCESS_LOGGER, FIELDS, access_line
from ..service import RegistryNode
from ..trust import JWKS_PATH, tenant_of
from .console import is_console_path
from .plumbing import CALLER, InFlight, error_response, json_response
from .server import TooManyConnections

__all__ = ["PUBLIC_PATHS", "guard", "public_path"]

log = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/v1/openapi.json", JWKS_PATH, AGENT_CARD_PATH})
"""Paths served without a token; the console's files (``/ui/…``, :func:`public_path`) are public too."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def guard(node: RegistryNode, in_flight: InFlight) -> Middleware:
    """Authentication, the tenant's rate budget (its role and subject's, region-wide) and share of
    connections, the JSON error shape, the request count and latency, the access log
    (``NodeConfig.access_log``, logger ``agent_reach.access``), and the count of requests in flight
    that a drain waits for (one middleware: each layer costs every request a coroutine)."""
    budgets = node.budgets
    access_log = logging.getLogger(ACCESS_LOGGER) if node.config.access_log else None

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
        in_flight.count += 1
        in_flight.idle.clear()
        try:
            if not public_path(request.path) and not _anonymous_card(request):
                caller = node.authenticate(request.headers.get("Authorization"))
                budgets.spend(caller)
                count_connection = getattr(request.protocol, "authenticated", None)  # node.http.server's
                if count_connection is not None and not count_connection(tenant_of(caller)):
                    share = node.config.max_connections_per_token
                    raise TooManyConnections(
                        f"{caller.role.value} {caller.sub!r} holds its share of {share} "
                        "connections to this node, none of them idle; reuse keep-alive connections rather than "
                        "opening more", details={"retry_after_ms": 1_000})
                request[CALLER] = caller
            response = await handler(request)
        except Exception as exc:  # not a cancel: that ends the request (a BaseException)
            response = _error_answer(node, request, exc)
            if isinstance(exc, TooManyConnections):
                response.force_close()
        finally:
            in_flight.count -= 1
            if in_flight.count == 0:
                in_flight.idle.set()
        if in_flight.closing:
            # No more requests on this connection: its client reconnects, to a node still up.
            response.force_close()
        elapsed = time.perf_counter() - started
        node.metrics.request_done(route, request.method, response.status, elapsed)
        if access_log is not None:
            caller = request.get(CALLER)
            message, fields = access_line(method=request.method, path=request.path, route=route,
                                          status=response.status, duration_s=elapsed, remote=request.remote,
                                          caller=caller.sub if caller is not None else None,
                                          trace_id=response.headers.get("X-Reach-Trace-Id"))
            access_log.info(message, extra={FIELDS: fields})
        return response

    return middleware


def _error_answer(node: RegistryNode, request: web.Request, exc: Exception) -> web.StreamResponse:
    """The JSON error shape for what a handler (or authentication) raised; a redirect is raised on."""
    if isinstance(exc, NodeError):
        if exc.status == 401:
            node.metrics.count(node.metrics.auth_refusals, exc.code)
        return error_response(exc)
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return error_response(PayloadTooLarge(f"the body exceeds {node.config.max_body_bytes} bytes"))
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
        return json_response({"error": code, "message": f"{request.method} {request.path}: {exc.reason}",
                              "field": None}, status=exc.status)
    if isinstance(exc, ConnectionResetError):
        # The client went away mid-request (mid-body): nobody reads the answer, nothing to log.
        log.debug("client of %s %s went away", request.method, request.path)
        return error_response(BadRequest("the client closed the connection mid-request", code="client_closed"))
    log.error("unhandled error in %s %s", request.method, request.path, exc_info=exc)
    return json_response({"error": "internal_error", "message": "the node failed; see its log", "field": None},
                         status=500)


def public_path(path: str) -> bool:
    """Whether ``path`` is served without a bearer token (the console's data comes from the API, with one)."""
    return path in PUBLIC_PATHS or is_console_path(path)


def _anonymous_card(request: web.Request) -> bool:
    """An agent card's well-known URL asked for without a token: its handler decides (node.http.a2a_routes)."""
    resource = request.match_info.route.resource
    return resource is not None and resource.canonical == AGENT_CARD_ROUTE and "Authorization" not in request.headers
