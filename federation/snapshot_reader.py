"""Reading a peer's snapshot as it arrives (the node's ``node.http.snapshot_stream`` layout).

The document is ``{"region", "watermark", "taken_at_ms", "agents": [...]}`` with the head on the
first line and one record per line after it, ending with a line ``]}``. Each record is validated
when its line is complete, so a 100,000-agent snapshot is never one 70 MB string here; a record
that does not parse is handed to ``bad_record`` and left out (the replica then lacks it, as if the
peer did), not a reason to refuse the rest. A document in any other layout — a node that answers
with one line, say — is read whole and parsed as JSON: the same result, the old way. A document
that ends early (the serving node lost its Redis and cut the stream) does not parse.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable

import orjson
from pydantic import ValidationError

from node.core import BodyTooLarge, at_most, first_problem
from node.core.models import AgentRecord, Snapshot, compat
from node.http import END, HEAD_END

__all__ = ["SnapshotTooLarge", "read_snapshot"]

BadRecord = Callable[[int, "str | None", str], None]  # position, agent_id if known, the problem


class SnapshotTooLarge(BodyTooLarge):
    """The document went on past the reader's ``max_bytes``: a peer's snapshot is not read whole at any size."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit, f"the snapshot is larger than {limit:,} bytes (snapshot_max_bytes)")


async def read_snapshot(body: AsyncIterable[bytes], *, bad_record: BadRecord,
                        max_bytes: int | None = None) -> Snapshot:
    """The snapshot in ``body`` (chunks of bytes as they arrive); raises ``orjson.JSONDecodeError``
    or ``ValidationError`` when it is no snapshot, :class:`SnapshotTooLarge` past ``max_bytes``."""
    lines = _lines(body if max_bytes is None else at_most(body, max_bytes, too_large=SnapshotTooLarge))
    head = await anext(lines, b"")
    if not head.rstrip().endswith(HEAD_END):
        rest = [line async for line in lines]
        return _whole(b"\n".join([head, *rest]), bad_record)
    fields = orjson.loads(head.rstrip() + END)
    agents: list[AgentRecord] = []
    position = 0
    async for line in lines:
        line = line.strip()
        if line == END:
            return compat.read_python(Snapshot, {**fields, "agents": agents})
        if not line:
            continue
        record = _record(line.removesuffix(b","), position, bad_record)
        if record is not None:
            agents.append(record)
        position += 1
    raise orjson.JSONDecodeError("the snapshot ended before its last record (the stream was cut)", "", 0)


def _record(raw: bytes, position: int, bad_record: BadRecord) -> AgentRecord | None:
    try:
        return compat.read_json(AgentRecord, raw)
    except ValidationError as exc:
        try:
            item = orjson.loads(raw)
        except orjson.JSONDecodeError:
            item = None
        agent_id = item.get("agent_id") if isinstance(item, dict) else None
        bad_record(position, agent_id if isinstance(agent_id, str) else None, first_problem(exc).message)
        return None


def _whole(body: bytes, bad_record: BadRecord) -> Snapshot:
    data = orjson.loads(body)
    if not isinstance(data, dict) or not isinstance(data.get("agents"), list):
        raise orjson.JSONDecodeError("a snapshot is an object with an 'agents' list", "", 0)
    agents = []
    for position, item in enumerate(data["agents"]):
        try:
            agents.append(compat.read_python(AgentRecord, item))
        except ValidationError as exc:
            agent_id = item.get("agent_id") if isinstance(item, dict) else None
            bad_record(position, agent_id if isinstance(agent_id, str) else None, first_problem(exc).message)
    return compat.read_python(Snapshot, {**data, "agents": agents})


async def _lines(body: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The lines of ``body`` without their newlines (the last one even if it has none).

    Linear in the body's size however long a line is: a line's pieces are joined once, at its end.
    (Adding each chunk to the line so far and splitting it again copied and scanned the whole line
    per chunk: an older node's one-line snapshot of 20 MB took 6 s, 70 MB more than a minute.)
    """
    pieces: list[bytes] = []
    async for chunk in body:
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            pieces.append(chunk[start:end])
            yield b"".join(pieces)
            pieces = []
            start = end + 1
        if start < len(chunk):
            pieces.append(chunk[start:])
    if pieces:
        yield b"".join(pieces)
