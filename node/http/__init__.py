"""The node's HTTP face: the aiohttp server, the v1 routes, the middleware, the console, the proxy,
traces, watch and snapshot streams, A2A routes and the OpenAPI document.

The names below are loaded when first used (:mod:`node.core.lazy`): the routes stand on
:class:`node.service.RegistryNode`, whose configuration reads the server's defaults from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core import lazy_exports

if TYPE_CHECKING:
    from .api import bound_port, serve
    from .console import console_link
    from .plumbing import CALLER, IN_FLIGHT_KEY, InFlight, json_response, parse_body
    from .server import (
        DEFAULT_ERROR_LOG_INTERVAL_MS,
        DEFAULT_HEADER_READ_TIMEOUT_MS,
        DEFAULT_KEEPALIVE_TIMEOUT_MS,
        DEFAULT_MAX_CONNECTIONS,
    )
    from .snapshot_stream import END, HEAD_END

__all__ = [
    "CALLER",
    "DEFAULT_ERROR_LOG_INTERVAL_MS",
    "DEFAULT_HEADER_READ_TIMEOUT_MS",
    "DEFAULT_KEEPALIVE_TIMEOUT_MS",
    "DEFAULT_MAX_CONNECTIONS",
    "END",
    "HEAD_END",
    "IN_FLIGHT_KEY",
    "InFlight",
    "bound_port",
    "console_link",
    "json_response",
    "parse_body",
    "serve",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "api": ("bound_port", "serve"),
    "console": ("console_link",),
    "plumbing": ("CALLER", "IN_FLIGHT_KEY", "InFlight", "json_response", "parse_body"),
    "server": ("DEFAULT_ERROR_LOG_INTERVAL_MS", "DEFAULT_HEADER_READ_TIMEOUT_MS", "DEFAULT_KEEPALIVE_TIMEOUT_MS",
               "DEFAULT_MAX_CONNECTIONS"),
    "snapshot_stream": ("END", "HEAD_END"),
})
