"""Candidate tables patched per change (node.routing.candidates ``_patch``) equal tables built afresh.

A random sequence of registrations, status and load changes, weight changes, deregistrations,
version and label changes over a pool; after each step the kept table (patched when few agents
changed) is compared with one a new CandidateTables builds from the same index: same candidates
with the same weights in the same draw order sums, same counts of what was rejected and why.
"""

from __future__ import annotations

import random

import pytest

from node.core.models import AgentRecord, Capability, Load, Locality, RouteRequest, Status
from node.delivery import OutcomeTracker
from node.routing.candidates import CandidateTables, Source, Table
from node.view import AgentIndex
from node.view.cache import CHANGE_LOG

pytestmark = pytest.mark.unit

NOW = 1_000_000
CAPABILITY = "pool.work"


def _record(n: int, rng: random.Random) -> AgentRecord:
    return AgentRecord(
        agent_id=f"pool.grp.a{n}", region="home", lease_ttl_ms=30_000, lease_expires_at_ms=NOW + 30_000,
        capabilities=[Capability(name=CAPABILITY, version=rng.choice(["1", "1.2", "2"]))],
        endpoints={"primary": f"http://a{n}.test:80"}, weight=rng.choice([0, 50, 100, 300]),
        labels={"zone": rng.choice(["a", "b"])}, status=rng.choice([Status.READY, Status.READY, Status.DEGRADED,
                                                                    Status.BUSY, Status.DRAINING]),
        load=Load(inflight=rng.randrange(0, 20)), ready=rng.random() > 0.1)


def _shape(table: Table) -> tuple[object, ...]:
    candidates = sorted((c.agent_id, round(c.weight, 9)) for c in table.candidates)
    return (candidates, round(table.registered_weight, 6), table.matched,
            {reason: count for reason, count in table.rejected.items() if count},
            round(table.cumulative[-1], 6) if table.cumulative else 0.0, table.agent_ids)


@pytest.mark.parametrize("every", [3, 12])  # changes between two reads: a few, or more than list.index is used for
@pytest.mark.parametrize("request_fields", [{}, {"version": "1"}, {"labels": {"zone": "a"}}])
def test_patched_tables_equal_tables_built_afresh(request_fields: dict, every: int) -> None:
    rng = random.Random(11)
    index = AgentIndex("home")
    for n in range(300):
        index.put(_record(n, rng))
    source = Source(region="home", index=index, locality=Locality.LOCAL, lease_horizon_ms=NOW)
    request = RouteRequest(capability=CAPABILITY, **request_fields)
    kept = CandidateTables(outcomes=OutcomeTracker())
    kept.table(source, request, NOW, False)
    patched: list[Table] = []
    patch = kept._patch

    def counting_patch(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = patch(*args, **kwargs)
        if result is not None:
            patched.append(result)
        return result

    kept._patch = counting_patch  # type: ignore[method-assign]
    for step in range(400):
        n = rng.randrange(0, 330)
        current = index.get(f"pool.grp.a{n}")
        action = rng.random()
        if current is None or action < 0.15:
            index.put(_record(n, rng))
        elif action < 0.3:
            index.remove(current.agent_id)
        else:
            index.put(current.model_copy(update={"load": Load(inflight=rng.randrange(0, 20)),
                                                 "status": rng.choice([Status.READY, Status.BUSY])}))
        if step % every:  # several changes between two reads of the table
            continue
        table = kept.table(source, request, NOW, False)
        fresh = CandidateTables(outcomes=OutcomeTracker()).table(source, request, NOW, False)
        assert _shape(table) == _shape(fresh), f"step {step}"
        assert table.cumulative == sorted(table.cumulative)
        assert table.level.candidates is table.candidates and table.level.cumulative is table.cumulative
        assert table.level.registered_weight == table.registered_weight
        assert table.ids == [c.agent_id for c in table.candidates] and table.weights == [c.weight for c in table.candidates]
    assert len(patched) > 0.8 * 400 / every  # most reads were served by a patch, not a rebuild


def test_too_many_or_unknown_changes_rebuild() -> None:
    rng = random.Random(3)
    index = AgentIndex("home")
    for n in range(50):
        index.put(_record(n, rng))
    generation = index.capability_generation[CAPABILITY]
    assert index.changes_since(CAPABILITY, generation) == set()
    index.put(_record(7, rng))
    assert index.changes_since(CAPABILITY, generation) == {"pool.grp.a7"}
    for _ in range(CHANGE_LOG):
        index.put(_record(8, rng))
    assert index.changes_since(CAPABILITY, generation) is None  # the log no longer reaches back
    latest = index.capability_generation[CAPABILITY]
    index.replace_all([_record(1, rng)], version=5)
    assert index.changes_since(CAPABILITY, latest) is None  # a snapshot was swapped in


def test_a_bulk_load_holds_what_puts_would_and_is_patched_after() -> None:
    rng = random.Random(5)
    records = [_record(n, rng) for n in range(200)] + [_record(3, rng)]  # agent 3 twice: the last counts
    loaded, put = AgentIndex("home"), AgentIndex("home")
    loaded.put(_record(999, rng))  # replaced by the snapshot
    for record in records:
        put.put(record)
    loaded.replace_all(records, version=9)
    assert loaded.records == put.records and loaded.by_capability == put.by_capability
    assert loaded.records["pool.grp.a3"] is loaded.by_capability[CAPABILITY]["pool.grp.a3"]
    generation = loaded.capability_generation[CAPABILITY]
    assert generation > 0 and loaded.changes_since(CAPABILITY, generation) == set()
    source = Source(region="home", index=loaded, locality=Locality.LOCAL, lease_horizon_ms=NOW)
    request = RouteRequest(capability=CAPABILITY)
    tables = CandidateTables(outcomes=OutcomeTracker())
    before = tables.table(source, request, NOW, False)
    loaded.set_load("pool.grp.a7", Load(inflight=99))
    assert loaded.changes_since(CAPABILITY, generation) == {"pool.grp.a7"}
    after = tables.table(source, request, NOW, False)
    assert after is not before and after.index_generation == loaded.capability_generation[CAPABILITY]
    assert _shape(after) == _shape(CandidateTables(outcomes=OutcomeTracker()).table(source, request, NOW, False))
