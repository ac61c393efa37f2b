"""Refusals that teach: the design notes' own example inputs — an expiry in seconds, an ``auth``
registration field, a two-segment agent id — get a 422 that names the field and says which field
or form is right (``node.core.hints``), over real HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from node.core import Hint, hint_for
from node.core.models import TokenRole

from ..helpers import RunningNode, registration


async def _refused(node: RunningNode, path: str, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    status, answer = await node.call("POST", path, json=body, token=token)
    assert status == 422, answer
    return answer


async def test_an_expiry_in_seconds_is_taught_as_the_lease_in_milliseconds(node: RunningNode) -> None:
    answer = await _refused(node, "/v1/agents", registration("pay.risk.prod", expire_at=1_735_689_600))
    assert answer["field"] == "expire_at" and answer["details"]["use"] == "lease_ttl_ms", answer
    assert "lease_ttl_ms" in answer["message"] and "milliseconds" in answer["message"]
    answer = await _refused(node, "/v1/agents", registration("pay.risk.prod", lease_ttl_ms=30))
    assert answer["field"] == "lease_ttl_ms" and "30000" in answer["message"], answer
    card = {"name": "Risk", "skills": [{"id": "score", "name": "score"}], "url": "http://127.0.0.1:9/"}
    answer = await _refused(node, "/v1/agent-cards", {"agent_id": "pay.risk.card", "card": card, "expires_at": 60})
    assert answer["details"]["use"] == "lease_ttl_ms", answer


async def test_an_auth_field_is_taught_as_the_bearer_token_and_allowed_callers(node: RunningNode) -> None:
    answer = await _refused(node, "/v1/agents", registration("pay.risk.prod", auth={"type": "bearer", "token": "x"}))
    assert answer["field"] == "auth" and answer["details"]["use"] == "allowed_callers", answer
    assert "Authorization: Bearer" in answer["message"] and "allowed_callers" in answer["message"]


async def test_a_two_segment_agent_id_is_taught_the_three_part_form(node: RunningNode) -> None:
    answer = await _refused(node, "/v1/agents", registration("payment.risk"))
    assert answer["field"] == "agent_id" and answer["details"]["use"] == "namespace.group.name", answer
    assert "has 2 dot-separated parts" in answer["message"] and "namespace.group.name" in answer["message"]
    status, answer = await node.resolve(agent_id="payment.risk")
    assert status == 422 and "namespace.group.name" in answer["message"], answer


async def test_an_envelope_s_expiry_in_seconds_is_taught_as_milliseconds(node: RunningNode) -> None:
    caller = node.token("shop.web.front", TokenRole.CALLER)
    envelope = {"type": "request", "operation": "x.y", "payload": {}}
    answer = await _refused(node, "/v1/send", {**envelope, "expire_at": 1_735_689_600}, token=caller)
    assert answer["field"] == "expire_at" and answer["details"]["use"] == "expire_at_ms", answer
    answer = await _refused(node, "/v1/send", {**envelope, "expire_at_ms": 1_735_689_600}, token=caller)
    assert answer["field"] == "expire_at_ms" and "1735689600000" in answer["message"], answer


@pytest.mark.unit
def test_a_plain_refusal_gets_no_hint() -> None:
    assert hint_for("Registration", {"type": "missing", "loc": ("endpoints",)}) is None
    assert hint_for("Heartbeat", {"type": "extra_forbidden", "loc": ("expire_at",)}) is None
    taught = hint_for("Registration", {"type": "extra_forbidden", "loc": ("expire_at",)})
    assert isinstance(taught, Hint) and taught.use == "lease_ttl_ms"
