"""Federation pieces in-process, on the real Redis and the real (embedded) Kafka broker:
topology validation, idempotent replica application, the publisher's outbox while Kafka is down,
bootstrap of a new node, a follower node replica and a restarted node reloading from Redis."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from federation import (
    DigestTracker,
    FederationConfig,
    FederationMessage,
    PeerCatalog,
    PeerConfig,
    Publisher,
    ReplicaStore,
    read_region_state,
    region_digest,
)
from node.core.models import AgentRecord, ChangeEvent, ChangeKind, DeleteReason, Snapshot
from node.store import RegionSnapshots, RegionStore
from node.store.region import now_ms
from topology import EmbeddedKafka, Topology, TopologyError, build_node, cli, load_topology

from ..conftest import TEST_SECRET
from ..helpers import Pair, registration, topic_messages, wait_for

pytestmark = pytest.mark.timeout(120)


# -- topology ---------------------------------------------------------------------------------

@pytest.mark.unit
def test_packaged_local_topology_has_three_regions_in_preference_order() -> None:
    topology = load_topology()
    assert [region.name for region in topology.regions] == ["us-east", "us-west", "eu-west"]
    assert [peer.name for peer in topology.peers_of("eu-west")] == ["us-east", "us-west"]
    assert topology.kafka.bootstrap_servers is None and all(r.redis_url is None for r in topology.regions)
    config = topology.federation_config("us-east", bootstrap_servers="127.0.0.1:9092")
    assert [peer.region for peer in config.peers] == ["us-west", "eu-west"]
    assert config.topic("us-east") == "agent-reach.changes.us-east"
    node = topology.node_config("us-west", redis_url="redis://127.0.0.1:6379/0")
    assert (node.host, node.port, node.advertise_url) == ("127.0.0.1", 7102, "http://127.0.0.1:7102")


BASE = """
[[regions]]
name = "a"
node_urls = ["http://127.0.0.1:7201"]
{extra_a}
[[regions]]
name = "b"
node_urls = ["http://127.0.0.1:7202"]
"""


@pytest.mark.unit
@pytest.mark.parametrize(("text", "field", "hint"), [
    (BASE.format(extra_a='colour = "red"'), "regions[0].colour", "unknown key"),
    (BASE.format(extra_a='prefer = ["c"]'), "regions[0].prefer[0]", "unknown region 'c'"),
    (BASE.format(extra_a='node_urls = ["127.0.0.1:1"]').replace('node_urls = ["http://127.0.0.1:7201"]\n', "", 1),
     "regions[0].node_urls", "absolute http(s) URL"),
    (BASE.format(extra_a='node = { sweep_interval_ms = 0 }'), "regions[0].node.sweep_interval_ms", "greater than"),
    (BASE.format(extra_a='node = { sweep_intervl_ms = 5 }'), "regions[0].node.sweep_intervl_ms", "unknown"),
    ("[federation]\nbeacon_interval_ms = 1000\nstale_after_ms = 500\n" + BASE.format(extra_a=""), "federation",
     "stale_after_ms must exceed"),
    ('[kafka]\ntopic_prefix = "bad prefix"\n' + BASE.format(extra_a=""), "kafka.topic_prefix", "match pattern"),
    (BASE.format(extra_a="") + '[[regions]]\nname = "a"\nnode_urls = ["http://127.0.0.1:7203"]\n',
     "regions[2].name", "listed twice"),
    ("regions = [", "", "not valid TOML"),
])
def test_topology_errors_name_the_file_and_the_field(tmp_path: Path, text: str, field: str, hint: str) -> None:
    file = tmp_path / "bad.toml"
    file.write_text(text)
    with pytest.raises(TopologyError) as caught:
        load_topology(file)
    message = str(caught.value)
    assert message.startswith(f"{file}: {field}"), message
    assert hint in message, message


@pytest.mark.unit
def test_topology_without_kafka_or_redis_says_how_to_get_them(tmp_path: Path) -> None:
    file = tmp_path / "t.toml"
    file.write_text(BASE.format(extra_a=""))
    topology = load_topology(file)
    with pytest.raises(TopologyError, match="kafka.bootstrap_servers.*agent-reach up"):
        topology.federation_config("a")
    with pytest.raises(TopologyError, match="redis_url.*agent-reach up"):
        topology.node_config("a")
    with pytest.raises(TopologyError, match="no region 'z'.*regions: a, b"):
        topology.region("z")
    with pytest.raises(TopologyError, match="cannot read"):
        load_topology(tmp_path / "missing.toml")


def test_node_command_without_kafka_says_how_to_get_one(tmp_path: Path, redis_url: str,
                                                        capsys: pytest.CaptureFixture) -> None:
    file = tmp_path / "no-kafka.toml"
    file.write_text(BASE.format(extra_a=f'redis_url = "{redis_url}"'))
    assert cli.main(["node", "--topology", str(file), "--region", "a", "--port", "0"]) == 2
    assert "names no kafka.bootstrap_servers" in capsys.readouterr().err


@pytest.mark.unit
def test_node_command_rejects_a_bad_topology_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    file = tmp_path / "bad.toml"
    file.write_text(BASE.format(extra_a='prefer = ["a"]'))
    assert cli.main(["node", "--topology", str(file), "--region", "a"]) == 2
    assert f"{file}: regions[0].prefer[0]: a region cannot prefer itself" in capsys.readouterr().err


# -- idempotent application -------------------------------------------------------------------

def record(agent_id: str, version: int, region: str = "p", **extra: Any) -> AgentRecord:
    body = registration(agent_id, **extra)
    return AgentRecord.model_validate({**body, "region": region, "version": version,
                                       "lease_expires_at_ms": now_ms() + 600_000})


def history(region: str = "p") -> list[ChangeEvent]:
    """A peer's change history: upserts, status changes, deletes, a re-registration after a delete."""
    events: list[ChangeEvent] = []
    version = 0

    def change(kind: ChangeKind, agent_id: str, **extra: Any) -> None:
        nonlocal version
        version += 1
        body = None if kind is ChangeKind.DELETE else record(agent_id, version, region, **extra)
        events.append(ChangeEvent(kind=kind, region=region, version=version, agent_id=agent_id, at_ms=now_ms(),
                                  record=body, reason=DeleteReason.DEREGISTERED if body is None else None))

    for n in range(12):
        change(ChangeKind.UPSERT, f"peer.grp.a{n}")
    for n in range(0, 12, 3):
        change(ChangeKind.STATUS, f"peer.grp.a{n}", status="degraded")
    for n in range(0, 12, 4):
        change(ChangeKind.DELETE, f"peer.grp.a{n}")
    change(ChangeKind.UPSERT, "peer.grp.a4", weight=7)  # back after its delete
    change(ChangeKind.DELETE, "peer.grp.a5")
    return events


def expected_state(events: list[ChangeEvent]) -> dict[str, int]:
    """agent_id -> version after applying ``events`` in order."""
    state: dict[str, int] = {}
    for event in events:
        if event.kind is ChangeKind.DELETE:
            state.pop(event.agent_id, None)
        else:
            state[event.agent_id] = event.version
    return state


@contextlib.asynccontextmanager
async def replica(redis_url: str, region: str, peer: str = "p") -> AsyncIterator[tuple[ReplicaStore, PeerCatalog]]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    store = ReplicaStore(client, region=region, key_prefix="ar", feed_maxlen=10_000)
    catalog = PeerCatalog(store, peers=[peer], stale_after_ms=60_000, feed_block_ms=50)
    try:
        async with catalog:
            yield store, catalog
    finally:
        await client.aclose()


async def apply(store: ReplicaStore, catalog: PeerCatalog, events: list[ChangeEvent], peer: str = "p") -> None:
    """What the consumer does with one batch: the Redis script, then the in-memory apply."""
    messages = [FederationMessage(change=event) for event in events]
    result = await store.apply(peer, messages, now_ms=now_ms(), offset=("topic:0", len(events)))
    applied = [messages[n - 1].change for n in result.applied]
    catalog.committed_changes(peer, applied, seen=result.seen, heard_at_ms=now_ms())  # type: ignore[arg-type]


def versions_of(catalog: PeerCatalog, peer: str = "p") -> dict[str, int]:
    return {r.agent_id: r.version for r in catalog.peer(peer).index}


async def test_duplicates_replays_and_any_order_give_the_same_replica(redis_url: str, region: str) -> None:
    events = history()
    expected = expected_state(events)
    digest, count = region_digest(record(a, v) for a, v in expected.items())
    async with replica(redis_url, region) as (store, catalog):
        await apply(store, catalog, events)
        assert versions_of(catalog) == expected
        assert (catalog.peer("p").digest, len(catalog.peer("p").index)) == (digest, count)
        # Replays, duplicates and shuffled batches on top change nothing.
        shuffler = random.Random(3)
        for _ in range(5):
            batch = events * 2
            shuffler.shuffle(batch)
            await apply(store, catalog, batch)
        assert versions_of(catalog) == expected
        assert catalog.peer("p").digest == digest
        _, loaded = await store.load(["p"])
        assert {r.agent_id: r.version for r in loaded["p"].records} == expected
        assert loaded["p"].seen == events[-1].version

    # Any arrival order, duplicates included, converges on the in-order result (tombstones stop
    # a late upsert from resurrecting a deleted agent).
    for seed in range(4):
        async with replica(redis_url, f"{region}-s{seed}") as (store, catalog):
            shuffled = events * 3
            random.Random(seed).shuffle(shuffled)
            for start in range(0, len(shuffled), 7):
                await apply(store, catalog, shuffled[start:start + 7])
            assert versions_of(catalog) == expected, f"seed {seed}"
            assert catalog.peer("p").digest == digest


async def test_follower_tails_the_feed_and_a_restart_reloads_from_redis(redis_url: str, region: str) -> None:
    events = history()
    expected = expected_state(events)
    async with replica(redis_url, region) as (leader_store, leader), replica(redis_url, region) as (_, follower):
        seen: list[ChangeEvent] = []
        follower.subscribe(seen.append)
        await apply(leader_store, leader, events[:20])
        await apply(leader_store, leader, events[10:])  # overlapping: duplicates are skipped
        await wait_for(lambda: versions_of(follower) == expected, timeout_s=5, message="follower caught up")
        assert follower.peer("p").digest == leader.peer("p").digest
        assert {e.agent_id for e in seen} == {e.agent_id for e in events}
    async with replica(redis_url, region) as (_, restarted):
        assert versions_of(restarted) == expected
        assert restarted.peer("p").seen_version == events[-1].version


async def test_a_feed_gap_in_the_middle_of_a_batch_reloads_and_every_change_reaches_the_listeners(
        redis_url: str, region: str) -> None:
    events = [ChangeEvent(kind=ChangeKind.UPSERT, region="p", version=v, agent_id=f"p.gap.a{v}", at_ms=now_ms(),
                          record=record(f"p.gap.a{v}", v)) for v in (1, 2, 3, 4)]
    expected = {event.agent_id: event.version for event in events}
    async with replica(redis_url, region) as (store, follower):
        heard: list[ChangeEvent] = []
        follower.subscribe(heard.append)
        # What the consumer's script commits for four changes, in one transaction (so the tail
        # reads one batch), except that the feed lost the entry of the third.
        base = f"{store.key_base}:peer:p"
        async with store.redis.pipeline(transaction=True) as pipe:
            for event in events:
                pipe.hset(f"{base}:agents", event.agent_id, event.record.model_dump_json())  # type: ignore[union-attr]
                pipe.hset(f"{base}:versions", event.agent_id, event.version)
            pipe.hset(f"{base}:state", mapping={"seen": 4, "heard_at_ms": now_ms()})
            pipe.set(store.key_seq, 4)
            for event in events:
                if event.version != 3:
                    pipe.xadd(store.key_feed, {"peer": "p", "type": "change", "at": now_ms(), "seen": event.version,
                                               "agent_id": event.agent_id, "version": event.version,
                                               "body": event.model_dump_json(exclude_none=True)},
                              id=f"{event.version}-0")
            await pipe.execute()
        await wait_for(lambda: versions_of(follower) == expected, timeout_s=5, message="the follower to reload")
        assert follower.reloads == 2 and follower.position == 4
        assert {event.agent_id: event.version for event in heard} == expected
        assert len(heard) == len(expected)


async def test_a_reconcile_heals_a_memory_that_lags_its_redis(redis_url: str, region: str) -> None:
    """The leader's changes reached Redis but not its memory (a reconcile's reply was handled first
    and raised the floor over them: the race the commit lock now prevents): the next reconcile finds
    nothing to write in Redis, and still brings memory to the snapshot."""
    async with replica(redis_url, region) as (store, catalog):
        events = [ChangeEvent(kind=ChangeKind.UPSERT, region="p", version=v, agent_id=f"p.g.b{v}", at_ms=0,
                              record=record(f"p.g.b{v}", v)) for v in (1, 2, 3)]
        await store.apply("p", [FederationMessage(change=event) for event in events], now_ms=now_ms(),
                          offset=("topic:0", 3))  # Redis only
        catalog.peer("p").raise_floor(3, 3)  # memory refuses them from now on
        catalog.committed_changes("p", events, seen=3, heard_at_ms=now_ms())
        assert versions_of(catalog) == {}
        snapshot = Snapshot(region="p", watermark=3, taken_at_ms=now_ms(), agents=[e.record for e in events])
        result = await store.reconcile("p", snapshot, now_ms=now_ms())
        assert result.put == [] and result.evicted == []  # Redis agreed already
        catalog.committed_reconcile("p", records=snapshot.agents, evicted=result.evicted, watermark=3,
                                    floor=result.floor, seen=result.seen, runs=result.runs, at_ms=now_ms())
        assert versions_of(catalog) == {"p.g.b1": 1, "p.g.b2": 2, "p.g.b3": 3}


async def test_reconcile_keeps_newer_records_drops_missing_ones_and_refuses_older_events(redis_url: str,
                                                                                       region: str) -> None:
    async with replica(redis_url, region) as (store, catalog):
        await apply(store, catalog, [ChangeEvent(kind=ChangeKind.UPSERT, region="p", version=v, agent_id=f"p.g.a{v}",
                                                 at_ms=0, record=record(f"p.g.a{v}", v)) for v in (1, 2, 3, 9)])
        # The snapshot at version 8: a1 was deleted, a2 changed at 7, a3 unchanged; a9 is newer than it.
        snapshot = Snapshot(region="p", watermark=8, taken_at_ms=now_ms(),
                            agents=[record("p.g.a2", 7), record("p.g.a3", 3), record("p.g.a5", 5)])
        result = await store.reconcile("p", snapshot, now_ms=now_ms())
        catalog.committed_reconcile("p", records=snapshot.agents, evicted=result.evicted, watermark=8, floor=result.floor,
                                    seen=result.seen, runs=result.runs, at_ms=now_ms())
        assert versions_of(catalog) == {"p.g.a2": 7, "p.g.a3": 3, "p.g.a5": 5, "p.g.a9": 9}
        assert sorted(result.evicted) == ["p.g.a1"]
        # An event at or below the snapshot's watermark is covered by it: refused.
        await apply(store, catalog, [ChangeEvent(kind=ChangeKind.UPSERT, region="p", version=4, agent_id="p.g.a1",
                                                 at_ms=0, record=record("p.g.a1", 4))])
        assert "p.g.a1" not in versions_of(catalog)
        _, loaded = await store.load(["p"])
        assert {r.agent_id: r.version for r in loaded["p"].records} == versions_of(catalog)
        assert loaded["p"].floor == 8


async def test_tracked_digest_equals_a_full_read_and_notices_a_gap(redis_url: str, region: str) -> None:
    store = RegionStore.from_url(redis_url, region=region)
    try:
        for n in range(6):
            await store.register(record(f"dig.grp.a{n}", 0, region), at_ms=now_ms())
        tracker = DigestTracker()
        tracker.reset(await read_region_state(store))
        start = tracker.version
        await store.register(record("dig.grp.a1", 0, region, weight=5), at_ms=now_ms())
        await store.deregister("dig.grp.a2", at_ms=now_ms())
        await store.register(record("dig.grp.new", 0, region), at_ms=now_ms())
        for event in await store.read_changes(after_version=0):
            tracker.advance(event)  # the ones up to ``start`` are already counted
        snapshot = await RegionSnapshots(store).snapshot()
        assert tracker.version == snapshot.version == start + 3
        assert tracker.digest == region_digest(snapshot.records)[0]
        assert (await read_region_state(store)).live_digest(at_ms=now_ms()) == region_digest(snapshot.records)
        gap = ChangeEvent(kind=ChangeKind.DELETE, region=region, version=tracker.version + 2, agent_id="dig.grp.a0",
                          at_ms=0, reason=DeleteReason.DEREGISTERED)
        tracker.advance(gap)
        assert tracker.version == -1  # the caller must read the region again
    finally:
        await store.aclose()


async def test_region_state_parses_foreign_records_and_leaves_out_quarantined_ones(redis_url: str,
                                                                                 region: str) -> None:
    store = RegionStore.from_url(redis_url, region=region)
    try:
        kept, _ = await store.register(record("dig.own.a1", 0, region), at_ms=now_ms())
        # A foreign writer's records: one valid but without the version spliced in first, one broken.
        foreign = record("dig.own.foreign", 41, region)
        await store.redis.hset(store.key_agents, mapping={"dig.own.foreign": foreign.model_dump_json(),
                                                          "dig.own.broken": '{"agent_id": "dig.own.broken"}'})
        await store.redis.zadd(store.key_leases, {"dig.own.foreign": 7, "dig.own.broken": 8})
        state = await read_region_state(store)
        assert state.version == kept.version
        assert state.agents == {"dig.own.a1": (kept.version, kept.lease_expires_at_ms), "dig.own.foreign": (41, 7)}
        assert [item.agent_id for item in store.quarantine.items()] == ["dig.own.broken"]
        # Quarantined for whatever reason, an agent is in no digest (no peer is served it).
        store.quarantine.add("record", store.record_key("dig.own.a1"), "test", agent_id="dig.own.a1")
        assert set((await read_region_state(store)).agents) == {"dig.own.foreign"}
        assert await store.passed_lease_count(now_ms=now_ms()) == 2
    finally:
        await store.aclose()


# -- publisher --------------------------------------------------------------------------------

def fast_config(region: str, bootstrap_servers: str, peers: list[PeerConfig] | None = None,
                **overrides: Any) -> FederationConfig:
    settings: dict[str, Any] = {
        "region": region, "peers": peers or [], "bootstrap_servers": bootstrap_servers,
        "topic_prefix": f"test-{region}", "beacon_interval_ms": 100, "stale_after_ms": 1_000,
        "request_timeout_ms": 1_000, "retry_backoff_ms": 50, "max_backoff_ms": 200,
        "anti_entropy_min_interval_ms": 100,
    }
    settings.update(overrides)
    return FederationConfig(**settings)


async def test_publisher_holds_the_backlog_while_kafka_is_down_and_sends_it_in_order_after(redis_url: str,
                                                                                          region: str) -> None:
    store = RegionStore.from_url(redis_url, region=region)
    replica_store = ReplicaStore(store.redis, region=region, key_prefix="ar", feed_maxlen=1_000)
    async with EmbeddedKafka() as kafka:
        config = fast_config(region, kafka.bootstrap_servers)
        publisher = Publisher(config, store=store, replica_store=replica_store)
        task = asyncio.create_task(publisher.run())
        try:
            for n in range(5):
                await store.register(record(f"pub.grp.a{n}", 0, region), at_ms=now_ms())
            await wait_for(lambda: publisher.stats.position == 5, timeout_s=10, message="first changes published")

            await kafka.stop()
            failures = publisher.stats.failures
            for n in range(5, 15):
                await store.register(record(f"pub.grp.a{n}", 0, region), at_ms=now_ms())
            await store.deregister("pub.grp.a0", at_ms=now_ms())
            version = await store.version()
            await wait_for(lambda: publisher.stats.failures > failures, timeout_s=10, message="a failed attempt")
            assert await replica_store.published_position() == 5, "acknowledged while Kafka was down"

            await kafka.start()  # empty: the old topic and its records are gone
            await wait_for(lambda: publisher.stats.position == version, timeout_s=15, message="backlog published")
            assert await replica_store.published_position() == version
            messages = await topic_messages(kafka.bootstrap_servers, config.topic(region))
            changes = [m.change.version for m in messages if m.change is not None]
            assert set(range(6, version + 1)) <= set(changes), "a change made while Kafka was down was lost"
            assert changes == sorted(changes), "the backlog went out of order"
            snapshot = await RegionSnapshots(store).snapshot()
            digest, count = region_digest(snapshot.records)

            async def beacon_at_version() -> bool:
                found = await topic_messages(kafka.bootstrap_servers, config.beacon_topic(region))
                return any(m.beacon is not None and m.beacon.watermark == version and m.beacon.digest == digest
                           and m.beacon.live_count == count for m in found)

            await wait_for(beacon_at_version, timeout_s=10, message="a beacon for the final version")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await store.aclose()


# -- nodes: bootstrap, follower, restart ------------------------------------------------------

async def test_new_node_bootstraps_from_the_snapshot_followers_tail_and_restarts_reload(redis_url: str,
                                                                                       region: str) -> None:
    async with EmbeddedKafka() as kafka:
        pair = Pair(redis_url, region, kafka.bootstrap_servers, secret=TEST_SECRET)
        x, y = pair.names
        try:
            node_x, _ = await pair.start(x)
            for n in range(3):
                await node_x.register(registration(f"boot.grp.a{n}", lease_ttl_ms=600_000))
            # A new region's node: everything x had so far arrives by the snapshot, not the topic.
            node_y, federation_y = await pair.start(y)
            await wait_for(lambda: len(federation_y.catalog.peer(x).index) == 3, timeout_s=10, message="bootstrap")
            assert federation_y.anti_entropy.stats.last_reason[x] == "bootstrap"
            assert federation_y.consumer.stats.applied == 0
            status, record_y = await node_y.call("GET", "/v1/agents/boot.grp.a1")
            assert status == 200 and record_y["region"] == x

            # A second node of region y (a follower: the first holds the leader lease) sees x's
            # agents from the replica in Redis and then from the feed.
            follower, federation_f = await pair.start(y, port=0)
            assert not follower.node.leadership.is_leader
            assert len(federation_f.catalog.peer(x).index) == 3
            await node_x.register(registration("boot.grp.late", lease_ttl_ms=600_000))
            await wait_for(lambda: federation_f.catalog.peer(x).index.get("boot.grp.late"), timeout_s=5,
                           message="the follower learns a new remote agent from the feed")
            status, ticket = await follower.resolve(capability="translate.text")
            assert status == 200 and ticket["target"]["region"] == x and ticket["locality"] == "remote"
            assert federation_f.consumer.stats.records == 0  # it never read Kafka itself

            # The leader goes away: the follower takes over the duties and consumes from the
            # offsets the old leader stored, without a new bootstrap.
            pair.running.remove(node_y)
            await node_y.aclose()
            await wait_for(lambda: follower.node.leadership.is_leader, timeout_s=5, message="follower promoted")
            await node_x.register(registration("boot.grp.after", lease_ttl_ms=600_000))
            await wait_for(lambda: federation_f.catalog.peer(x).index.get("boot.grp.after"), timeout_s=5,
                           message="the promoted follower consumes")
            assert federation_f.consumer.stats.applied >= 1
            assert "bootstrap" not in federation_f.anti_entropy.stats.last_reason.values()

            # Everything else gone (x, the broker): a restarted y reloads x's agents from Redis.
            for running in pair.running:
                await running.aclose()
            pair.running.clear()
            await kafka.stop()
            restarted, federation_r = await pair.start(y)
            assert {r.agent_id for r in federation_r.catalog.peer(x).index} == {
                "boot.grp.a0", "boot.grp.a1", "boot.grp.a2", "boot.grp.late", "boot.grp.after"}
            await wait_for(lambda: federation_r.catalog.peer(x).stale, timeout_s=5, message="x stale after silence")
            status, ticket = await restarted.resolve(capability="translate.text")
            assert status == 200 and ticket["target"]["stale"] is True
        finally:
            await pair.aclose()


async def test_a_bootstrap_before_the_peer_node_listens_is_pulled_again_once_it_does(redis_url: str,
                                                                                     region: str) -> None:
    async with EmbeddedKafka() as kafka:
        pair = Pair(redis_url, region, kafka.bootstrap_servers, secret=TEST_SECRET)
        x, y = pair.names
        try:
            # y starts first: x's node does not listen yet, so y's bootstrap snapshot fails and y
            # reads x's topic from its beginning instead, asking for the snapshot again.
            _, federation_y = await pair.start(y)
            await wait_for(lambda: federation_y.anti_entropy.stats.failures >= 1, timeout_s=10,
                           message="y's bootstrap of x failing")
            assert federation_y.anti_entropy.stats.runs == 0
            node_x, _ = await pair.start(x)
            await wait_for(lambda: federation_y.anti_entropy.stats.runs >= 1, timeout_s=10,
                           message="y pulling x's snapshot once x's node listens")
            assert federation_y.anti_entropy.stats.last_reason[x] == "bootstrap retry"
            assert x not in federation_y.anti_entropy.stats.last_error
            await node_x.register(registration("late.grp.a0", lease_ttl_ms=600_000))
            await wait_for(lambda: federation_y.catalog.peer(x).index.get("late.grp.a0"), timeout_s=10,
                           message="x's change reaching y over the topic")
        finally:
            await pair.aclose()


def test_build_node_attaches_federation_only_with_peers(redis_url: str, region: str) -> None:
    single = Topology.model_validate({"kafka": {"bootstrap_servers": "127.0.0.1:1"},
                                      "regions": [{"name": region, "node_urls": ["http://127.0.0.1:1"],
                                                   "redis_url": redis_url}]})
    alone = build_node(single.node_config(region), secret=TEST_SECRET, topology=single)
    assert alone.router.remote is None
    pair = Pair(redis_url, region, "127.0.0.1:1", secret=TEST_SECRET)
    federated = build_node(pair.topology.node_config(pair.names[0]), secret=TEST_SECRET, topology=pair.topology)
    assert isinstance(federated.router.remote, PeerCatalog)
    assert [peer.region for peer in federated.router.remote.peers()] == [pair.names[1]]


async def test_the_replica_store_quarantines_into_the_nodes_quarantine(redis_url: str, region: str) -> None:
    """What a peer's replica does not parse is listed where the node's own is (/v1/admin/quarantine,
    agent_reach_quarantined): the store's quarantine is handed over even while it is empty."""
    store = RegionStore.from_url(redis_url, region=region)
    try:
        replica_store = ReplicaStore(store.redis, region=region, key_prefix="ar", feed_maxlen=1_000,
                                     quarantine=store.quarantine)
        assert not store.quarantine and replica_store.quarantine is store.quarantine
    finally:
        await store.aclose()
