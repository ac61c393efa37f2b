"""The region cache on the real Redis: what its listeners hear when the change stream has a gap."""

from __future__ import annotations

import redis.asyncio as aioredis

from node.core.models import AgentRecord, ChangeEvent, Load
from node.store import HeldChange, RegionStore
from node.store.region import now_ms
from node.view import RegionCache

from ..helpers import registration, wait_for

LEASE_MS = 600_000


def stored_json(agent_id: str, version: int, region: str) -> str:
    """A record as the store's scripts write it: the version spliced in first."""
    record = AgentRecord.model_validate({**registration(agent_id), "region": region, "version": version,
                                         "lease_expires_at_ms": now_ms() + LEASE_MS})
    return f'{{"version":{version},' + record.model_dump_json(exclude={"version"})[1:]


async def test_changes_applied_before_a_gap_in_a_batch_reach_the_listeners(redis_url: str, region: str) -> None:
    """Every change the cache applies from a batch reaches its listeners, also when the batch
    breaks off at a gap and the cache reloads: the reload only reports what differs from the
    index, and the changes applied before the gap are in the index already."""
    store = RegionStore.from_url(redis_url, region=region)
    writer = aioredis.Redis.from_url(redis_url, decode_responses=True)
    heard: list[ChangeEvent] = []
    try:
        async with RegionCache(store, tail_block_ms=50) as cache:
            cache.subscribe(heard.append)
            assert cache.reloads == 1 and len(cache.index) == 0
            # One transaction, so the tail reads versions 1, 2 and 4 in one batch. Entry 3 was
            # written by a foreign writer and names no usable agent: the store quarantines it and
            # it reads as nothing, so the batch breaks off after two applied changes.
            versions = {"cache.gap.a1": 1, "cache.gap.a2": 2, "cache.gap.a4": 4}
            async with writer.pipeline(transaction=True) as pipe:
                for agent_id, version in versions.items():
                    pipe.hset(store.key_agents, agent_id, stored_json(agent_id, version, region))
                    pipe.zadd(store.key_leases, {agent_id: now_ms() + LEASE_MS})
                pipe.set(store.key_version, 4)
                for agent_id, version in versions.items():
                    if version == 4:
                        pipe.xadd(store.key_changes, {"kind": "upsert", "agent_id": "not an agent id!", "at": now_ms()},
                                  id="3-0")
                    pipe.xadd(store.key_changes, {"kind": "upsert", "agent_id": agent_id, "at": now_ms(),
                                                  "record": stored_json(agent_id, version, region)},
                              id=f"{version}-0")
                await pipe.execute()

            await wait_for(lambda: cache.reloads == 2 and cache.index.version == 4, timeout_s=5,
                           message="the cache to reload at the gap")
            assert {record.agent_id: record.version for record in cache.index} == versions
            assert {event.agent_id: event.version for event in heard} == versions
            assert len(heard) == len(versions)  # each change once: none again from the reload
            assert [item.key for item in store.quarantine.items()] == [f"{store.key_changes}@3"]
    finally:
        await writer.aclose()
        await store.aclose()


async def test_a_region_load_reports_and_skips_what_does_not_parse_and_reads_the_rest_as_pydantic_does(
        redis_url: str, region: str) -> None:
    """A bulk load (several HSCAN chunks) over good records and stored values that are not
    records — not UTF-8, not JSON, well-typed but outside the model's patterns, a record under
    another agent's key: each bad one is quarantined and skipped, the load goes on, and every
    good record holds what pydantic reads from its bytes, with the lease and load stored apart."""
    store = RegionStore.from_url(redis_url, region=region)
    writer = aioredis.Redis.from_url(redis_url)  # bytes: a value need not be UTF-8
    good = {f"cache.load.a{i}": stored_json(f"cache.load.a{i}", i + 1, region) for i in range(4_500)}
    good["cache.load.labelled"] = stored_json("cache.load.labelled", 9_000, region).replace(
        '"labels":{}', '"labels":{"env":"prod"}').replace('"allowed_callers":[]', '"allowed_callers":["admin"]')
    bad: dict[str, bytes] = {
        "cache.load.utf": b'{"version":1,"agent_id":"cache.load.utf\xff"}',
        "cache.load.json": good["cache.load.a1"].encode()[:-5],
        "cache.load.newline": good["cache.load.a2"].replace('"cache.load.a2"', '"cache.load.newline\\n"').encode(),
        "cache.load.label": good["cache.load.a3"].replace('"labels":{}', '"labels":{"env":"a\\u0007b"}').encode(),
        "cache.load.other": good["cache.load.a4"].encode(),  # names cache.load.a4
    }
    leases = {agent_id: now_ms() + LEASE_MS + n for n, agent_id in enumerate([*good, *bad])}
    try:
        async with writer.pipeline(transaction=True) as pipe:
            pipe.hset(store.key_agents, mapping={**good, **bad})
            pipe.zadd(store.key_leases, leases)
            pipe.hset(store.key_loads, "cache.load.a7", Load(inflight=3).model_dump_json())
            pipe.set(store.key_version, 10_000)
            await pipe.execute()
        async with RegionCache(store) as cache:
            assert cache.index.version == 10_000
            assert {record.agent_id for record in cache.index} == set(good)
            for agent_id, raw in good.items():
                held = cache.index.get(agent_id)
                expected = AgentRecord.model_validate_json(raw)
                assert held is not None and held.lease_expires_at_ms == leases[agent_id]
                if agent_id == "cache.load.a7":
                    assert held.load == Load(inflight=3)
                else:
                    assert held.model_dump(exclude={"lease_expires_at_ms"}) == expected.model_dump(
                        exclude={"lease_expires_at_ms"})
            assert cache.index.get("cache.load.labelled").labels == {"env": "prod"}  # type: ignore[union-attr]
            assert set(cache.index.with_capability("translate.text")) == set(good)
            assert {item.key for item in store.quarantine.items()} == {store.record_key(a) for a in bad}
    finally:
        await writer.aclose()
        await store.aclose()


async def test_the_cache_reads_its_own_writes_back_unparsed_and_another_replicas_in_full(
        redis_url: str, region: str) -> None:
    """A write the node applied ahead of the stream (read-your-writes) comes back from the tail as
    a version only; the listeners hear it once; another replica's later write of the same agent is
    read in full and applied."""
    store = RegionStore.from_url(redis_url, region=region)
    replica = RegionStore.from_url(redis_url, region=region)
    heard: list[ChangeEvent] = []
    try:
        async with RegionCache(store, tail_block_ms=50) as cache:
            cache.subscribe(heard.append)
            record = AgentRecord.model_validate({**registration("cache.own.a1"), "region": region, "version": 0,
                                                 "lease_expires_at_ms": now_ms() + LEASE_MS})
            stored, _ = await store.register(record, at_ms=now_ms())
            cache.apply_local(ChangeEvent(kind="upsert", region=region, version=stored.version,
                                          agent_id=stored.agent_id, at_ms=now_ms(), record=stored))
            raw = await store.read_changes(after_version=stored.version - 1, held=cache._holds)
            assert raw == [HeldChange(stored.version)]  # what the tail gets: not parsed
            await wait_for(lambda: cache.position == stored.version, timeout_s=5, message="the tail to pass it")
            assert [event.version for event in heard] == [stored.version] and cache.reloads == 1

            again = record.model_copy(update={"weight": 9})
            other, _ = await replica.register(again, at_ms=now_ms())
            await wait_for(lambda: cache.index.get("cache.own.a1").version == other.version, timeout_s=5,
                           message="the other replica's write to be applied")
            assert cache.index.get("cache.own.a1").weight == 9
            assert [event.version for event in heard] == [stored.version, other.version] and cache.reloads == 1
            assert [type(c) for c in await store.read_changes(after_version=other.version - 1)] == [ChangeEvent]
    finally:
        await replica.aclose()
        await store.aclose()
