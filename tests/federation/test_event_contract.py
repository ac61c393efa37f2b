"""The Kafka event contract (docs/events.md) on the embedded broker, with two federated regions:
schema version and content type on every record, beacons on their own topic, a tombstone after
every deletion, a compacted replay that rebuilds exactly the live agents, the documented consumer
run unchanged, a newer schema version skipped (counted, logged once) without stopping, and the
federation's metrics moving as the federation works."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer

from federation import BEACON_CONTENT_TYPE, CHANGE_CONTENT_TYPE, SCHEMA_VERSION, ConsumerState
from topology import EmbeddedKafka

from ..conftest import TEST_SECRET
from ..helpers import Pair, registration, topic_records, wait_for
from ..metrics_lint import lint, parse_samples, promtool_problems

ROOT = Path(__file__).resolve().parents[2]


def _compacted(records: list) -> dict[str, bytes]:
    """What log compaction keeps: the last value per key, keys whose last value is null dropped."""
    last: dict[str, bytes | None] = {}
    for record in records:
        last[record.key.decode()] = record.value
    return {key: value for key, value in last.items() if value is not None}


def _value(samples, name: str, **labels: str) -> float | None:
    wanted = set(labels.items())
    found = [value for (sample, have), value in samples.items() if sample == name and wanted <= have]
    return sum(found) if found else None


async def _metrics(running) -> tuple[str, dict]:
    async with running.session.get("/metrics") as response:
        text = await response.text()
    return text, parse_samples(text)


def _example() -> str:
    text = (ROOT / "docs" / "events.md").read_text()
    found = re.search(r"<!-- example: follow_region.py -->\n```python\n(.*?)```", text, re.S)
    assert found, "docs/events.md lost its example"
    return found.group(1)


async def test_contract_compaction_newer_schema_and_federation_metrics(redis_url, region, tmp_path, caplog) -> None:
    async with EmbeddedKafka() as kafka:
        pair = Pair(redis_url, region, kafka.bootstrap_servers, secret=TEST_SECRET)
        x, y = pair.names
        try:
            node_x, federation_x = await pair.start(x)
            node_y, federation_y = await pair.start(y)
            # y has bootstrapped x (an empty snapshot) and reads x's topics from here on: every change
            # below arrives over Kafka.
            await wait_for(lambda: federation_y.consumer.state is ConsumerState.CONSUMING, timeout_s=10,
                           message="y's consumer running")
            for n in range(6):
                await node_x.register(registration(f"kept.grp.a{n}", lease_ttl_ms=600_000))
            await node_x.register(registration("gone.grp.deregistered", lease_ttl_ms=600_000))
            await node_x.register(registration("gone.grp.expired", lease_ttl_ms=1_000))
            await node_x.register(registration("kept.grp.a0", lease_ttl_ms=600_000))  # re-registered: superseded
            status, _ = await node_x.call("DELETE", "/v1/agents/gone.grp.deregistered")
            assert status == 200
            await wait_for(lambda: node_x.node.cache.index.get("gone.grp.expired") is None, timeout_s=10,
                           message="the short lease expired")
            live = sorted(record.agent_id for record in node_x.node.cache.index)
            assert live == [f"kept.grp.a{n}" for n in range(6)]
            version = node_x.node.cache.index.version
            await wait_for(lambda: federation_x.publisher.stats.position == version, timeout_s=10,
                           message="every change published")
            await wait_for(lambda: sorted(r.agent_id for r in federation_y.catalog.peer(x).index) == live, timeout_s=10,
                           message="y's replica of x is the live set")

            changes = await topic_records(kafka.bootstrap_servers, federation_x.config.topic(x))
            values = [record for record in changes if record.value is not None]
            tombstones = [record.key.decode() for record in changes if record.value is None]
            assert sorted(tombstones) == ["gone.grp.deregistered", "gone.grp.expired"]
            for record in values:
                message = orjson.loads(record.value)
                assert message["schema_version"] == SCHEMA_VERSION and "change" in message
                assert dict(record.headers)["content-type"] == CHANGE_CONTENT_TYPE.encode()
                assert record.key.decode() == message["change"]["agent_id"]
            for record in changes:  # each tombstone right after its delete
                if record.value is None:
                    before = orjson.loads(changes[changes.index(record) - 1].value)["change"]
                    assert before["kind"] == "delete" and before["agent_id"] == record.key.decode()

            # Acceptance: a compacted topic (last value per key) rebuilds exactly the live agents.
            compacted = _compacted(changes)
            assert sorted(compacted) == live
            rebuilt = {key: orjson.loads(value)["change"]["record"] for key, value in compacted.items()}
            assert all(rebuilt[agent_id]["version"] == node_x.node.cache.index.get(agent_id).version
                       for agent_id in live)

            beacons = await topic_records(kafka.bootstrap_servers, federation_x.config.beacon_topic(x))
            assert beacons and all(dict(record.headers)["content-type"] == BEACON_CONTENT_TYPE.encode()
                                   and record.key == x.encode() for record in beacons)
            assert all("beacon" in orjson.loads(record.value) for record in beacons)
            assert not any("beacon" in orjson.loads(record.value) for record in values)

            # The documented third-party consumer, unchanged, ends with the live agents.
            script = tmp_path / "follow_region.py"
            script.write_text(_example())
            done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                                  env={**os.environ, "KAFKA": kafka.bootstrap_servers,
                                       "TOPIC": federation_x.config.topic(x)})
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout) == live

            # A value of a newer schema version is skipped (counted, logged once), nothing stops.
            producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
            await producer.start()
            try:
                future = orjson.dumps({"schema_version": SCHEMA_VERSION + 1, "change": {"shape": "unknown"}})
                for _ in range(2):
                    await producer.send_and_wait(federation_x.config.topic(x), future, key=b"kept.grp.a1",
                                                 partition=0)
            finally:
                await producer.stop()
            with caplog.at_level(logging.WARNING, logger="federation.consumer"):
                await wait_for(lambda: federation_y.consumer.stats.newer_schema == 2, timeout_s=10,
                               message="both newer-schema records skipped")
            skipped_lines = [r for r in caplog.records if "newer than the" in r.getMessage()]
            assert len(skipped_lines) == 1, [r.getMessage() for r in skipped_lines]
            await node_x.register(registration("kept.grp.after", lease_ttl_ms=600_000))
            await wait_for(lambda: federation_y.catalog.peer(x).index.get("kept.grp.after"), timeout_s=10,
                           message="changes after the skipped records still apply")
            assert federation_y.consumer.stats.gaps == 0 and federation_y.consumer.stats.invalid == 0

            # The federation's metrics: lint-clean and moving.
            for running in (node_x, node_y):
                text, _ = await _metrics(running)
                assert lint(text) == [], lint(text)
                problems = promtool_problems(text)
                assert problems in (None, []), problems
            _, on_x = await _metrics(node_x)
            assert _value(on_x, "agent_reach_federation_published_total", region=x) >= version
            assert _value(on_x, "agent_reach_federation_tombstones_sent_total", region=x) == 2
            assert _value(on_x, "agent_reach_federation_beacons_sent_total", region=x) >= 1
            assert _value(on_x, "agent_reach_federation_publisher_backlog_events", region=x) is not None
            _, on_y = await _metrics(node_y)
            peer = {"region": y, "peer": x}
            assert _value(on_y, "agent_reach_federation_consumer_records_total", region=y) >= version
            assert _value(on_y, "agent_reach_federation_consumer_applied_total", region=y) >= 1
            assert _value(on_y, "agent_reach_federation_records_skipped_total", region=y, reason="tombstone") == 2
            assert _value(on_y, "agent_reach_federation_records_skipped_total", region=y, reason="newer_schema") == 2
            assert _value(on_y, "agent_reach_federation_peer_stale", **peer) == 0
            assert _value(on_y, "agent_reach_federation_peer_agents", **peer) == len(live) + 1
            assert _value(on_y, "agent_reach_federation_anti_entropy_runs_total", **peer) >= 1  # the bootstrap
            assert 0 <= _value(on_y, "agent_reach_federation_beacon_age_seconds", **peer) < 5
            assert _value(on_y, "agent_reach_federation_versions_behind", **peer) is not None
            assert _value(on_y, "agent_reach_federation_consumer_lag_events", **peer) is not None
            assert _value(on_y, "agent_reach_federation_consumer_lag_seconds", **peer) is not None

            # Kafka away: publisher and consumer failures counted; the peer goes stale, lag grows.
            await kafka.stop()
            await node_x.register(registration("kept.grp.during", lease_ttl_ms=600_000))

            async def failing() -> bool:
                _, now_x = await _metrics(node_x)
                _, now_y = await _metrics(node_y)
                seen = (_value(now_x, "agent_reach_federation_publisher_failures_total", region=x),
                        _value(now_x, "agent_reach_federation_publisher_backlog_events", region=x),
                        _value(now_y, "agent_reach_federation_peer_stale", **peer))
                return seen if seen[0] >= 1 and seen[1] >= 1 and seen[2] == 1 else False

            await wait_for(failing, timeout_s=20, message="failures, backlog and staleness on /metrics")
            await kafka.start()
            await wait_for(lambda: federation_y.catalog.peer(x).index.get("kept.grp.during"), timeout_s=30,
                           message="the backlog reaches y once Kafka is back")
        finally:
            await pair.aclose()
