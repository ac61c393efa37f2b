"""Reading what a newer version wrote (``node.core.models.compat``): unknown fields are dropped and
counted, anything else wrong still fails, and what callers and agents send stays strict."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from federation.events import FederationMessage
from node.client._http import wire_json
from node.core import ValidationFailed
from node.core.models import AgentRecord, ChangeEvent, ChangeKind, Heartbeat, Registration, RouteTicket, compat
from node.http.plumbing import parse_json
from node.store import read_record

from ..helpers import registration

pytestmark = pytest.mark.unit


def _record(**changes: Any) -> dict[str, Any]:
    return AgentRecord.model_validate({**registration("newer.grp.a1", capability="translate.text"), "region": "eu",
                                       "version": 3, "registered_at_ms": 1, "updated_at_ms": 2,
                                       "lease_expires_at_ms": 3, **changes}).model_dump(mode="json")


def _newer(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as a newer version might write it: a field added at the top, in a capability
    and in the load."""
    newer = copy.deepcopy(record)
    newer["zone_hint"] = "eu-west-1a"
    newer["capabilities"][0]["cost_hint"] = {"per_call_usd": 0.002}
    newer["load"]["gpu"] = 0.4
    return newer


def test_a_record_with_fields_this_version_does_not_know_reads_as_the_rest() -> None:
    record = _record()
    before = compat.dropped_total()
    read = compat.read_json(AgentRecord, orjson.dumps(_newer(record)))
    assert read.model_dump(mode="json") == record
    assert compat.dropped_total() - before == 3
    assert compat.DROPPED[("AgentRecord", "zone_hint")] >= 1
    assert compat.DROPPED[("AgentRecord", "capabilities.[].cost_hint")] >= 1


def test_python_input_is_not_changed_by_the_reading() -> None:
    newer = _newer(_record())
    kept = copy.deepcopy(newer)
    read = compat.read_python(AgentRecord, newer)
    assert newer == kept and "zone_hint" not in read.model_dump()


def test_an_unknown_field_next_to_a_bad_one_still_fails_with_the_models_error() -> None:
    newer = _newer(_record())
    newer["weight"] = -1
    with pytest.raises(ValidationError) as raised:
        compat.read_json(AgentRecord, orjson.dumps(newer))
    assert {error["type"] for error in raised.value.errors()} >= {"extra_forbidden", "greater_than_equal"}
    with pytest.raises(ValidationError):
        compat.read_json(AgentRecord, b'{"agent_id": "x", "zone_hint": 1')  # not JSON at all


def test_stored_records_and_change_events_of_a_newer_replica_read_back() -> None:
    record = _record()
    assert read_record(orjson.dumps(_newer(record))).model_dump(mode="json") == record
    message = orjson.dumps({"schema_version": 2, "trace": "ignored",
                            "change": {"kind": "upsert", "region": "eu", "version": 3, "agent_id": "newer.grp.a1",
                                       "at_ms": 2, "record": _newer(record), "origin_node": "eu-n7"}})
    decoded = FederationMessage.decode(message)
    assert decoded.change is not None and decoded.change.kind is ChangeKind.UPSERT
    assert decoded.change.record is not None and decoded.change.record.model_dump(mode="json") == record
    assert compat.read_json(ChangeEvent, orjson.dumps(orjson.loads(message)["change"])).version == 3


def test_a_route_ticket_of_a_newer_node_reads_in_an_older_sdk() -> None:
    ticket = {"ticket_id": "t1", "trace_id": "tr1", "caller": "c.a.b", "signature": "sig", "issued_at_ms": 1,
              "expires_at_ms": 2, "locality": "local", "match": {"kind": "exact", "score": 1.0},
              "target": {"agent_id": "a.b.c", "region": "eu", "endpoint": "http://127.0.0.1:9", "transport": "http",
                         "credential": None}}
    plain = RouteTicket.model_validate(ticket)
    newer = {**ticket, "budget_ms": 250, "target": {**ticket["target"], "queue_hint": 3}}
    assert compat.read_python(RouteTicket, newer) == plain


def test_what_agents_and_callers_send_stays_strict() -> None:
    body = orjson.dumps({**registration("strict.grp.a1"), "zone_hint": "eu"})
    with pytest.raises(ValidationFailed) as raised:
        parse_json(body, Registration)
    assert raised.value.field == "zone_hint"


def test_the_sdk_sends_only_the_fields_its_caller_set() -> None:
    """The other direction of an upgrade: a newer SDK talking to an older node sends no field the
    caller did not use (null or default), so the older node's strict reading finds none it does not know."""
    sent = orjson.loads(wire_json(Registration.model_validate(registration("sdk.grp.a1"))))
    assert set(sent) == set(registration("sdk.grp.a1"))  # no defaulted field (weight, labels, probes …)
    assert set(sent["capabilities"][0]) == {"name", "version", "description"}
    assert orjson.loads(wire_json(Heartbeat(status=None))) == {}
    assert Registration.model_validate_json(wire_json(Registration.model_validate(registration("sdk.grp.a1")))) \
        == Registration.model_validate(registration("sdk.grp.a1"))  # the node fills in the same defaults
