"""The boundary models on their own (no servers): what they admit, what they refuse, and how
versions, patterns and free-form JSON are judged. Each case is what a route relies on."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from node.core import Envelope
from node.core.models import (
    INT64_MAX,
    AgentRecord,
    ChangeEvent,
    ChangeKind,
    DeleteReason,
    Heartbeat,
    Registration,
    RouteRequest,
    TokenClaims,
    TokenRole,
    compile_pattern,
    parse_version,
    version_constraint,
)
from node.trust import may_see

pytestmark = pytest.mark.unit

BASE: dict[str, Any] = {"agent_id": "lang.translate.one", "endpoints": {"primary": "http://127.0.0.1:9001"}}


def _field_of(exc: ValidationError) -> str:
    return ".".join(str(part) for part in exc.errors(include_url=False)[0]["loc"])


@pytest.mark.parametrize("change,field", [
    ({"lease_ttl_ms": "5000"}, "lease_ttl_ms"),
    ({"weight": True}, "weight"),
    ({"weight": 100.0}, "weight"),
    ({"display_name": "a\nb"}, "display_name"),
    ({"display_name": "a\u2028b"}, "display_name"),
    ({"labels": {"env": "x\x00"}}, "labels.env"),
    ({"labels": {"Bad Key": "x"}}, "labels.Bad Key.[key]"),
    ({"endpoints": {"primary": "http://h:1/a b"}}, "endpoints"),
    ({"endpoints": {"primary": "http://h:70000/"}}, "endpoints"),
    ({"endpoints": {"external": "http://h:1/"}}, "endpoints"),
    ({"agent_id": "Lang.translate.one"}, "agent_id"),
    ({"allowed_callers": ["not a pattern"]}, "allowed_callers"),
])
def test_registrations_refuse_what_would_not_read_back(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Registration.model_validate_json(json.dumps({**BASE, **change}), strict=True)
    assert _field_of(refused.value).startswith(field)


def test_descriptions_keep_line_breaks_and_tabs() -> None:
    registration = Registration.model_validate_json(
        json.dumps({**BASE, "description": "Translates.\n\tContracts too."}), strict=True)
    assert registration.description == "Translates.\n\tContracts too."


@pytest.mark.parametrize("body,field", [
    (b'{"load": {"rps": Infinity}}', "load.rps"),
    (b'{"load": {"rps": NaN}}', "load.rps"),
    (b'{"load": {"rps": 1e400}}', "load.rps"),
    (b'{"load": {"inflight": %d}}' % (INT64_MAX + 1), "load.inflight"),
    (b'{"load": {"queued": -1}}', "load.queued"),
    (b'{"status": "asleep"}', "status"),
])
def test_heartbeats_carry_only_finite_int64_load(body: bytes, field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Heartbeat.model_validate_json(body, strict=True)
    assert _field_of(refused.value) == field


def test_a_record_survives_its_own_json() -> None:
    record = AgentRecord.model_validate({**BASE, "region": "eu", "version": 7, "load": {"inflight": INT64_MAX}})
    assert AgentRecord.model_validate_json(record.model_dump_json()) == record


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("payload", [2**63, -(2**63) - 1, float("inf"), float("nan"), _nested(40),
                                     9.825180693579316e+274, -1e19])  # whole, as JSON Schema counts
def test_envelope_payloads_are_json_every_encoder_carries(payload: Any) -> None:
    with pytest.raises(ValidationError):
        Envelope(operation="x.y", payload=payload)


def test_envelope_payloads_in_range_pass_untouched() -> None:
    payload = {"n": INT64_MAX, "m": -(2**63), "f": 1.5, "tiny": 1.5e-300, "whole": 3.0e18,
               "nested": [{"a": None, "b": True}], "s": "你好"}
    assert Envelope(operation="x.y", payload=payload).payload == payload


def test_route_requests_need_one_selector_and_a_valid_constraint() -> None:
    with pytest.raises(ValidationError):
        RouteRequest.model_validate({})
    with pytest.raises(ValidationError):
        RouteRequest.model_validate({"capability": "x.y", "version": ">>2"})
    assert RouteRequest.model_validate({"pattern": "lang.*.*"}).pattern == "lang.*.*"


@pytest.mark.parametrize("constraint,version,accepted", [
    ("1", "1.4.0", True), ("v1", "1.0", True), ("1.2", "1.1", False), ("1", "2.0", False),
    (">=2,<3", "2.9", True), (">=2,<3", "3.0", False), ("~=1.4", "1.9", True),
])
def test_version_constraints(constraint: str, version: str, accepted: bool) -> None:
    assert version_constraint(constraint).accepts(parse_version(version)) is accepted


def test_patterns_match_within_one_segment() -> None:
    regex = compile_pattern("payment.*.prod")
    assert regex.match("payment.risk.prod")
    assert not regex.match("payment.risk.x.prod")
    with pytest.raises(ValueError):
        compile_pattern("payment..prod")


def test_a_tombstone_keeps_its_audience() -> None:
    tombstone = ChangeEvent(kind=ChangeKind.DELETE, region="eu", version=3, agent_id="fin.ledger.vip", at_ms=1,
                            reason=DeleteReason.DEREGISTERED, allowed_callers=["fin.*.*"])
    assert tombstone.audience == ["fin.*.*"]
    outsider = TokenClaims(sub="ops.caller.x", role=TokenRole.CALLER, exp=1, iat=0)
    insider = TokenClaims(sub="fin.books.y", role=TokenRole.CALLER, exp=1, iat=0)
    peer = TokenClaims(sub="federation:us", role=TokenRole.PEER, exp=1, iat=0)
    itself = TokenClaims(sub="fin.ledger.vip", role=TokenRole.AGENT, exp=1, iat=0)
    assert not may_see(outsider, tombstone.agent_id, tombstone.audience)
    assert all(may_see(claims, tombstone.agent_id, tombstone.audience) for claims in (insider, peer, itself))


def test_admin_in_allowed_callers_names_the_role_not_a_subject() -> None:
    audience = ["admin", "fin.*.*"]
    named_admin = [TokenClaims(sub="admin", role=role, exp=1, iat=0) for role in (TokenRole.CALLER, TokenRole.AGENT)]
    assert not any(may_see(claims, "fin.ledger.vip", audience) for claims in named_admin)
    assert may_see(TokenClaims(sub="ops", role=TokenRole.ADMIN, exp=1, iat=0), "fin.ledger.vip", audience)
    assert may_see(TokenClaims(sub="fin.books.y", role=TokenRole.CALLER, exp=1, iat=0), "fin.ledger.vip", audience)
