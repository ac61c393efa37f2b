"""Records read back from the region's Redis without pydantic validating them again
(node.store.stored_records) and records made compact (node.store.compact): equal to what pydantic reads,
dumped byte for byte the same, their common parts shared — and a stored value that is not this
schema's record still refused with pydantic's error."""

from __future__ import annotations

import sys
import tracemalloc
from typing import Any

import orjson
import pytest

from node.core.models import AgentRecord, Status, compat
from node.store import compact, is_compact, read_record
from node.store.compact import key_shared
from node.store.stored_records import WrittenRecords

pytestmark = pytest.mark.unit

BASE: dict[str, Any] = {"agent_id": "unit.stored.a1", "region": "r1",
                        "capabilities": [{"name": "cap.one", "version": "2", "description": "does one thing"}],
                        "endpoints": {"primary": "http://127.0.0.1:9000"}, "version": 7,
                        "registered_at_ms": 1_700_000_000_000, "updated_at_ms": 1_700_000_000_000,
                        "lease_expires_at_ms": 1_700_000_030_000}
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "everything": {"display_name": "Ünïcode \u00e9 agent", "description": "line one\nline two\ttab",
                   "capabilities": [{"name": "cap.one", "version": "1.4.0", "description": "x", "tags": ["a", "b"],
                                     "examples": ["do it", "again"]}, {"name": "cap:img/search"}],
                   "endpoints": {"primary": "https://example.com/a", "admin": "grpc://example.com:81"},
                   "callback_endpoint": "http://127.0.0.1:9001/cb", "transport": "a2a+jsonrpc",
                   "liveness_probe": {"url": "http://127.0.0.1:9000/live", "interval_ms": 500},
                   "readiness_probe": {"url": "http://127.0.0.1:9000/ready", "accept": "listening"},
                   "lease_ttl_ms": 60_000, "labels": {"env": "prod", "zone": "a"}, "weight": 0,
                   "max_concurrency": 12, "allowed_callers": ["payment.*.*", "admin"], "semantic_fallback": False,
                   "status": "draining", "load": {"queued": 3, "inflight": 2, "rps": 1.5}, "live": False,
                   "ready": False, "probe_error": "connection refused",
                   "a2a": {"card": {"name": "x", "skills": [{"id": "s"}]}, "format": "1.0", "binding": "JSONRPC",
                           "protocol_version": "1.0", "public": True}},
}


def stored_json(**changes: Any) -> str:
    return AgentRecord.model_validate({**BASE, **changes}).model_dump_json()


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_stored_record_reads_as_pydantic_reads_it_and_dumps_the_same_bytes(
        variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = stored_json(**VARIANTS[variant])
    expected = AgentRecord.model_validate_json(raw)
    read_by_pydantic: list[object] = []
    monkeypatch.setattr(compat, "read_json", lambda *args: read_by_pydantic.append(args))
    record = read_record(raw)
    assert not read_by_pydantic  # read by the one-pass check, not handed to pydantic
    assert record == expected
    assert record.model_dump_json() == expected.model_dump_json() == raw
    assert record.model_dump(mode="json") == expected.model_dump(mode="json")
    assert record.model_dump_json(exclude={"version"}) == expected.model_dump_json(exclude={"version"})
    assert is_compact(record) and record.model_fields_set == expected.model_fields_set
    assert isinstance(record.status, Status)
    assert sys.getsizeof(record.__dict__) < sys.getsizeof(expected.__dict__) / 2  # a key-sharing __dict__


def test_records_share_what_they_have_in_common() -> None:
    first = read_record(stored_json(agent_id="unit.stored.a1", labels={"env": "prod"}))
    second = read_record(stored_json(agent_id="unit.stored.a2", labels={"env": "prod"}))
    assert first.capabilities is second.capabilities and first.labels is second.labels
    assert first.load is second.load and first.allowed_callers is second.allowed_callers
    assert first.agent_id != second.agent_id
    parsed = AgentRecord.model_validate_json(stored_json(agent_id="unit.stored.a3", labels={"env": "prod"}))
    made = compact(parsed)
    assert made == parsed and made.model_dump_json() == parsed.model_dump_json()
    assert made.capabilities is first.capabilities and made.labels is first.labels
    assert compact(made) is made and not is_compact(parsed)


def test_endpoints_are_dicts_that_hold_their_names_once() -> None:
    urls = [f"http://127.0.0.1:{9_000 + i}" for i in range(2_000)]
    tracemalloc.start()
    plain = [{"primary": url, "external": url} for url in urls]
    plain_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    tracemalloc.start()
    shared = [key_shared({"primary": url, "external": url}) for url in urls]
    shared_bytes = tracemalloc.get_traced_memory()[0]  # the URL strings are made before either
    tracemalloc.stop()
    assert shared == plain and all(type(endpoints) is dict for endpoints in shared)
    assert [list(endpoints) for endpoints in shared[:2]] == [["primary", "external"]] * 2
    assert shared_bytes < 0.6 * plain_bytes
    shared[0]["other"] = "http://127.0.0.1:1"  # a changed one is a dict of its own
    assert list(shared[0]) == ["primary", "external", "other"] and list(shared[1]) == ["primary", "external"]
    record = read_record(stored_json(endpoints={"primary": urls[0], "external": urls[1]}))
    assert record.endpoints == {"primary": urls[0], "external": urls[1]}
    assert record.model_dump_json() == stored_json(endpoints={"primary": urls[0], "external": urls[1]})


def test_a_compact_record_changes_like_any_record() -> None:
    record = read_record(stored_json())
    record.lease_expires_at_ms = 5  # what the cache does when a lease moves
    copied = record.model_copy(update={"status": Status.BUSY})
    assert copied.status is Status.BUSY and record.status is Status.READY and copied.lease_expires_at_ms == 5
    assert read_record(stored_json()).lease_expires_at_ms == BASE["lease_expires_at_ms"]


NOT_RECORDS = {
    "rps null": lambda raw: raw.replace('"rps":0.0', '"rps":null'),
    "not json": lambda raw: raw[:-1],
    "a word for a number": lambda raw: raw.replace('"weight":100', '"weight":"heavy"'),
    "a negative version": lambda raw: raw.replace('"version":7', '"version":-7'),
    "an unknown status": lambda raw: raw.replace('"status":"ready"', '"status":"sleepy"'),
    "no primary endpoint": lambda raw: raw.replace('"primary"', '"other"'),
    "a tag that is no string": lambda raw: raw.replace('"tags":[]', '"tags":[1]'),
    "a list": lambda raw: "[" + raw + "]",
    # Well typed, but outside the model's patterns, lengths and bounds: refused all the same.
    "an agent id of another form": lambda raw: raw.replace('"unit.stored.a1"', '"Unit Stored A1"'),
    "a region of another form": lambda raw: raw.replace('"region":"r1"', '"region":"R 1"'),
    "a control character in a name": lambda raw: raw.replace('"display_name":""', '"display_name":"a\\u0007b"'),
    "a weight past its bound": lambda raw: raw.replace('"weight":100', '"weight":20000'),
    "a lease shorter than any": lambda raw: raw.replace('"lease_ttl_ms":30000', '"lease_ttl_ms":5'),
    "a label key of another form": lambda raw: raw.replace('"labels":{}', '"labels":{"Bad Key":"v"}'),
    "an endpoint name of another form": lambda raw: raw.replace('"primary":"http', '"primary":"http", "9x":"http'),
    "a transport of another form": lambda raw: raw.replace('"transport":"http+token"', '"transport":"HTTP TOKEN"'),
    # Checked after decoding, each distinct value once (node.store.stored_records._compact_record).
    "an agent id ending in a line break": lambda raw: raw.replace('"unit.stored.a1"', '"unit.stored.a1\\n"'),
    "a control character in a label value": lambda raw: raw.replace('"labels":{}', '"labels":{"env":"a\\u0007b"}'),
    "a line separator in a caller": lambda raw: raw.replace('"allowed_callers":[]', '"allowed_callers":["a\u2028b"]'),
    "a control character in the description": lambda raw: raw.replace('"description":""', '"description":"a\\u0001b"'),
    "a capability name of another form": lambda raw: raw.replace('"cap.one"', '"Cap One"'),
    "seventeen endpoints": lambda raw: raw.replace('"endpoints":{', '"endpoints":{' + "".join(
        f'"e{n}":"http://127.0.0.1:{n}",' for n in range(16))),
}


@pytest.mark.parametrize("spoil", NOT_RECORDS)
def test_a_stored_value_that_is_not_a_record_is_refused_as_pydantic_refuses_it(spoil: str) -> None:
    raw = NOT_RECORDS[spoil](stored_json())
    with pytest.raises(ValueError) as refused:
        read_record(raw)
    with pytest.raises(ValueError) as by_pydantic:
        AgentRecord.model_validate_json(raw)
    assert str(refused.value) == str(by_pydantic.value)


NEWER_RECORDS = {
    "a field of another schema": lambda raw: raw[:-1] + ',"colour":"red"}',
    "a capability field of another schema": lambda raw: raw.replace('"tags":[]', '"tags":[],"x":1'),
}


@pytest.mark.parametrize("newer", NEWER_RECORDS)
def test_a_field_this_version_does_not_know_is_dropped_not_quarantined(newer: str) -> None:
    """What a newer replica of the region wrote, during a rolling upgrade (node.core.models.compat);
    the same field next to a real problem is still refused (tests/core/test_compat.py)."""
    raw = NEWER_RECORDS[newer](stored_json())
    assert read_record(raw) == read_record(stored_json())
    assert read_record(raw).model_dump_json() == stored_json()


def test_what_pydantic_would_coerce_is_read_by_pydantic() -> None:
    raw = stored_json().replace('"weight":100', '"weight":"100"').replace('"rps":0.0', '"rps":0')
    assert read_record(raw) == AgentRecord.model_validate_json(raw)
    assert read_record(raw).model_dump_json() == stored_json()
    raw = stored_json().replace('"weight":100', '"weight":true')
    assert read_record(raw) == AgentRecord.model_validate_json(raw)
    assert read_record(raw).model_dump_json() == stored_json(weight=1)


def test_a_record_of_an_older_schema_is_read_by_pydantic() -> None:
    data = orjson.loads(stored_json(probe_error=None))
    del data["a2a"], data["probe_error"]  # written before those fields existed
    raw = orjson.dumps(data)
    assert read_record(raw) == AgentRecord.model_validate_json(raw)
    assert is_compact(read_record(raw))


def test_the_change_stream_reads_back_what_this_process_wrote() -> None:
    written = WrittenRecords(limit=2)
    record = AgentRecord.model_validate({**BASE, "version": 0})
    body = record.model_dump_json(exclude={"version"})
    written.remember(record.agent_id, body, record)
    raw = '{"version":9,' + body[1:]
    recalled = written.recall(record.agent_id, 9, raw)
    assert recalled == AgentRecord.model_validate_json(raw) and is_compact(recalled)
    assert recalled.model_dump_json() == AgentRecord.model_validate_json(raw).model_dump_json()
    other = written.recall("unit.stored.zz", 9, raw.replace("unit.stored.a1", "unit.stored.zz"))
    assert other.agent_id == "unit.stored.zz"


def test_the_stored_shape_names_every_field_of_the_models() -> None:
    from node.core.models import Capability, Load
    from node.store.stored_records import _Stored, _StoredCapability, _StoredLoad

    for mirror, model in ((_Stored, AgentRecord), (_StoredCapability, Capability), (_StoredLoad, Load)):
        assert list(mirror.__struct_fields__) == list(model.model_fields), model.__name__


def test_a_value_checked_for_one_field_is_not_taken_for_another() -> None:
    """The values checked before are remembered per field: a description is no region."""
    assert read_record(stored_json(description="plain words")).description == "plain words"
    assert read_record(stored_json(transport="grpc")).transport == "grpc"
    for spoiled in (stored_json().replace('"region":"r1"', '"region":"plain words"'),
                    stored_json().replace('"transport":"http+token"', '"transport":"plain words"')):
        with pytest.raises(ValueError) as refused:
            read_record(spoiled)
        with pytest.raises(ValueError) as by_pydantic:
            AgentRecord.model_validate_json(spoiled)
        assert str(refused.value) == str(by_pydantic.value)


def test_capabilities_that_differ_only_in_where_a_word_is_are_told_apart() -> None:
    tagged = read_record(stored_json(capabilities=[{"name": "cap.one", "tags": ["x"]}]))
    exemplified = read_record(stored_json(capabilities=[{"name": "cap.one", "examples": ["x"]}]))
    assert tagged.capabilities[0].tags == ["x"] and tagged.capabilities[0].examples == []
    assert exemplified.capabilities[0].examples == ["x"] and exemplified.capabilities[0].tags == []
