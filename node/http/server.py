"""The node's HTTP/1.1 server: aiohttp's, with limits on what a connection may cost.

aiohttp serves whatever a client sends for as long as it likes: a client dribbling a request
head holds its connection for the keep-alive timeout (an hour by default), connections are not
capped, and every malformed request is answered with a text page and logged with a full
traceback. :class:`NodeRunner` is an :class:`aiohttp.web.AppRunner` whose connections

* must deliver a complete request head within ``header_read_timeout_ms`` of connecting, or of
  the first byte of the next request on a keep-alive connection (408, then closed);
* are closed after ``keepalive_timeout_ms`` idle between requests (aiohttp's own timer);
* number at most ``max_connections``, at most ``max_connections_per_source`` from one address: a
  new one over either closes the oldest idle keep-alive connection (of its own source, or of the
  source holding the most), and only when none is idle is it answered 503 and closed at once
  (:mod:`node.http.connections`); once a request authenticates, at most
  ``max_connections_per_token`` count towards its token (the API's middleware asks
  :meth:`_NodeRequestHandler.authenticated`);
* get the node's JSON error shape for a malformed request (400, 414 for a request line that is
  too long, 431 for a header that is), logged as one warning line, at most one per kind per
  ``http_error_log_interval_ms``, with the count of lines left out.

The limits are :class:`node.config.ServerLimits` (``NodeConfig`` is one).

A request whose head has arrived is not timed here: body reads and long responses (the
``/v1/watch`` event stream lives for hours) are the handler's business.

Internals of aiohttp 3.14 this depends on (re-check them on upgrade): ``RequestHandler``'s
``connection_made`` / ``data_received`` / ``finish_response`` / ``handle_error`` and its
``_messages``, ``_request_count``, ``_loop``, ``max_line_size`` and ``max_field_size`` attributes;
``Server._kwargs`` / ``Server._loop`` and ``Server.__call__`` as the protocol factory;
``AppRunner._make_server``; ``http_exceptions`` classes and the text "Too many headers".
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadHttpMethod,
    BadStatusLine,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
)
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server
from prometheus_client import CollectorRegistry, Counter, Gauge

from ..config import ServerLimits
from ..core import BadRequest, NodeError
from .connections import ConnectionTable, Refusal, source_of

log = logging.getLogger(__name__)

_MESSAGE_DETAIL_CHARS = 200

__all__ = ["HeaderFieldsTooLarge", "NodeRunner", "RequestHeadTimeout", "RequestLineTooLong", "TooManyConnections"]


class RequestLineTooLong(BadRequest):
    """414: the request line exceeds the server's line limit."""

    status = 414
    code = "request_line_too_long"


class HeaderFieldsTooLarge(BadRequest):
    """431: a header line is too long, or there are too many headers."""

    status = 431
    code = "header_fields_too_large"


class RequestHeadTimeout(NodeError):
    """408: the request head did not arrive within ``header_read_timeout_ms``."""

    status = 408
    code = "request_timeout"


class TooManyConnections(NodeError):
    """503: the node (or the address, or the token) already holds its share of open connections."""

    status = 503
    code = "too_many_connections"


class NodeRunner(web.AppRunner):
    """An ``AppRunner`` whose server enforces ``limits``; counts into ``metrics_registry``.

    Use it like ``AppRunner`` (``await runner.setup()``, a ``TCPSite``, ``await runner.cleanup()``);
    ``cleanup()`` may be called more than once.
    """

    __slots__ = ("_limits", "_metrics", "_cleaned_up")

    def __init__(self, app: web.Application, *, limits: ServerLimits, metrics_registry: CollectorRegistry,
                 **runner_options: Any) -> None:
        super().__init__(app, keepalive_timeout=limits.keepalive_timeout_ms / 1000, **runner_options)
        self._limits = limits
        self._metrics = _ServerMetrics.of(metrics_registry)
        self._cleaned_up = False

    async def _make_server(self) -> Server:
        # AppRunner's own server runs the app's startup and freezes it; only its class is replaced.
        plain = await super()._make_server()
        return _NodeServer(plain.request_handler, request_factory=plain.request_factory,
                           handler_cancellation=plain.handler_cancellation, loop=asyncio.get_running_loop(),
                           limits=self._limits, metrics=self._metrics, **plain._kwargs)

    async def cleanup(self) -> None:
        if self._cleaned_up:
            return
        self._cleaned_up = True
        await super().cleanup()


class _ServerMetrics:
    """The server's Prometheus families, one set per registry (a node may be served twice)."""

    _by_registry: weakref.WeakKeyDictionary[CollectorRegistry, _ServerMetrics] = weakref.WeakKeyDictionary()

    def __init__(self, registry: CollectorRegistry) -> None:
        self.servers: weakref.WeakSet[_NodeServer] = weakref.WeakSet()
        self.refused = Counter("agent_reach_http_connections_refused",
                               "Connections answered 503 and closed: max_connections (or the source's share) "
                               "were open, none of them idle", registry=registry)
        self.evicted = Counter("agent_reach_http_connections_evicted",
                               "Idle keep-alive connections closed to make room for a new connection",
                               registry=registry)
        self.head_timeouts = Counter("agent_reach_http_header_timeouts",
                                     "Connections closed because no complete request head arrived in time",
                                     registry=registry)
        malformed = Counter("agent_reach_http_malformed_requests",
                            "Requests rejected by the HTTP parser, by kind", ["kind"], registry=registry)
        self._malformed = malformed
        self._malformed_children: dict[str, Any] = {}
        open_connections = Gauge("agent_reach_http_open_connections", "Client connections open now",
                                 registry=registry)
        open_connections.set_function(lambda: sum(server.open_connections for server in self.servers))

    @classmethod
    def of(cls, registry: CollectorRegistry) -> _ServerMetrics:
        metrics = cls._by_registry.get(registry)
        if metrics is None:
            metrics = cls._by_registry[registry] = cls(registry)
        return metrics

    def count_malformed(self, kind: str) -> None:
        child = self._malformed_children.get(kind)
        if child is None:
            child = self._malformed_children[kind] = self._malformed.labels(kind)
        child.inc()


class _LogThrottle:
    """At most one line per kind per interval; the next line written says how many were left out.

    Kinds are a closed set (the ``kind`` labels below), so the table stays small.
    """

    def __init__(self, logger: logging.Logger, *, interval_s: float) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._last_s: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(self, level: int, kind: str, message: str, *args: object, exc_info: BaseException | None = None) -> None:
        now = time.monotonic()
        last = self._last_s.get(kind)
        if last is not None and now - last < self._interval_s:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._last_s[kind] = now
        suppressed = self._suppressed.pop(kind, 0)
        suffix = f" ({suppressed} more like it since the last line)" if suppressed else ""
        self._logger.log(level, message + "%s", *args, suffix, exc_info=exc_info)


def _raw_response(error: NodeError, reason: str, *extra_headers: str) -> bytes:
    """A complete ``Connection: close`` response, for the moments no aiohttp request exists."""
    body = orjson.dumps(error.body())
    head = [f"HTTP/1.1 {error.status} {reason}", "Content-Type: application/json",
            f"Content-Length: {len(body)}", "Connection: close", *extra_headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _one_line(text: str) -> str:
    """aiohttp's parser messages span lines (data, then a caret); a log line must not."""
    flat = " ".join(text.split())
    return flat if len(flat) <= _MESSAGE_DETAIL_CHARS else flat[:_MESSAGE_DETAIL_CHARS] + "…"


class _StatusError(NodeError):
    """An error aiohttp reported by status only (a handler's timeout, an unhandled exception)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message, code=code)
        self.status = status


class _NodeServer(Server):
    """aiohttp's ``Server`` (the protocol factory) with the connection cap and shared throttle."""

    def __init__(self, handler: Any, *, limits: ServerLimits, metrics: _ServerMetrics, **server_options: Any) -> None:
        super().__init__(handler, **server_options)
        self.limits = limits
        self.metrics = metrics
        self.header_read_timeout_s = limits.header_read_timeout_ms / 1000
        self.throttle = _LogThrottle(log, interval_s=limits.http_error_log_interval_ms / 1000)
        # Counted on connection_made/lost, which run one at a time on the loop, so the caps are
        # exact even when a burst of accepts is queued; aiohttp's own table keeps a closed
        # connection until its handler task ends.
        self.table = ConnectionTable(max_connections=limits.max_connections,
                                     max_per_source=limits.max_connections_per_source,
                                     max_per_tenant=limits.max_connections_per_token)
        self.head_timeout_response = _raw_response(RequestHeadTimeout(
            f"the request head did not arrive within {limits.header_read_timeout_ms} ms; "
            "send the request line and headers at once"), "Request Timeout")
        self.refusal_responses = {
            Refusal.NODE_FULL: _raw_response(TooManyConnections(
                f"the node holds its maximum of {limits.max_connections} connections, none of them idle; retry "
                "shortly, or reuse keep-alive connections"), "Service Unavailable", "Retry-After: 1"),
            Refusal.SOURCE_FULL: _raw_response(TooManyConnections(
                f"this address holds its share of {limits.max_connections_per_source} connections, none of them "
                "idle; reuse keep-alive connections rather than opening more"), "Service Unavailable",
                "Retry-After: 1"),
        }
        metrics.servers.add(self)

    @property
    def open_connections(self) -> int:
        return len(self.table)

    def __call__(self) -> RequestHandler:
        return _NodeRequestHandler(self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.table.opened(handler, source_of(transport.get_extra_info("peername")))

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self.table.closed(handler)
        super().connection_lost(handler, exc)

    def admit(self, transport: asyncio.BaseTransport) -> bool:
        """Whether a new connection may open (closing an idle one to make room); refuses it if not."""
        admission = self.table.admit(source_of(transport.get_extra_info("peername")))
        if admission.refused is not None:
            self.refuse(transport, admission.refused)
            return False
        self._evict(admission.evict)
        return True

    def count_tenant(self, handler: RequestHandler, tenant: str) -> bool:
        """Count ``handler``'s connection towards ``tenant`` (closing one of its idle ones to make room);
        False when the tenant holds its share, none of it idle: the caller answers 503 and closes."""
        admission = self.table.authenticated(handler, tenant)
        if admission.refused is not None:
            self.metrics.refused.inc()
            self.throttle.log(logging.WARNING, "connection_refused_tenant_full", "refused a request of %s: it holds "
                              "its share of %d connections, none idle", tenant, self.limits.max_connections_per_token)
            return False
        self._evict(admission.evict)
        return True

    def _evict(self, victim: Any) -> None:
        """Close an idle keep-alive connection to make room (None: nothing to close)."""
        if victim is not None:
            self.table.evicting(victim)
            self.metrics.evicted.inc()
            victim.force_close()

    def refuse(self, transport: asyncio.BaseTransport, why: Refusal) -> None:
        self.metrics.refused.inc()
        peer = transport.get_extra_info("peername")
        self.throttle.log(logging.WARNING, f"connection_refused_{why.value}", "refused a connection from %s (%s): "
                          "%d open, %d from that address", peer, why.value, len(self.table),
                          self.table.holds(source_of(peer)))
        if isinstance(transport, asyncio.WriteTransport):
            transport.write(self.refusal_responses[why])
        transport.close()  # after the buffered 503 is flushed

    def head_timed_out(self, peer: object) -> None:
        self.metrics.head_timeouts.inc()
        self.throttle.log(logging.WARNING, "header_timeout", "closed a connection from %s: no complete request "
                          "head within %d ms", peer, self.limits.header_read_timeout_ms)

    def rejection(self, status: int, exc: BaseException | None, *, max_line_bytes: int, max_field_bytes: int,
                  request_line_complete: bool) -> tuple[str, NodeError]:
        """The metric/log kind and the client's error for what aiohttp's ``handle_error`` got."""
        if isinstance(exc, LineTooLong):
            if request_line_complete:
                return "header_too_large", HeaderFieldsTooLarge(
                    f"a header field exceeds {max_field_bytes} bytes; send smaller headers")
            return "request_line_too_long", RequestLineTooLong(
                f"the request line exceeds {max_line_bytes} bytes; shorten the URL (put large parameters in a body)")
        if isinstance(exc, HttpProcessingError):
            detail = _one_line(exc.message)
            if isinstance(exc, BadHttpMessage) and "Too many headers" in exc.message:
                return "too_many_headers", HeaderFieldsTooLarge("the request has too many headers; send fewer")
            kind = ("bad_method" if isinstance(exc, BadHttpMethod)
                    else "bad_request_line" if isinstance(exc, BadStatusLine)
                    else "invalid_header" if isinstance(exc, InvalidHeader)
                    else "invalid_url" if isinstance(exc, InvalidURLError)
                    else "bad_http")
            return kind, BadRequest(f"the request is not valid HTTP/1.1 ({detail}); fix the client that sent it")
        if status == 504:
            return "handler_timeout", _StatusError(504, "timeout", "the node timed out handling the request; retry")
        if status >= 500:
            return "internal", _StatusError(status, "internal_error", "the node failed; see its log")
        return "http_error", _StatusError(status, "http_error", f"the request failed with status {status}")


class _Phase(enum.Enum):
    """Where a connection is between requests; only READING_HEAD runs the head clock."""

    READING_HEAD = "reading_head"  # connected, or bytes of the next head arrived: the clock runs
    HANDLING = "handling"          # a head was parsed; body and response belong to the handler
    IDLE = "idle"                  # answered, waiting on keep-alive: aiohttp's keep-alive timer runs
    REFUSED = "refused"            # over the cap: answered 503, never handed to aiohttp


class _NodeRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol plus the head clock, the cap and JSON parse errors."""

    __slots__ = ("_node_server", "_phase", "_head_deadline", "_head_timer", "_head_bytes", "_head_newline_at",
                 "_when_lost")

    def __init__(self, manager: _NodeServer, **options: Any) -> None:
        super().__init__(manager, **options)
        # aiohttp drops _manager on connection_lost; the limits are needed until then and after.
        self._node_server = manager
        self._phase = _Phase.READING_HEAD
        self._head_deadline: float | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._head_newline_at = -1
        self._when_lost: list[Callable[[], None]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._node_server.admit(transport):
            self._phase = _Phase.REFUSED
            return
        super().connection_made(transport)
        self._start_head()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._head_deadline = None
        if self._phase is _Phase.REFUSED:
            return  # aiohttp never saw this connection
        super().connection_lost(exc)
        callbacks, self._when_lost = self._when_lost, []
        for callback in callbacks:
            callback()

    def authenticated(self, tenant: str) -> bool:
        """A request on this connection authenticated as ``tenant`` (``node.trust.tenant_of``); False
        when that tenant holds its share of connections, none idle: answer 503 and close this one."""
        return self._node_server.count_tenant(self, tenant)

    def when_lost(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the client's connection goes: a stream that only writes now and
        then (``/v1/watch``) learns at once that nobody reads it. Returns what unregisters it."""
        self._when_lost.append(callback)
        return lambda: self._when_lost.remove(callback) if callback in self._when_lost else None

    def data_received(self, data: bytes) -> None:
        phase = self._phase
        if phase is _Phase.REFUSED:
            return
        if phase is _Phase.IDLE and data:  # aiohttp re-feeds b"" when it resumes reading
            self._start_head()
        if self._phase is _Phase.READING_HEAD and self._head_newline_at < 0:
            # Where the first line ends tells a too-long request line (414) from a too-long header (431).
            found = data.find(b"\n")
            if found >= 0:
                self._head_newline_at = self._head_bytes + found
            else:
                self._head_bytes += len(data)
        parsed = self._request_count
        super().data_received(data)
        if self._request_count != parsed and self._phase is _Phase.READING_HEAD:
            self._phase = _Phase.HANDLING
            self._head_deadline = None

    async def finish_response(self, request: BaseRequest, resp: web.StreamResponse,
                              start_time: float | None) -> tuple[web.StreamResponse, bool]:
        result = await super().finish_response(request, resp, start_time)
        if self._phase is _Phase.HANDLING and not self._messages:
            self._phase = _Phase.IDLE
            self._node_server.table.idle(self)
        return result

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        server = self._node_server
        newline_at = self._head_newline_at
        kind, error = server.rejection(status, exc, max_line_bytes=self.max_line_size,
                                       max_field_bytes=self.max_field_size,
                                       request_line_complete=0 <= newline_at <= self.max_line_size)
        if error.status >= 500:
            # A bug in the node, not a client's junk: keep the traceback (still throttled).
            server.throttle.log(logging.ERROR, kind, "error handling %s %s from %s", request.method,
                                request.rel_url, request.remote, exc_info=exc)
        else:
            server.metrics.count_malformed(kind)
            server.throttle.log(logging.WARNING, kind, "rejected a request from %s (%s, %d): %s", request.remote,
                                kind, error.status, _one_line(getattr(exc, "message", "") or str(exc)))
        if request.writer.output_size > 0:
            # aiohttp's contract: a response already started cannot be replaced; the caller closes.
            raise ConnectionError("the response had started; the connection is closed instead")
        response = web.Response(body=orjson.dumps(error.body()), status=error.status, content_type="application/json")
        response.force_close()
        return response

    def _start_head(self) -> None:
        # One timer per connection, moved lazily like aiohttp's keep-alive timer: a request
        # that completes its head only clears the deadline, it does not cancel and reschedule.
        if self._phase is _Phase.IDLE:
            self._node_server.table.busy(self)
        self._phase = _Phase.READING_HEAD
        self._head_bytes = 0
        self._head_newline_at = -1
        deadline = self._loop.time() + self._node_server.header_read_timeout_s
        self._head_deadline = deadline
        if self._head_timer is None:
            self._head_timer = self._loop.call_at(deadline, self._on_head_clock)

    def _on_head_clock(self) -> None:
        self._head_timer = None
        deadline = self._head_deadline
        if deadline is None or self._phase is not _Phase.READING_HEAD or self.transport is None:
            return
        if self._loop.time() < deadline:
            self._head_timer = self._loop.call_at(deadline, self._on_head_clock)
            return
        self._node_server.head_timed_out(self.peername)
        self.transport.write(self._node_server.head_timeout_response)
        self.force_close()  # the transport closes once the 408 is flushed
