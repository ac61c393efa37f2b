"""Whatever a route accepts reads back: a property test over hostile registrations and heartbeats.

Hypothesis generates request bodies the way an attacker writes them — NaN, ±Infinity, 1e400,
integers past 64 bits, booleans and strings where numbers belong, control characters, odd URLs
— mixed with valid ones, and sends each to a real node (region x of a federated pair on the
real redis-server and the embedded Kafka broker). A refused request must be a 4xx JSON error
that changed nothing. An accepted one must read back, equal to what was sent, from Redis, the
change stream, the ``/v1/watch`` stream, the peer region's replica (so it crossed Kafka), the
federation snapshot, and finally from a node restarted over the same Redis.

The nodes run in an event loop on a thread of their own, so each Hypothesis example is an
ordinary call and failing examples shrink.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from node.core.models import AgentRecord, ChangeEvent, Snapshot, TokenRole
from node.service import RegistryNode
from topology.embedded import EmbeddedKafka

from ..conftest import TEST_SECRET
from ..helpers import Pair, Watcher, wait_for

T = TypeVar("T")
AGENT_IDS = [f"prop.grp.a{n}" for n in range(6)]
EXAMPLES = 300
STEP_TIMEOUT_S = 20.0


# -- strategies -------------------------------------------------------------------------------
# Half of the requests are valid (their read-back is checked), the other half valid but for ONE
# field, which holds a hostile value (its refusal — or, where the value is legal, its exact
# read-back — is checked). One bad field at a time is what finds coercions and poisoned values.

def one_hostile_field(valid: st.SearchStrategy[dict[str, Any]],
                      hostile: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    names = sorted(hostile)
    spoiled = st.tuples(valid, st.sampled_from(names)).flatmap(
        lambda pair: hostile[pair[1]].map(lambda value: {**pair[0], pair[1]: value}))
    return st.one_of(valid, spoiled)


HOSTILE_NUMBERS = [float("inf"), float("-inf"), float("nan"), 2**63, 2**70, 10**400, -1, True, False, "5000",
                   None, 1.5, 100.0, [1], {"n": 1}]
hostile_numbers = st.one_of(st.sampled_from(HOSTILE_NUMBERS), st.integers(min_value=-(2**80), max_value=2**80),
                            st.floats(allow_nan=True, allow_infinity=True))
CONTROL = ["\x00", "\r\n", "\n", "\x1b[31m", "\x7f", "\x85", "\u2028"]
line_text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=0x2000,
                                           exclude_characters="\x7f\x85\u2028\u2029"), max_size=40)
prose = st.text(alphabet=st.characters(min_codepoint=9, max_codepoint=0x2000,
                                       exclude_characters="\x0b\x0c\x0d\x7f\x85") .filter(
    lambda c: c in "\t\n" or c >= " "), max_size=80)
hostile_text = st.one_of(
    st.builds(lambda head, bad, tail: head + bad + tail, line_text, st.sampled_from(CONTROL), line_text),
    st.text(max_size=40), hostile_numbers, st.text(min_size=5_000, max_size=5_001))
valid_urls = st.builds(lambda port, path: f"http://127.0.0.1:{port}/{path}", st.integers(min_value=1, max_value=65_535),
                       st.sampled_from(["", "agent", "a/b?c=d", "%7Euser"]))
hostile_urls = st.one_of(
    st.builds(lambda scheme, host, port: f"{scheme}://{host}:{port}/", st.sampled_from(["http", "https", "ftp", "file"]),
              st.sampled_from(["169.254.169.254", "user:pw@127.0.0.1", "", "127.0.0.1\r\nX: y", "127.0.0.1 x"]),
              st.integers(min_value=-1, max_value=70_000)),
    hostile_text)
valid_capabilities = st.lists(st.fixed_dictionaries(
    {"name": st.sampled_from(["prop.cap", "prop.other", "prop:img/search"])},
    optional={"version": st.sampled_from(["1", "v2", "1.4.0", "3.0"]), "description": prose,
              "tags": st.lists(line_text, max_size=3), "examples": st.lists(prose, max_size=2)}),
    max_size=3, unique_by=lambda capability: capability["name"])
hostile_capability = st.fixed_dictionaries({"name": st.just("prop.cap")}).flatmap(
    lambda base: st.one_of(
        hostile_text.map(lambda bad: {"name": bad}),
        hostile_text.map(lambda bad: {**base, "version": bad}),
        hostile_text.map(lambda bad: {**base, "tags": [bad]}),
        hostile_text.map(lambda bad: {**base, "description": bad})))
valid_registrations = st.fixed_dictionaries(
    {"agent_id": st.sampled_from(AGENT_IDS), "endpoints": st.builds(lambda url: {"primary": url}, valid_urls)},
    optional={"display_name": line_text, "description": prose, "capabilities": valid_capabilities,
              "labels": st.dictionaries(st.sampled_from(["env", "zone", "team"]), line_text, max_size=3),
              "weight": st.integers(min_value=0, max_value=10_000),
              "lease_ttl_ms": st.integers(min_value=600_000, max_value=3_600_000),
              "max_concurrency": st.integers(min_value=1, max_value=1_000),
              "allowed_callers": st.lists(st.sampled_from(["fin.*.*", "admin", "ops.*.x"]), max_size=2, unique=True),
              "status": st.sampled_from(["ready", "busy", "degraded"]), "callback_endpoint": valid_urls})
registrations = one_hostile_field(valid_registrations, {
    "agent_id": hostile_text, "display_name": hostile_text, "description": hostile_text,
    "endpoints": st.one_of(hostile_urls.map(lambda url: {"primary": url}),
                           st.dictionaries(st.sampled_from(["external", "Bad Name"]), valid_urls, max_size=2)),
    "callback_endpoint": hostile_urls,
    "capabilities": hostile_capability.map(lambda capability: [capability]),
    "labels": st.one_of(hostile_text.map(lambda bad: {"env": bad}), hostile_text.map(lambda bad: {str(bad): "x"})),
    "weight": hostile_numbers, "lease_ttl_ms": hostile_numbers, "max_concurrency": hostile_numbers,
    "allowed_callers": hostile_text.map(lambda bad: [bad]), "status": st.sampled_from(["asleep", 3, None, "READY"]),
    "unknown_field": st.just(1),
})
valid_loads = st.fixed_dictionaries({}, optional={"queued": st.integers(min_value=0, max_value=10_000),
                                                  "inflight": st.integers(min_value=0, max_value=10_000),
                                                  "rps": st.floats(min_value=0, max_value=1e6)})
valid_heartbeats = st.fixed_dictionaries(
    {}, optional={"status": st.sampled_from(["ready", "degraded", "busy", "draining", "unready"]), "load": valid_loads})
heartbeats = one_hostile_field(valid_heartbeats, {
    "status": st.sampled_from(["zombie", 5, None, "Ready"]),
    "load": st.one_of(hostile_numbers, st.sampled_from(["queued", "inflight", "rps"]).flatmap(
        lambda name: hostile_numbers.map(lambda bad: {name: bad}))),
})
actions = st.one_of(
    st.tuples(st.just("register"), registrations),
    st.tuples(st.just("heartbeat"), st.tuples(st.sampled_from(AGENT_IDS), heartbeats)),
)


# -- the live region --------------------------------------------------------------------------

@dataclass
class Accepted:
    version: int
    lease_expires_at_ms: int
    record: dict[str, Any]  # what was sent (registration fields) or the last accepted state


@dataclass
class LiveRegion:
    """A federated pair in an event loop on its own thread; ``run`` awaits a coroutine there."""

    redis_url: str
    region: str
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    accepted: dict[str, Accepted] = field(default_factory=dict)
    refused: dict[int, int] = field(default_factory=dict)
    registrations_accepted: int = 0
    heartbeats_accepted: int = 0

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = STEP_TIMEOUT_S) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    async def start(self) -> None:
        self.kafka = EmbeddedKafka()
        await self.kafka.start()
        self.pair = Pair(self.redis_url, self.region, self.kafka.bootstrap_servers, secret=TEST_SECRET)
        self.x, self.y = self.pair.names
        self.node_x, _ = await self.pair.start(self.x)
        self.node_y, self.federation_y = await self.pair.start(self.y)
        self.watcher = Watcher(self.node_x.session, "/v1/watch", self.node_x.admin_token)
        await self.watcher.__aenter__()

    async def stop(self) -> None:
        await self.watcher.__aexit__(None, None, None)
        await self.pair.aclose()
        await self.kafka.aclose()

    # -- one example -----------------------------------------------------------------------

    async def register(self, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()  # NaN and Infinity as an attacker writes them
        agent_id = body["agent_id"] if isinstance(body.get("agent_id"), str) else None
        before = await self._stored(agent_id)
        status, reply = await self.node_x.call("POST", "/v1/agents", data=raw,
                                               headers={"Content-Type": "application/json"})
        if status >= 400:
            await self._refused(status, reply, agent_id, before)
            return
        assert status in (200, 201), (status, reply)
        assert agent_id is not None
        version = reply["version"]
        self.accepted[agent_id] = Accepted(version, reply["lease_expires_at_ms"], body)
        self.registrations_accepted += 1
        stored = await self._stored(agent_id)
        assert stored is not None and stored.version == version
        _assert_same_registration(stored, body)
        await self._check_everywhere(agent_id, version, stored)

    async def heartbeat(self, agent_id: str, body: dict[str, Any]) -> None:
        before = await self._stored(agent_id)
        token = self.node_x.token(agent_id, TokenRole.AGENT)
        status, reply = await self.node_x.call("PUT", f"/v1/agents/{agent_id}/heartbeat", token=token,
                                               data=json.dumps(body).encode(),
                                               headers={"Content-Type": "application/json"})
        if status >= 400:
            await self._refused(status, reply, agent_id, before)
            return
        assert status == 200 and before is not None, (status, reply)
        self.heartbeats_accepted += 1
        stored = await self._stored(agent_id)
        assert stored is not None and stored.version == reply["version"]
        if isinstance(body.get("load"), dict):
            for name, value in body["load"].items():
                kept = getattr(stored.load, name)
                # rps is a JSON number (5 and 5.0 are the same); the counts must be integers as sent.
                assert kept == value if name == "rps" else _identical(kept, value), (name, value, stored.load)
        if body.get("status") is not None:  # null: no change
            assert stored.status.value == body["status"]
        self.accepted[agent_id].lease_expires_at_ms = reply["lease_expires_at_ms"]
        if reply["changed"]:
            self.accepted[agent_id].version = reply["version"]
            await self._check_everywhere(agent_id, reply["version"], stored)

    async def _refused(self, status: int, reply: Any, agent_id: str | None, before: AgentRecord | None) -> None:
        self.refused[status] = self.refused.get(status, 0) + 1
        assert 400 <= status < 500, (status, reply)
        assert isinstance(reply, dict) and {"error", "message", "field"} <= reply.keys(), reply
        after = await self._stored(agent_id)
        assert (after.version if after else None) == (before.version if before else None), "a refusal wrote"

    async def _stored(self, agent_id: str | None) -> AgentRecord | None:
        if agent_id is None or agent_id not in AGENT_IDS:
            return None
        return await self.node_x.node.store.get(agent_id)

    async def _check_everywhere(self, agent_id: str, version: int, stored: AgentRecord) -> None:
        store = self.node_x.node.store
        changes = await store.read_changes(after_version=version - 1, count=1)
        assert changes and changes[0].version == version and changes[0].record is not None
        assert _comparable(changes[0].record) == _comparable(stored)

        def watched() -> dict[str, Any] | None:
            return next((c for c in self.watcher.changes() if c["version"] == version), None)

        event = ChangeEvent.model_validate(await wait_for(watched, message=f"version {version} on the watch"))
        assert event.record is not None and _comparable(event.record) == _comparable(stored)
        assert not self.watcher.ended

        peer = self.federation_y.catalog.peer(self.x)

        def replicated() -> AgentRecord | None:
            record = peer.index.get(agent_id)
            return record if record is not None and record.version >= version else None

        remote = await wait_for(replicated, timeout_s=10, message=f"{agent_id} v{version} in the peer's replica")
        if remote.version == version:
            assert _comparable(remote) == _comparable(stored)

        status, body = await self.node_x.call("GET", "/v1/federation/snapshot")
        assert status == 200
        snapshot = Snapshot.model_validate(body)
        served = {record.agent_id: record for record in snapshot.agents}
        assert served[agent_id].version >= version

    async def check_restart(self) -> None:
        """A node started over the same Redis holds every accepted agent still leased."""
        config = self.pair.topology.node_config(self.x, port=0)
        async with RegistryNode(config, secret=TEST_SECRET) as restarted:
            soon = int(time.time() * 1000) + 5_000
            for agent_id, accepted in self.accepted.items():
                record = restarted.cache.index.get(agent_id)
                if accepted.lease_expires_at_ms > soon:
                    assert record is not None and record.version >= accepted.version, agent_id
            assert len(restarted.store.quarantine) == 0
        for running in (self.node_x, self.node_y):
            assert len(running.node.store.quarantine) == 0, running.node.store.quarantine.items()


def _comparable(record: AgentRecord) -> dict[str, Any]:
    """A record without the lease (moved by heartbeats outside the record) for comparisons."""
    return record.model_dump(exclude={"lease_expires_at_ms"})


def _assert_same_registration(stored: AgentRecord, body: dict[str, Any]) -> None:
    """The stored record holds exactly what was sent (no coercion, nothing lost)."""
    for name in ("display_name", "description", "labels", "weight", "max_concurrency", "allowed_callers",
                 "callback_endpoint", "endpoints", "lease_ttl_ms"):
        if name in body:
            assert _identical(getattr(stored, name), body[name]), (name, body[name], getattr(stored, name))
    if "status" in body:
        assert stored.status.value == body["status"]
    if "capabilities" in body:
        sent = [{key: value for key, value in capability.items()} for capability in body["capabilities"]]
        kept = [capability.model_dump(include=set(capability_sent)) for capability, capability_sent
                in zip(stored.capabilities, sent)]
        assert _identical(kept, sent)


def _identical(kept: Any, sent: Any) -> bool:
    """Equal as JSON: ``True`` is not ``1`` and ``100.0`` is not ``100`` (no coercion happened)."""
    return json.dumps(kept, sort_keys=True) == json.dumps(sent, sort_keys=True)


@pytest.fixture(scope="module")
def live(redis_url: str) -> Iterator[LiveRegion]:
    region = LiveRegion(redis_url, f"prop{int(time.time() * 1000) % 1_000_000}")
    thread = threading.Thread(target=region.loop.run_forever, name="roundtrip-loop", daemon=True)
    thread.start()
    try:
        region.run(region.start(), timeout_s=60)
        yield region
        region.run(region.stop(), timeout_s=60)
    finally:
        region.loop.call_soon_threadsafe(region.loop.stop)
        thread.join(timeout=10)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(action=actions)
def test_what_a_route_accepts_reads_back_everywhere(live: LiveRegion, action: tuple[str, Any]) -> None:
    kind, payload = action
    note(f"{kind} {json.dumps(payload)[:2_000]}")
    if kind == "register":
        live.run(live.register(payload))
    else:
        agent_id, body = payload
        live.run(live.heartbeat(agent_id, body))


def test_accepted_records_survive_a_restart_and_nothing_was_quarantined(live: LiveRegion) -> None:
    # Runs after the property (same module fixture): the region holds what it accepted.
    assert live.accepted, "the property accepted no registration at all: the strategies are too hostile"
    live.run(live.check_restart(), timeout_s=60)
    print(f"\nround trip: {live.registrations_accepted} registrations of {len(live.accepted)} agents and "
          f"{live.heartbeats_accepted} heartbeats accepted and read back; refused by status: {live.refused}")
