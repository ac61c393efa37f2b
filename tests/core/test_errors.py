"""The small helpers every layer shares, written once: pydantic's first problem (node.core.errors),
read by the HTTP layer, the store's quarantine, the SDK's config errors and federation's
decoders; and the one wall clock (node.core.clock) behind both ``node.store.region.now_ms`` and
``node.core.envelope.epoch_ms``."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

import node.core.envelope
import node.store.region
from node.core import first_problem, now_ms, problems
from node.core.models import Registration, RouteRequest

pytestmark = pytest.mark.unit


def _refusal(model: type, data: dict[str, object]) -> ValidationError:
    with pytest.raises(ValidationError) as raised:
        model.model_validate(data)
    return raised.value


def test_the_first_problem_names_its_dotted_field_and_kind() -> None:
    exc = _refusal(Registration, {"agent_id": "a.b.c", "endpoints": {"primary": "http://x"},
                                  "capabilities": [{"name": "ok"}, {"name": "BAD NAME"}]})
    first = first_problem(exc)
    assert first.field == "capabilities.1.name" and first.location == ("capabilities", 1, "name")
    assert first.kind == "string_pattern_mismatch"
    assert first.line() == f"capabilities.1.name: {first.message}"


def test_a_problem_with_the_whole_value_has_no_field() -> None:
    first = first_problem(_refusal(RouteRequest, {}))  # the model validator: none of the three selectors
    assert first.field is None and first.location == ()
    assert "give one of capability, agent_id, pattern or tags" in first.message
    assert first.line() == first.message


def test_every_problem_in_order_and_at_most_the_limit() -> None:
    exc = _refusal(Registration, {"agent_id": "NOT AN ID", "endpoints": {}, "weight": -1, "colour": "blue"})
    found = problems(exc)
    assert [problem.field for problem in found] == ["agent_id", "endpoints", "weight", "colour"]
    assert found[0] == first_problem(exc)
    assert found[-1].kind == "extra_forbidden"
    assert problems(exc, limit=2) == found[:2]


def test_the_store_and_the_envelope_read_the_one_clock() -> None:
    assert node.store.region.now_ms is now_ms and node.core.envelope.epoch_ms is now_ms
    before = time.time_ns() // 1_000_000
    assert before <= now_ms() <= time.time_ns() // 1_000_000
