"""Coalesced writes (node.store.batch): one Redis round trip for many heartbeats or registrations, and
every request still gets its own answer — versions, 404 for a passed lease or an unknown agent,
403 for a foreign agent, 422 for a bad body — with nothing stored wrongly."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from node.core import StoreUnavailable, UnknownAgent
from node.core.models import AgentRecord, Capability, Status, TokenRole
from node.store import RegionStore
from node.store.batch import Coalescer
from node.store.region import now_ms
from node.store.script_line import ScriptLine

from ..helpers import RunningNode, registration, wait_for


def _record(agent_id: str, region: str, *, lease_ms: int, at: int) -> AgentRecord:
    return AgentRecord(agent_id=agent_id, region=region, capabilities=[Capability(name="batch.cap", version="1")],
                       endpoints={"primary": "http://127.0.0.1:9"}, lease_ttl_ms=5_000, registered_at_ms=at,
                       updated_at_ms=at, lease_expires_at_ms=at + lease_ms)


async def test_mixed_heartbeats_in_one_batch_each_get_their_answer(redis_url: str, region: str) -> None:
    store = RegionStore.from_url(redis_url, region=region)
    try:
        now = now_ms()
        registered = await asyncio.gather(
            store.register(_record("bat.grp.live", region, lease_ms=5_000, at=now), at_ms=now),
            store.register(_record("bat.grp.busy", region, lease_ms=5_000, at=now), at_ms=now),
            store.register(_record("bat.grp.lapsed", region, lease_ms=-1, at=now), at_ms=now),
            store.register(_record("bat.grp.raced", region, lease_ms=5_000, at=now), at_ms=now))
        assert store._registers.batches == 1 and store._registers.items == 4  # one script call for all four
        assert sorted(record.version for record, _ in registered) == [1, 2, 3, 4]
        assert all(created for _, created in registered)
        live, busy, _, raced = (record for record, _ in registered)
        # Someone else changed "raced" since we read it: our known copy is one version behind.
        await store.update("bat.grp.raced", lambda r: r.model_copy(update={"weight": 7}), at_ms=now_ms(), known=raced)
        versions_before = await store.version()
        batches_before, items_before = store._updates.batches, store._updates.items

        at = now_ms()
        results = await asyncio.gather(
            store.update("bat.grp.live", lambda r: None, at_ms=at, known=live, renew_lease=True),
            store.update("bat.grp.busy", lambda r: r.model_copy(update={"status": Status.BUSY}), at_ms=at,
                         known=busy, renew_lease=True),
            store.update("bat.grp.lapsed", lambda r: None, at_ms=at, renew_lease=True,
                         known=_record("bat.grp.lapsed", region, lease_ms=5_000, at=now)),
            store.update("bat.grp.nobody", lambda r: None, at_ms=at, renew_lease=True,
                         known=_record("bat.grp.nobody", region, lease_ms=5_000, at=now)),
            store.update("bat.grp.raced", lambda r: r.model_copy(update={"status": Status.DEGRADED}), at_ms=at,
                         known=raced, renew_lease=True),
            return_exceptions=True)
        # The five went out as one batch; the raced one was retried once on the fresh record.
        assert store._updates.batches - batches_before == 2
        assert store._updates.items - items_before == 6

        lease_only, changed, lapsed, nobody, retried = results
        assert lease_only.changed is False and lease_only.record.version == live.version
        assert lease_only.record.lease_expires_at_ms == at + 5_000
        assert changed.changed is True and changed.record.status is Status.BUSY
        assert isinstance(lapsed, UnknownAgent) and lapsed.status == 404
        assert isinstance(nobody, UnknownAgent) and nobody.status == 404
        assert retried.changed is True and retried.record.status is Status.DEGRADED and retried.record.weight == 7

        # Two changes, two consecutive versions, two stream entries; the lease-only one bumped nothing.
        assert sorted([changed.record.version, retried.record.version]) == [versions_before + 1, versions_before + 2]
        assert await store.version() == versions_before + 2
        entries = await store.read_changes(after_version=versions_before)
        assert {(e.version, e.agent_id, e.record.status) for e in entries} == {
            (changed.record.version, "bat.grp.busy", Status.BUSY),
            (retried.record.version, "bat.grp.raced", Status.DEGRADED)}
        stored = {agent_id: await store.get(agent_id) for agent_id in ("bat.grp.live", "bat.grp.busy", "bat.grp.raced")}
        assert stored["bat.grp.live"].lease_expires_at_ms == at + 5_000
        assert stored["bat.grp.busy"].status is Status.BUSY
        assert stored["bat.grp.raced"].status is Status.DEGRADED and stored["bat.grp.raced"].weight == 7
        assert await store.get("bat.grp.nobody") is None
    finally:
        await store.aclose()


async def test_a_failed_round_trip_fails_only_its_batch(redis_url: str, region: str) -> None:
    calls: list[list[int]] = []

    async def flush(items: list[int]) -> list[int | BaseException]:
        calls.append(items)
        if 13 in items:
            raise StoreUnavailable("Redis of region x cannot be reached")
        return [item * 2 if item >= 0 else ValueError(f"bad {item}") for item in items]

    coalescer: Coalescer[int, int] = Coalescer(flush, max_batch=3)
    first = await asyncio.gather(*(coalescer.submit(i) for i in (1, 2, -3, 4)), return_exceptions=True)
    assert first[:2] == [2, 4] and isinstance(first[2], ValueError) and first[3] == 8
    assert calls == [[1, 2, -3], [4]]  # at most max_batch per round trip
    second = await asyncio.gather(coalescer.submit(13), return_exceptions=True)
    assert isinstance(second[0], StoreUnavailable)
    assert await coalescer.submit(5) == 10  # the coalescer goes on after a failed batch


async def test_concurrent_http_heartbeats_keep_every_per_request_answer(node_factory) -> None:
    node: RunningNode = await node_factory(sweep_interval_ms=600_000)
    agents = [f"bat.http.a{i}" for i in range(12)]
    for agent_id in agents:
        await node.register(registration(agent_id, lease_ttl_ms=5_000))
    await node.register(registration("bat.http.short", lease_ttl_ms=1_000))
    await wait_for(lambda: node.node.store.expired_ids(now_ms=now_ms(), limit=5), message="a lease to pass")
    store = node.node.store
    items_before = store._updates.items

    async def beat(agent_id: str, token: str | None, body: object) -> tuple[int, dict]:
        return await node.call("PUT", f"/v1/agents/{agent_id}/heartbeat", token=token, json=body)

    own = {agent_id: node.token(agent_id) for agent_id in agents}
    calls = []
    for n, agent_id in enumerate(agents):
        # Even: the lease only; odd: a new load (no change of the record); 3 mod 4: and a new status.
        body: dict[str, object] = {"load": {"inflight": n, "queued": 0, "rps": 1.0}} if n % 2 else {}
        if n % 4 == 3:
            body["status"] = "busy"
        calls.append(beat(agent_id, own[agent_id], body))
    calls += [
        beat("bat.http.a0", own["bat.http.a1"], {}),                      # a foreign agent's token
        beat("bat.http.short", node.token("bat.http.short"), {}),         # its lease has passed
        beat("bat.http.none", node.token("bat.http.none"), {}),           # never registered
        beat("bat.http.a2", own["bat.http.a2"], {"load": {"rps": "x"}}),  # a bad body
        beat("bat.http.a3", node.token("bat.http.a3", TokenRole.CALLER), {}),  # a caller may not heartbeat
    ]
    results = await asyncio.gather(*calls)
    for n, (status, body) in enumerate(results[:len(agents)]):
        assert status == 200, body
        assert body["agent_id"] == agents[n] and body["changed"] is (n % 4 == 3)
    foreign, lapsed, unknown, bad, caller = results[len(agents):]
    assert foreign[0] == 403 and foreign[1]["field"] == "agent_id"
    assert lapsed[0] == 404 and lapsed[1]["error"] == "unknown_agent"
    assert unknown[0] == 404 and unknown[1]["error"] == "unknown_agent"
    assert bad[0] == 422 and bad[1]["field"] == "load.rps"
    assert caller[0] == 403
    # The 12 good ones and the lapsed one reached the store's coalescer (an agent the node has
    # never seen is refused on the read of its record; how they were grouped depends on arrival,
    # which the store-level test above pins down).
    assert store._updates.items - items_before == len(agents) + 1
    for n, agent_id in enumerate(agents):
        status, record = await node.call("GET", f"/v1/agents/{agent_id}")
        assert status == 200 and record["load"]["inflight"] == (n if n % 2 else 0)
        assert record["status"] == ("busy" if n % 4 == 3 else "ready")
        stored = await store.get(agent_id)
        assert stored is not None and stored.load.inflight == (n if n % 2 else 0)


@pytest.mark.unit
def test_coalescer_refuses_an_empty_batch_size() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        Coalescer(lambda items: None, max_batch=0)  # type: ignore[arg-type, return-value]


@pytest.mark.unit
def test_free_memory_goes_back_to_the_system_every_trim_step_records() -> None:
    from node.ops import FreezeOnGrowth
    from node.ops.loopwatch import release_free_memory

    if not release_free_memory():
        pytest.skip("no glibc malloc_trim on this system")
    held = [0]
    freezer = FreezeOnGrowth(lambda: held[0], step=200, trim_step=1_000)
    for count in range(200, 2_201, 200):
        held[0] = count
        assert freezer.check() is True
    assert (freezer.freezes, freezer.trims, freezer.trimmed_at) == (11, 2, 2_000)
    held[0] = 600  # records went: the next trim counts from here
    freezer.check()
    held[0] = 1_600
    assert freezer.check() is True and freezer.trims == 3


@pytest.mark.unit
def test_the_collector_is_frozen_again_once_records_grew_by_a_step() -> None:
    import gc

    from node.ops import FreezeOnGrowth

    held = [0]
    freezer = FreezeOnGrowth(lambda: held[0], step=200)
    try:
        frozen_before = gc.get_freeze_count()
        held[0] = 199
        assert freezer.check() is False
        held[0] = 200
        assert freezer.check() is True and freezer.frozen_at == 200
        assert gc.get_freeze_count() >= frozen_before
        held[0] = 399
        assert freezer.check() is False  # the step is fixed: the pause follows it, not the region's size
        held[0] = 1_000_000
        assert freezer.check() is True
        held[0] = 1_000_199
        assert freezer.check() is False
        held[0] = 1_000_200
        assert freezer.check() is True and freezer.freezes == 3
        held[0] = 5_000  # records went: the next step counts from here
        assert freezer.check() is False and freezer.frozen_at == 5_000
    finally:
        gc.unfreeze()


async def test_a_script_line_survives_a_flushed_script_a_cancelled_call_and_an_error_reply(redis_url: str) -> None:
    """The coalescers' own connection (node.store.script_line): Redis forgetting the script, a call
    cancelled before its reply was read, an error reply and a connection Redis closed each leave
    the next call its own answer. On the store's own client, whose pool's policy retries a
    connection error on a fresh connection: a client without retries failed the call after
    CLIENT KILL whenever it went out before the line had seen the close (~1 run in 8)."""
    store = RegionStore.from_url(redis_url, region="script-line")
    client = store.redis
    echo = ScriptLine(client, "if ARGV[1] == 'fail' then return redis.error_reply('refused ' .. KEYS[1]) end "
                              "if ARGV[1] == 'slow' then local t = redis.call('TIME') "
                              "while true do local n = redis.call('TIME') "
                              "if (n[1] - t[1]) * 1000000 + n[2] - t[2] > 500000 then break end end end "
                              "return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1}")
    try:
        assert await echo(["k"], ["a", 1]) == ["k", "a", 2]
        await client.script_flush()  # a restarted or replaced Redis: the sha is unknown there
        assert await echo(["k"], ["b", 41]) == ["k", "b", 42]
        slow = asyncio.ensure_future(echo(["k"], ["slow", 0]))
        probe = aioredis.Redis.from_url(redis_url, socket_timeout=0.05)

        async def running() -> bool:  # Redis runs one script at a time: a ping waits while it spins
            try:
                await probe.ping()
            except RedisTimeoutError:
                return True
            return False

        await wait_for(running, timeout_s=5, message="the slow call reached Redis")
        await probe.aclose()
        slow.cancel()  # its reply is still to come: the next call must not read it as its own
        with pytest.raises(asyncio.CancelledError):
            await slow
        assert await echo(["k"], ["c", 7]) == ["k", "c", 8]
        with pytest.raises(ResponseError, match="refused k"):
            await echo(["k"], ["fail", 0])
        assert await echo(["k"], ["d", 9]) == ["k", "d", 10]
        # Redis drops the line's connection (a restart, a proxy's idle timeout): the next call reconnects.
        killed = await client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        assert killed >= 1
        assert await echo(["k"], ["e", 11]) == ["k", "e", 12]
    finally:
        await echo.aclose()
        await store.aclose()
