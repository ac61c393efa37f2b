"""The region's stored bytes read back as bytes, each value decoded on its own.

redis-py decodes a whole reply at once, so one value that is not UTF-8 — written by something
other than this project's scripts, or damaged — failed the whole read: the cache's tail died on
such a change entry, and such a record failed every digest and the snapshot served to peers. The
store reads those replies as bytes (``NEVER_DECODE``; a MULTI/EXEC reply is always decoded, so the
region's consistent read is one script here, :func:`read_region`) and a value that does not
decode is quarantined like any other that does not parse: :func:`parse_change` for a change
entry, :func:`parse_record` for a record.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

import orjson
import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.client import NEVER_DECODE
from redis.exceptions import NoScriptError

from ..core import first_problem, now_ms
from ..core.models import AGENT_ID_RE, AgentRecord, ChangeEvent, ChangeKind, DeleteReason, Load
from .quarantine import RECORD, Quarantine
from .stored_records import WrittenRecords, read_record

__all__ = ["parse_change", "parse_record", "problem_of", "read_region", "text_of"]

Raw = str | bytes

# KEYS: the region version, the records hash, the leases zset: the three at one instant.
_READ_REGION = """
return {redis.call('GET', KEYS[1]) or false, redis.call('HGETALL', KEYS[2]),
        redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')}
"""
_READ_REGION_SHA = hashlib.sha1(_READ_REGION.encode()).hexdigest()


async def read_region(redis: aioredis.Redis, keys: tuple[str, str, str]
                      ) -> tuple[int, dict[bytes, bytes], dict[str, int]]:
    """The region version, every stored record (bytes, by agent id as bytes) and every lease, read
    at one instant (one script, as MULTI/EXEC was)."""
    command = ("EVALSHA", _READ_REGION_SHA, 3, *keys)
    try:
        reply = await redis.execute_command(*command, **{NEVER_DECODE: True})
    except NoScriptError:  # a restarted or replaced Redis: load it, the same sha runs it
        await redis.script_load(_READ_REGION)
        reply = await redis.execute_command(*command, **{NEVER_DECODE: True})
    version, flat_records, flat_leases = reply
    records = dict(zip(flat_records[::2], flat_records[1::2]))
    leases = {text_of(member): int(float(score)) for member, score in zip(flat_leases[::2], flat_leases[1::2])}
    return int(version or 0), records, leases


def parse_change(entry_id: Raw, raw_fields: Mapping[Raw, Raw], *, region: str, stream_key: str,
                 written: WrittenRecords, quarantine: Quarantine,
                 record_key: Callable[[str], str]) -> ChangeEvent | None:
    """One change-stream entry as a :class:`ChangeEvent`.

    An entry that does not parse is quarantined: it reads as the deletion of its agent (reason
    ``quarantined``: the agent's stored record is not to be trusted), or as nothing when even its
    agent id is unusable (readers then see a version gap and reload). ``record_key(agent_id)``
    names the agent's record in the quarantine, resolved when a change carries a record that reads.
    """
    version = int(text_of(entry_id).split("-", 1)[0])
    fields = {text_of(name): value for name, value in raw_fields.items()}
    agent_id = text_of(fields.get("agent_id", ""))
    try:
        texts = {name: value if isinstance(value, str) else value.decode() for name, value in fields.items()}
        kind = ChangeKind(texts["kind"])
        at_ms = int(texts["at"])
        record = None
        reason = None
        audience = None
        if kind is ChangeKind.DELETE:
            reason = DeleteReason(texts["reason"])
            audience = orjson.loads(texts.get("acl") or "[]")
        else:
            record = written.recall(agent_id, version, texts["record"])
        change = ChangeEvent(kind=kind, region=region, version=version, agent_id=agent_id, at_ms=at_ms,
                             record=record, reason=reason, allowed_callers=audience)
    except (KeyError, ValueError, orjson.JSONDecodeError) as exc:  # ValidationError, UnicodeDecodeError: ValueErrors
        usable_id = bool(AGENT_ID_RE.match(agent_id))
        quarantine.add("change", f"{stream_key}@{version}", problem_of(exc), agent_id=agent_id if usable_id else None)
        if not usable_id:
            return None
        return ChangeEvent(kind=ChangeKind.DELETE, region=region, version=version, agent_id=agent_id,
                           at_ms=now_ms(), reason=DeleteReason.QUARANTINED)
    if record is not None:
        quarantine.resolve(record_key(agent_id))
    return change


def parse_record(agent_id: str, raw: Raw, *, lease_expires_at_ms: int | None, load: Load | None,
                 quarantine: Quarantine, record_key: Callable[[str], str]) -> AgentRecord | None:
    """A stored record, or None (quarantined under ``record_key(agent_id)``) when it does not parse
    or names another agent."""
    try:
        record = read_record(raw, lease_expires_at_ms=lease_expires_at_ms, load=load)
        if record.agent_id != agent_id:
            raise ValueError(f"the record names agent {record.agent_id!r}")
    except ValueError as exc:  # pydantic's ValidationError included
        # Only a foreign writer or a schema change can get here: skip it, say which key.
        quarantine.add(RECORD, record_key(agent_id), problem_of(exc), agent_id=agent_id)
        return None
    if quarantine:  # something is held: this key's value may have been one of them
        quarantine.resolve(record_key(agent_id))
    return record


def problem_of(exc: Exception) -> str:
    """What the quarantine says of a stored value that does not parse."""
    if isinstance(exc, ValidationError):
        return first_problem(exc).line()
    if isinstance(exc, KeyError):
        return f"missing field {exc}"
    return str(exc)


def text_of(value: Raw) -> str:
    """A name or id (an entry's field, an agent id) as text; bytes that are not UTF-8 read with
    replacement characters."""
    return value if isinstance(value, str) else value.decode(errors="replace")
