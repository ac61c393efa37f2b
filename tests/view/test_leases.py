"""The lease buckets the cache's lease sync asks which leases end soon (node.view.leases): the
same answer as a scan of every record, through renewals, new records, removals and reloads."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from node.view.leases import LeaseBuckets

pytestmark = pytest.mark.unit


@dataclass
class Leased:
    agent_id: str
    lease_expires_at_ms: int


def _scan(records: dict[str, Leased], soon: int) -> set[str]:
    return {agent_id for agent_id, record in records.items() if record.lease_expires_at_ms <= soon}


def _put(buckets: LeaseBuckets, records: dict[str, Leased], record: Leased) -> None:
    previous = records.get(record.agent_id)
    records[record.agent_id] = record
    buckets.put(record, previous)


def test_the_buckets_answer_as_a_scan_of_every_lease_would() -> None:
    rng = random.Random(28)
    records: dict[str, Leased] = {}
    buckets = LeaseBuckets(1_000)
    for i in range(300):
        records[f"a.b.c{i}"] = Leased(f"a.b.c{i}", rng.randrange(0, 60_000))
    buckets.start()
    buckets.fill(records.values())
    now = 0
    for _ in range(200):
        now += 1_000
        for _ in range(20):
            agent_id = f"a.b.c{rng.randrange(400)}"
            action = rng.random()
            if action < 0.5 and agent_id in records:  # a renewal moves the held lease later, in place
                record = records[agent_id]
                record.lease_expires_at_ms = max(record.lease_expires_at_ms, now + rng.randrange(1_000, 30_000))
            elif action < 0.8:  # a new record: a registration (perhaps a shorter lease), or a new agent
                _put(buckets, records, Leased(agent_id, now + rng.randrange(-5_000, 30_000)))
            else:
                records.pop(agent_id, None)
        soon = now + 2_000
        ending = buckets.ending(records, soon)
        assert len(ending) == len(set(ending))  # each agent once
        assert set(ending) == _scan(records, soon)
    assert len(buckets) < 3 * len(records)  # what sat in two buckets was answered once and collapsed


def test_a_lease_that_passed_is_answered_every_time_until_it_moves_or_goes() -> None:
    records = {"a.b.late": Leased("a.b.late", 500), "a.b.fine": Leased("a.b.fine", 90_000)}
    buckets = LeaseBuckets(1_000)
    buckets.start()
    buckets.fill(records.values())
    assert buckets.ending(records, 2_000) == ["a.b.late"]
    assert buckets.ending(records, 3_000) == ["a.b.late"]  # re-read again: another replica may have renewed it
    records["a.b.late"].lease_expires_at_ms = 40_000  # the re-read found it renewed
    assert buckets.ending(records, 4_000) == []
    assert buckets.ending(records, 41_000) == ["a.b.late"]
    del records["a.b.late"]
    assert buckets.ending(records, 42_000) == []


def test_after_a_reset_only_records_put_once_filling_started_are_held() -> None:
    records = {"a.b.old": Leased("a.b.old", 100)}
    buckets = LeaseBuckets(1_000)
    buckets.start()
    buckets.fill(records.values())
    buckets.reset()  # a snapshot swapped in: nothing is known until filled again
    assert not buckets.built and buckets.ending(records, 5_000) == []
    _put(buckets, records, Leased("a.b.new", 200))  # before filling starts: the fill will see it
    buckets.start()
    _put(buckets, records, Leased("a.b.newer", 300))  # while filling: goes in as it comes
    buckets.fill([records["a.b.old"], records["a.b.new"]])
    assert sorted(buckets.ending(records, 5_000)) == ["a.b.new", "a.b.newer", "a.b.old"]
    with pytest.raises(ValueError, match="bucket_ms"):
        LeaseBuckets(0)
