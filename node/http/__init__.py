"""The node's HTTP face: the aiohttp server, the v1 routes, the middleware, the console, the proxy,
traces, watch and snapshot streams, A2A routes and the OpenAPI document.

Its settings are ``node.config``'s (``ServerLimits``, ``HttpSettings``, ``ProxySettings``): this
room stands above the node's service and configuration, and nothing below imports it.
"""

from .api import bound_port, serve
from .console import console_link
from .plumbing import CALLER, IN_FLIGHT_KEY, InFlight, json_response, parse_body
from .snapshot_stream import END, HEAD_END

__all__ = [
    "CALLER",
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
