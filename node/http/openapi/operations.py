"""The parts every operation of the document is built from: the response and error entries,
the statuses each kind of route may answer, and the shared path and query parameters.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...core.models import AGENT_ID_PATTERN, SINGLE_LINE_PATTERN, TRACE_ID_PATTERN, Scope
from .patterns import AGENT_PATTERN, Schema

_ERRORS = {
    400: "Malformed request: no body, or a body that is not JSON",
    401: "Missing, forged or expired token",
    403: "The token may not do this",
    404: "Not found",
    408: "The body did not arrive within the node's body_read_timeout_ms",
    409: "A concurrent change won; retry",
    410: "The envelope expired (expire_at_ms has passed)",
    413: "Body too large",
    422: "A field or parameter is invalid (field names it)",
    429: "Rate limited",
    502: "Every delivery attempt failed (details.attempts says why)",
    503: "Redis (or what the route needs) is unavailable",
}
# Every authenticated route may answer these; and every route that takes a body, these.
_AUTH = (401, 429)
_BODY = (400, 408, 413, 422)


def ref(name: str) -> Schema:
    """A reference to the component schema ``name``."""
    return {"$ref": f"#/components/schemas/{name}"}


def json_answer(name: str | None, description: str) -> Schema:
    """A response whose JSON body is the component ``name`` (None: any object)."""
    schema = ref(name) if name else {"type": "object"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int, notes: dict[int, str] | None = None, passthrough: bool = False) -> dict[str, Schema]:
    responses = {str(status): json_answer("ErrorBody", (notes or {}).get(status, _ERRORS[status]))
                 for status in sorted(statuses)}
    if passthrough:  # a target's own 4xx answer goes back as it is
        for status, response in responses.items():
            if status.startswith("4"):
                response["description"] += "; or the target's own answer, as it is (X-Reach-Agent names the target)"
                response["content"]["*/*"] = {"schema": {}}
    return responses


def operation(summary: str, responses: dict[str, Schema], *, errors: Iterable[int] = (), body: str | None = None,
              body_required: bool = True, parameters: Iterable[Schema] = (), public: bool = False,
              notes: dict[int, str] | None = None, description: str | None = None,
              passthrough: bool = False) -> Schema:
    """One operation: ``responses`` plus an error entry per status in ``errors`` and the ones every
    authenticated route (401, 429) and every route with a ``body`` (400, 408, 413, 422) may answer;
    ``notes`` replace an error's generic description."""
    statuses = set(errors) | (set() if public else set(_AUTH)) | (set(_BODY) if body else set())
    error_responses = _errors(*statuses, notes=notes, passthrough=passthrough)
    entry: Schema = {"summary": summary, "responses": {**responses, **error_responses}}
    if description:
        entry["description"] = description
    if body is not None:
        entry["requestBody"] = {"required": body_required, "content": {"application/json": {"schema": ref(body)}}}
    if parameters:
        entry["parameters"] = list(parameters)
    if public:
        entry["security"] = []
    return entry


def query(name: str, schema: Schema, description: str, *, required: bool = False, **extra: Any) -> Schema:
    """A query parameter (``extra``: e.g. ``style``, ``explode``)."""
    return {"name": name, "in": "query", "required": required, "description": description, "schema": schema,
            **extra}


def path_parameter(name: str, schema: Schema, description: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "description": description, "schema": schema}


AGENT_ID = path_parameter("agent_id", {"type": "string", "maxLength": 200, "pattern": AGENT_ID_PATTERN},
                          "namespace.group.name, e.g. payment.risk_check.prod_01")
TRACE_ID = path_parameter("trace_id", {"type": "string", "pattern": TRACE_ID_PATTERN}, "The collaboration's trace id")
_SCOPES = [scope.value for scope in Scope]


def scope_query(default: Scope, *, all_alias: bool = True) -> Schema:
    """The ``scope`` query parameter; ``all_alias``: 'all' is accepted for global."""
    values = _SCOPES + (["all"] if all_alias else [])
    return query("scope", {"type": "string", "enum": values, "default": default.value},
                 "local, local-first or global" + (" ('all' = global)" if all_alias else ""))


ROUTABLE = query("routable", {"type": "string", "enum": ["true", "false", "1", "0", "yes", "no"], "default": "false"},
                 "true: only agents the router would consider")
WEIGHTS = query("weights", {"type": "string", "enum": ["true", "false", "1", "0", "yes", "no"], "default": "false"},
                "true: each target the caller may draw calls among carries its weight")
REMOTE = query("remote", {"type": "string", "enum": ["true", "false", "1", "0", "yes", "no"], "default": "false"},
               "true: the caller is in another region (a forwarded resolve): targets carry their external endpoint")
PATTERN = query("pattern", {"type": "string", "maxLength": 200, "pattern": f"^(?:{AGENT_PATTERN[1:-1]})?$"},
                "namespace.group.name with '*' wildcards within a segment (empty: no filter)")
CAPABILITY = query("capability", {"type": "string"}, "Only agents with this capability (empty: no filter)")
LEASES = query("leases", {"type": "string", "enum": ["true", "false", "1", "0", "yes", "no"], "default": "false"},
               "true: also a leases event about every second, the lease ends of this region's agents that moved")
REASON = query("reason", {"type": "string", "maxLength": 200, "pattern": SINGLE_LINE_PATTERN},
               "Why, for the decision log (one line)")
