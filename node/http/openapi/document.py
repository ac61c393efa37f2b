"""``build_openapi``: the document, assembled from the paths and components of this package."""

from __future__ import annotations

from functools import lru_cache

from ...core import DEFAULT_MAX_HOPS
from .components import components
from .paths import Paths, paths

OPENAPI_VERSION = "3.2.0"
Served = frozenset[tuple[str, str]]


@lru_cache(maxsize=16)
def build_openapi(region: str, *, served: Served | None = None, max_hops: int = DEFAULT_MAX_HOPS) -> dict[str, object]:
    """The spec; ``region`` goes into the description only.

    ``served``: the ``(method, path)`` pairs the node serves (lower-case methods); operations
    outside it are left out. None documents every route the node can serve. ``max_hops``: the
    region's hop limit for ``/v1/send``. The result is cached and shared: do not mutate it.
    """
    documented: Paths = {}
    for path, operations in paths().items():
        kept = {method: operation for method, operation in operations.items()
                if served is None or (method, path) in served}
        if kept:
            documented[path] = kept
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": "Agent-Reach node API", "version": "1.0.0",
                 "description": f"Regional registry node (region {region}). Bodies are parsed strictly: an "
                                "integer is written without a fraction or exponent (100.0 is refused), a string is "
                                "never a number, an unknown field is a 422 naming it. Before a request reaches "
                                "its route, the HTTP server may answer it with the same error body: 400, 414 or "
                                "431 for a malformed request head, 408 for one that arrives too slowly, 503 when "
                                "the node holds its maximum of connections."},
        "paths": documented,
        "components": {"schemas": components(max_hops),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }
