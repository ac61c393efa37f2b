"""HTTP plumbing shared by the node's route modules: app/request keys, JSON bodies and errors."""

from __future__ import annotations

import asyncio
import re
from typing import TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from ..core import (
    BadRequest,
    NodeError,
    PayloadTooLarge,
    RequestTimeout,
    ValidationFailed,
    first_problem,
    hint_for,
    problems,
)
from ..core.models import TokenClaims, compile_pattern
from ..service import RegistryNode

Model = TypeVar("Model", bound=BaseModel)


class InFlight:
    """The requests inside the app right now, counted by the API's middleware: what a drain
    waits for (``idle``), and whether answers should close their connection (``closing``)."""

    __slots__ = ("count", "idle", "closing")

    def __init__(self) -> None:
        self.count = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.closing = False


NODE_KEY = web.AppKey("node", RegistryNode)
IN_FLIGHT_KEY = web.AppKey("in_flight", InFlight)
CALLER = web.RequestKey("caller", TokenClaims)


def json_response(body: object, *, status: int = 200) -> web.Response:
    if isinstance(body, BaseModel):
        payload = body.model_dump_json().encode()
    else:
        payload = orjson.dumps(body)
    return web.Response(body=payload, status=status, content_type="application/json")


def error_response(error: NodeError) -> web.Response:
    """The error's JSON shape; an error that says when to retry (``details.retry_after_ms``: a rate
    budget, a quota) says it in ``Retry-After`` too, in whole seconds (at least 1)."""
    response = json_response(error.body(), status=error.status)
    retry_after_ms = error.details.get("retry_after_ms") if error.details else None
    if isinstance(retry_after_ms, int):
        response.headers["Retry-After"] = str(max(1, -(-retry_after_ms // 1000)))
    return response


async def read_body(request: web.Request) -> bytes:
    """The raw body within the node's size and time limits (413, 408)."""
    config = request.app[NODE_KEY].config
    try:
        if request.content.is_eof():  # the whole body is here already (most requests): no timer
            return await request.read()
        async with asyncio.timeout(config.body_read_timeout_ms / 1000):
            return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise PayloadTooLarge(f"the body exceeds {config.max_body_bytes} bytes") from exc
    except TimeoutError as exc:
        raise RequestTimeout(f"the body did not arrive within {config.body_read_timeout_ms} ms") from exc


async def parse_body(request: web.Request, model: type[Model], *, allow_empty: bool = False) -> Model:
    """The request body as ``model``; 413 if too large, 400 if not JSON, 422 naming the field.

    Parsed in strict mode: a string is not an integer and ``true`` is not a number, so what is
    stored is what the caller meant, not a coercion of it.
    """
    raw = await read_body(request)
    if not raw:
        if allow_empty:
            raw = b"{}"
        else:
            raise BadRequest(f"a JSON body ({model.__name__}) is required", code="missing_body")
    return parse_json(raw, model)


def parse_json(raw: bytes, model: type[Model]) -> Model:
    """``raw`` as ``model`` in strict mode (see :func:`parse_body`); raises 400 or 422."""
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        raise validation_error(exc) from exc


def validation_error(exc: ValidationError) -> NodeError:
    """A pydantic failure as the node's error: 400 for bytes that are not JSON, else a 422 naming
    the first bad field (and listing up to 20 problems when there are several)."""
    first = first_problem(exc)
    if first.kind == "json_invalid":
        return BadRequest(f"the body is not valid JSON: {first.message}", code="invalid_json")
    message = first.message
    if first.kind == "extra_forbidden":
        message = f"unknown field {first.field!r}"
    elif first.field:
        message = f"{first.field}: {message}"
    details: dict[str, object] = {}
    hint = hint_for(exc.title, exc.errors(include_url=False)[0])  # the design's examples' mistakes, taught
    if hint is not None:
        message, details["use"] = hint.message, hint.use
    listed = [{"field": problem.field or "", "message": problem.message} for problem in problems(exc, limit=20)]
    if len(listed) > 1:
        details["problems"] = listed
    return ValidationFailed(message, field=first.field, details=details or None)


_TRUE = frozenset({"1", "true", "yes"})
_FALSE = frozenset({"0", "false", "no"})


def query_flag(request: web.Request, name: str) -> bool:
    """A boolean query parameter (absent: false); a value that is neither is a 422, not a silent false."""
    value = request.query.get(name, "false").lower()
    if value not in _TRUE and value not in _FALSE:
        raise ValidationFailed(f"{name} must be true or false (or 1/0, yes/no)", field=name)
    return value in _TRUE


def query_pattern(request: web.Request) -> re.Pattern[str] | None:
    """The ``pattern`` query parameter (an agent_id glob such as ``lang.*.*``), compiled; empty or
    absent: None; a malformed one is a 422."""
    pattern = request.query.get("pattern")
    if not pattern:
        return None
    try:
        return compile_pattern(pattern)
    except ValueError as exc:
        raise ValidationFailed(f"pattern: {exc}", field="pattern") from None
