"""A rolling upgrade of a region's replicas: records a newer replica writes, with fields this
version does not know, are served by the older replicas instead of quarantined (``node.core.models.compat``)."""

from __future__ import annotations

from typing import Any

import orjson

from node.core.models import AgentRecord
from node.store import RegionStore
from node.store.region import now_ms

from ..helpers import registration, wait_for
from ..metrics_lint import parse_samples


async def _write_as_newer(store: RegionStore, agent_id: str) -> None:
    """A record and its change entry as a newer replica writes them: with fields added."""
    version = int(await store.redis.incr(store.key_version))
    now = now_ms()
    record: dict[str, Any] = AgentRecord.model_validate({
        **registration(agent_id, capability="upgrade.cap"), "region": store.region, "version": version,
        "registered_at_ms": now, "updated_at_ms": now, "lease_expires_at_ms": now + 600_000,
    }).model_dump(mode="json")
    record["zone_hint"] = "eu-west-1a"
    record["capabilities"][0]["cost_hint"] = {"per_call_usd": 0.002}
    raw = orjson.dumps(record).decode()
    async with store.redis.pipeline(transaction=True) as pipe:
        pipe.hset(store.key_agents, agent_id, raw)
        pipe.zadd(store.key_leases, {agent_id: now + 600_000})
        pipe.xadd(store.key_changes, {"kind": "upsert", "agent_id": agent_id, "at": str(now), "record": raw},
                  id=f"{version}-0")
        await pipe.execute()


async def test_an_older_replica_serves_what_a_newer_one_wrote(redis_url: str, region: str, node_factory) -> None:
    store = RegionStore.from_url(redis_url, region=region)
    try:
        await _write_as_newer(store, "upgrade.grp.before")  # before the older replica starts: its snapshot
        running = await node_factory()
        await _write_as_newer(store, "upgrade.grp.while")  # while it runs: its change-stream tail
        await wait_for(lambda: running.node.cache.index.get("upgrade.grp.while") is not None, timeout_s=10,
                       message="the older replica's cache holds the newer replica's later record")
        for agent_id in ("upgrade.grp.before", "upgrade.grp.while"):
            status, body = await running.call("GET", f"/v1/agents/{agent_id}")
            assert status == 200, body
            assert "zone_hint" not in body and "cost_hint" not in body["capabilities"][0]
        seen = set()
        for _ in range(20):
            status, ticket = await running.resolve(capability="upgrade.cap")
            assert status == 200, ticket
            seen.add(ticket["target"]["agent_id"])
        assert seen == {"upgrade.grp.before", "upgrade.grp.while"}
        assert len(running.node.store.quarantine) == 0
        async with running.session.get("/metrics") as response:
            samples = parse_samples(await response.text())
        dropped = sum(value for (name, _), value in samples.items() if name == "agent_reach_unknown_fields_dropped_total")
        assert dropped >= 4  # two fields of each record, at least once each
    finally:
        await store.aclose()
