"""How a body the node refuses is reported (node.http), without a server: strict parsing, the
400/422 split, the first problem named in one line, and every problem listed when there are
several. The routes rely on exactly these shapes (tests/http/test_bad_input.py sends them over HTTP)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from node.core import BadRequest, ValidationFailed
from node.core.models import Heartbeat, RouteRequest
from node.http.plumbing import first_problem, parse_json, validation_error

pytestmark = pytest.mark.unit


def test_bytes_that_are_not_json_are_a_400_not_a_422() -> None:
    with pytest.raises(BadRequest) as raised:
        parse_json(b'{"status": "ready",', Heartbeat)
    assert (raised.value.status, raised.value.code) == (400, "invalid_json")
    assert raised.value.message.startswith("the body is not valid JSON: ")


def test_the_first_problem_is_named_with_its_dotted_field() -> None:
    with pytest.raises(ValidationFailed) as raised:
        parse_json(b'{"load": {"inflight": "5"}}', Heartbeat)  # strict: a string is not a count
    assert raised.value.status == 422 and raised.value.field == "load.inflight"
    assert raised.value.message.startswith("load.inflight: ") and raised.value.details is None

    with pytest.raises(ValidationFailed) as raised:
        parse_json(b'{"capability": "x", "colour": "blue"}', RouteRequest)
    assert (raised.value.field, raised.value.message) == ("colour", "unknown field 'colour'")


def test_several_problems_are_all_listed_after_the_first() -> None:
    with pytest.raises(ValidationError) as raised:
        Heartbeat.model_validate_json(b'{"status": "asleep", "load": {"queued": -1}}', strict=True)
    first = first_problem(raised.value)
    assert first.field == "status" and first.kind == "enum"
    error = validation_error(raised.value)
    assert error.field == "status" and error.message == f"status: {first.message}"
    assert error.details is not None
    assert [problem["field"] for problem in error.details["problems"]] == ["status", "load.queued"]  # type: ignore[index]
