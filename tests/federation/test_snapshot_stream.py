"""The federation snapshot streams (``node.http.snapshot_stream``, ``federation.snapshot_reader``):
one JSON document, one record per line, written a chunk at a time and read a record at a time."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import orjson
import pytest

import node.http.snapshot_stream as snapshot_stream
from federation.snapshot_reader import _lines, read_snapshot
from node.core import now_ms
from node.core.models import AgentRecord, TokenRole

from ..conftest import NodeFactory
from ..helpers import registration, wait_for

AGENTS = 300  # above Redis' small-hash encoding, so HSCAN returns several chunks of CHUNK


async def _pieces(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start:start + size]


def _collect(bad: list[tuple[int, str | None, str]]):
    return lambda position, agent_id, problem: bad.append((position, agent_id, problem))


async def test_the_snapshot_is_one_document_written_and_read_a_record_at_a_time(
        node_factory: NodeFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot_stream, "CHUNK", 16)
    node = await node_factory(sweep_interval_ms=600_000)  # the passed lease stays stored
    for n in range(AGENTS):
        await node.register(registration(f"snap.stream.a{n}", capability="snap.stream", lease_ttl_ms=60_000))
    await node.register(registration("snap.stream.short", capability="snap.stream", lease_ttl_ms=1_000))
    await wait_for(lambda: node.node.store.expired_ids(now_ms=now_ms(), limit=1), message="the short lease to pass")
    peer = node.token("peer.region", TokenRole.PEER)
    async with node.session.get("/v1/federation/snapshot", headers={"Authorization": f"Bearer {peer}"}) as response:
        assert response.status == 200 and response.headers["Transfer-Encoding"] == "chunked"
        body = await response.read()
    whole = orjson.loads(body)  # what any JSON parser (and an older peer) reads
    ids = {agent["agent_id"] for agent in whole["agents"]}
    assert ids == {f"snap.stream.a{n}" for n in range(AGENTS)}  # the passed lease is left out
    assert whole["region"] == node.node.region and whole["watermark"] == await node.node.store.version()
    lines = body.split(b"\n")
    assert len(lines) == AGENTS + 2 and lines[0].endswith(b'"agents":[') and lines[-1] == b"]}"

    bad: list[tuple[int, str | None, str]] = []
    for size in (7, 4096, len(body)):
        streamed = await read_snapshot(_pieces(body, size), bad_record=_collect(bad))
        assert {agent.agent_id for agent in streamed.agents} == ids and streamed.watermark == whole["watermark"]
        assert all(isinstance(agent, AgentRecord) for agent in streamed.agents)
    assert bad == []


async def test_the_reader_refuses_a_cut_stream_skips_a_bad_record_and_reads_one_line() -> None:
    head = b'{"region":"r1","watermark":9,"taken_at_ms":1,"agents":['
    good = registration("snap.read.a1", capability="snap.read") | {
        "region": "r1", "version": 3, "registered_at_ms": 1, "updated_at_ms": 1, "lease_expires_at_ms": 10}
    record = orjson.dumps(good)
    broken = orjson.dumps(good | {"agent_id": "snap.read.a2", "weight": -5})
    bad: list[tuple[int, str | None, str]] = []

    streamed = await read_snapshot(_pieces(b"\n".join([head, record + b",", broken, b"]}"]), 5),
                                   bad_record=_collect(bad))
    assert [agent.agent_id for agent in streamed.agents] == ["snap.read.a1"] and streamed.watermark == 9
    assert len(bad) == 1 and bad[0][:2] == (1, "snap.read.a2") and "greater than or equal to 0" in bad[0][2]

    with pytest.raises(orjson.JSONDecodeError, match="ended before"):
        await read_snapshot(_pieces(b"\n".join([head, record + b","]), 64), bad_record=_collect(bad))

    one_line = head + record + b"]}"  # an older node's layout: read whole
    streamed = await read_snapshot(_pieces(one_line, 3), bad_record=_collect(bad))
    assert [agent.agent_id for agent in streamed.agents] == ["snap.read.a1"]
    with pytest.raises(orjson.JSONDecodeError):
        await read_snapshot(_pieces(b'{"region":"r1"', 3), bad_record=_collect(bad))


@pytest.mark.unit
async def test_reading_a_long_line_costs_its_length_not_its_length_squared() -> None:
    # An older node's one-line snapshot (or a peer's line that never ends) was read by adding each
    # chunk to the line so far and splitting all of it again: 20 MB in 64 KiB chunks took 6 s of
    # the event loop, 70 MB (100,000 agents) over a minute, past the snapshot's timeout.
    one_line = b"x" * 30_000_000
    started = time.perf_counter()
    lines = [line async for line in _lines(_pieces(one_line, 65_536))]
    elapsed_s = time.perf_counter() - started
    assert lines == [one_line] and elapsed_s < 1.5, elapsed_s
    body = b"\n".join([b"a", b"", b"bc" * 40_000, b"d"]) + b"\n"
    for size in (1, 2, 7, 65_536):
        assert [line async for line in _lines(_pieces(body, size))] == [b"a", b"", b"bc" * 40_000, b"d"]
