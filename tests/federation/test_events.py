"""What travels between regions, on its own (no servers): federation messages, beacons, the
region digest and the index's version rules that make replays and duplicates harmless."""

from __future__ import annotations

import random

import pytest

from federation import DigestTracker, FederationMessage, InvalidMessage, RegionBeacon, entry_hash, region_digest
from federation.digest import RegionState
from node.core.models import AgentRecord, ChangeEvent, ChangeKind, DeleteReason
from node.view import AgentIndex

pytestmark = pytest.mark.unit


def _record(agent_id: str, version: int, region: str = "eu") -> AgentRecord:
    return AgentRecord.model_validate({"agent_id": agent_id, "region": region, "version": version,
                                       "endpoints": {"primary": "http://127.0.0.1:9"},
                                       "capabilities": [{"name": "translate.text"}]})


def _upsert(agent_id: str, version: int) -> ChangeEvent:
    return ChangeEvent(kind=ChangeKind.UPSERT, region="eu", version=version, agent_id=agent_id, at_ms=version,
                       record=_record(agent_id, version))


def _delete(agent_id: str, version: int) -> ChangeEvent:
    return ChangeEvent(kind=ChangeKind.DELETE, region="eu", version=version, agent_id=agent_id, at_ms=version,
                       reason=DeleteReason.DEREGISTERED)


def test_a_message_carries_exactly_one_of_change_or_beacon_and_round_trips() -> None:
    change = FederationMessage(change=_upsert("lang.translate.a", 3))
    assert FederationMessage.decode(change.encode()) == change
    assert change.key() == b"lang.translate.a"
    beacon = FederationMessage(beacon=RegionBeacon(region="eu", watermark=3, live_count=1,
                                                   digest="0123456789abcdef", sent_at_ms=5))
    assert FederationMessage.decode(beacon.encode()) == beacon and beacon.region == "eu"
    for junk in (b"", b"{}", b"not json", b'{"change": null, "beacon": null}',
                 change.encode().replace(b'"version":3', b'"version":-3')):
        with pytest.raises(InvalidMessage):
            FederationMessage.decode(junk)


def test_the_digest_ignores_order_and_moves_with_every_version() -> None:
    records = [_record(f"lang.translate.a{n}", n + 1) for n in range(20)]
    digest, count = region_digest(records)
    shuffled = records[:]
    random.Random(7).shuffle(shuffled)
    assert region_digest(shuffled) == (digest, count) and count == 20
    bumped = [*records[:-1], _record(records[-1].agent_id, 99)]
    assert region_digest(bumped)[0] != digest
    assert entry_hash("a.b.c", 1) != entry_hash("a.b.c", 2)


def test_the_tracked_digest_follows_consecutive_changes_and_notices_a_gap() -> None:
    tracker = DigestTracker()
    tracker.reset(RegionState(version=2, agents={"lang.translate.a": (1, 0), "lang.translate.b": (2, 0)}))
    events = [_upsert("lang.translate.c", 3), _delete("lang.translate.a", 4), _upsert("lang.translate.b", 5)]
    for event in events:
        tracker.advance(event)
    tracker.advance(events[0])  # a replay changes nothing
    expected, _ = region_digest([_record("lang.translate.c", 3), _record("lang.translate.b", 5)])
    assert tracker.version == 5 and tracker.digest == expected
    tracker.advance(_upsert("lang.translate.d", 7))  # 6 is missing
    assert tracker.version == -1  # the caller must read the region again


def test_an_index_never_moves_a_record_backwards_whatever_the_order() -> None:
    history = [_upsert("lang.translate.a", 1), _upsert("lang.translate.b", 2), _upsert("lang.translate.a", 3),
               _delete("lang.translate.b", 4), _upsert("lang.translate.c", 5)]
    expected = {"lang.translate.a": 3, "lang.translate.c": 5}
    rng = random.Random(3)
    for _ in range(50):
        shuffled = history + rng.sample(history, 3)  # duplicates and replays
        rng.shuffle(shuffled)
        index = AgentIndex("eu")
        for event in sorted(shuffled, key=lambda e: e.version):  # a topic delivers in version order
            index.apply(event)
        assert {record.agent_id: record.version for record in index} == expected
        assert set(index.with_capability("translate.text")) == set(expected)
    index = AgentIndex("eu")
    index.apply(_upsert("lang.translate.a", 3))
    assert not index.apply(_upsert("lang.translate.a", 2))  # an older upsert arriving late
    assert index.get("lang.translate.a").version == 3


def test_schema_versions_headers_and_keys() -> None:
    """Schema 2 is written with its content type; schema 1 (no field) still reads; a newer one is
    NewerSchema (skipped by consumers), never an invalid message; a beacon is keyed by its region."""
    from federation import BEACON_CONTENT_TYPE, CHANGE_CONTENT_TYPE, SCHEMA_VERSION, NewerSchema

    change = FederationMessage.of_change(_upsert("lang.translate.a", 3))
    assert change.schema_version == SCHEMA_VERSION == 2
    assert b'"schema_version":2' in change.encode()
    assert change.headers() == [("content-type", CHANGE_CONTENT_TYPE.encode())]
    beacon = FederationMessage.of_beacon(RegionBeacon(region="eu", watermark=3, live_count=1, sent_at_ms=5))
    assert beacon.key() == b"eu" and beacon.headers() == [("content-type", BEACON_CONTENT_TYPE.encode())]
    legacy = change.encode().replace(b'"schema_version":2,', b"")
    assert FederationMessage.decode(legacy).schema_version == 1
    newer = change.encode().replace(b'"schema_version":2', b'"schema_version":3').replace(b'"change"', b'"delta"')
    with pytest.raises(NewerSchema) as raised:
        FederationMessage.decode(newer)
    assert raised.value.version == 3 and not isinstance(raised.value, InvalidMessage)
