"""Sessions under load, for ``bench.peers`` and ``bench.scale``: many agents' lease renewals and
load reports over ``GET /v1/session``, driven from this process against a node process, and the
time a killed SDK agent stays routable.

The driver speaks the session's frames itself (``node.http.sessions``), as the SDK's
``NodeSession`` does, without an SDK thread per agent: agents join with the admin token (a
session may carry any agent for it), and every figure is the node's CPU (``/proc``) per renewal
acknowledged, next to the same run's HTTP heartbeat.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp
import orjson

from .resolve import cpu_seconds

SESSION_PATH = "/v1/session"
AGENTS_PER_SESSION = 1_000  # the node's MAX_MEMBERS


def agent_ids(count: int, *, prefix: str = "bench") -> list[str]:
    """The ids ``bench.resolve.populate`` (``prefix`` bench) and ``bench.scale`` (scale) store."""
    return [f"{prefix}.pool{i % 50}.a{i}" for i in range(count)]


@dataclass
class Session:
    """One open session: its agents, and the frames waiting for their answer."""

    ws: aiohttp.ClientWebSocketResponse
    agents: list[str]
    waiting: dict[int, asyncio.Future[dict[str, object]]] = field(default_factory=dict)
    acknowledged: int = 0
    errors: int = 0
    reader: asyncio.Task[None] | None = None
    joined: asyncio.Future[dict[str, object]] | None = None


class SessionLoad:
    """``sessions`` sessions with ``agents`` spread over them, joined; an async context manager."""

    def __init__(self, url: str, token: str, agents: Sequence[str], *, per_session: int = AGENTS_PER_SESSION,
                 agent_token: Callable[[str], str] | None = None) -> None:
        """``agent_token``: each agent joins with a token of its own, as SDK agents do (else the admin's)."""
        self.url = url
        self.token = token
        self.agent_token = agent_token
        self.groups = [list(agents[i:i + per_session]) for i in range(0, len(agents), per_session)]
        self.sessions: list[Session] = []
        self._ids = itertools.count(1)
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> SessionLoad:
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        headers = {"Authorization": f"Bearer {self.token}"}
        for group in self.groups:
            ws = await self._http.ws_connect(self.url + SESSION_PATH, headers=headers, max_msg_size=0)
            session = Session(ws=ws, agents=group)
            session.waiting[0] = session.joined = asyncio.get_running_loop().create_future()
            session.reader = asyncio.create_task(self._read(session))
            self.sessions.append(session)
            token = self.agent_token or (lambda _: self.token)
            await ws.send_bytes(orjson.dumps({"t": "join", "agents": [{"agent_id": a, "token": token(a)}
                                                                       for a in group]}))
        await asyncio.gather(*(self._joined(session) for session in self.sessions))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for session in self.sessions:
            await session.ws.send_bytes(orjson.dumps({"t": "leave", "agents": session.agents}))
            await session.ws.close()
            if session.reader is not None:
                session.reader.cancel()
        if self._http is not None:
            await self._http.close()

    async def _joined(self, session: Session) -> None:
        if session.joined is None:
            raise RuntimeError("the session sent no join")
        answer = await asyncio.wait_for(session.joined, 120)
        if answer.get("refused"):
            raise SystemExit(f"the node refused agents on a session: {answer['refused'][:3]}")

    async def _read(self, session: Session) -> None:
        async for message in session.ws:
            if message.type is not aiohttp.WSMsgType.BINARY and message.type is not aiohttp.WSMsgType.TEXT:
                break
            frame = orjson.loads(message.data)
            key = 0 if frame.get("t") == "joined" else frame.get("id")
            future = session.waiting.pop(key, None) if isinstance(key, int) else None
            if frame.get("t") in ("renewed", "loaded"):
                session.acknowledged += len(frame.get("leases") or {}) if frame["t"] == "renewed" else 0
                session.errors += len(frame.get("errors") or {})
            if future is not None and not future.done():
                future.set_result(frame)

    async def send(self, session: Session, agents: Sequence[str], *, load: int | None = None) -> None:
        """One renew frame for ``agents`` (or, with ``load``, one load frame), awaited."""
        frame_id = next(self._ids)
        future = session.waiting[frame_id] = asyncio.get_running_loop().create_future()
        if load is None:
            frame = {"t": "renew", "id": frame_id, "beats": [{"agent_id": a} for a in agents]}
        else:
            frame = {"t": "load", "id": frame_id,
                     "loads": [{"agent_id": a, "load": {"inflight": load, "queued": 0, "rps": 1.5}} for a in agents]}
        await session.ws.send_bytes(orjson.dumps(frame))
        await future

    @property
    def acknowledged(self) -> int:
        return sum(session.acknowledged for session in self.sessions)

    @property
    def errors(self) -> int:
        return sum(session.errors for session in self.sessions)


async def saturate(load: SessionLoad, *, seconds: float, beats_per_frame: int, in_flight: int,
                   cpu_of: Sequence[int], load_reports: bool = False) -> dict[str, float]:
    """Frames of ``beats_per_frame`` renewals (or load reports) back to back, ``in_flight`` per
    session, for ``seconds``: items acknowledged per second and the node's CPU per item (µs)."""
    deadline = time.monotonic() + seconds
    done = [0]

    async def lane(session: Session, offset: int) -> None:
        agents = itertools.cycle(session.agents[offset:] + session.agents[:offset])
        counter = itertools.count()
        while time.monotonic() < deadline:
            batch = [next(agents) for _ in range(beats_per_frame)]
            await load.send(session, batch, load=next(counter) % 7 + 1 if load_reports else None)
            done[0] += len(batch)

    cpu_before, started = cpu_seconds(cpu_of), time.monotonic()
    await asyncio.gather(*(lane(session, i * beats_per_frame) for session in load.sessions for i in range(in_flight)))
    elapsed, cpu_used = time.monotonic() - started, cpu_seconds(cpu_of) - cpu_before
    return {"RPS": done[0] / elapsed, "CPU_US": 1e6 * cpu_used / max(done[0], 1), "ITEMS": done[0]}


async def steady(load: SessionLoad, *, seconds: float, interval_s: float, frames_per_interval: int,
                 cpu_of: Sequence[int]) -> dict[str, float]:
    """Every agent renews once per ``interval_s``: each session sends ``frames_per_interval``
    frames an interval, its agents split among them, from a phase of its own. 1 is the SDK's way
    (its agents' beats aligned: ``NodeSession.aligned``); more is agents renewing each at its own
    time. The node's CPU share of one core, and per renewal."""
    ticks = max(1, frames_per_interval)
    tick_s = interval_s / ticks
    phases = random.Random(7)

    async def one(session: Session) -> None:
        slices = [session.agents[i::ticks] for i in range(ticks)]
        tick = 0
        next_at = started + phases.random() * tick_s
        while next_at < deadline:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if slices[tick % ticks]:
                await load.send(session, slices[tick % ticks])
            tick += 1
            next_at += tick_s

    before = load.acknowledged
    cpu_before, started = cpu_seconds(cpu_of), time.monotonic()
    deadline = started + seconds  # every session sends seconds / interval_s × frames_per_interval frames
    await asyncio.gather(*(one(session) for session in load.sessions))
    elapsed, cpu_used = time.monotonic() - started, cpu_seconds(cpu_of) - cpu_before
    renewed = load.acknowledged - before
    return {"RPS": renewed / elapsed, "CORE": cpu_used / elapsed, "CPU_US": 1e6 * cpu_used / max(renewed, 1)}


# An SDK agent in a process of its own (bench.peers kills it): registers, says so, holds on.
AGENT_PROCESS = """
import asyncio, sys
from node.client import ReachClient

async def main():
    url, token, agent_id, lease_ms, session = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    body = {"agent_id": agent_id, "display_name": agent_id, "capabilities": [{"name": "bench.kill", "version": "1"}],
            "endpoints": {"primary": "http://127.0.0.1:9"}, "lease_ttl_ms": lease_ms}
    async with ReachClient(url, token=token, registration=body, session=session == "1") as client:
        while client.heartbeat_stats.sent < 2:
            await asyncio.sleep(0.05)
        print("ready", flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


async def time_to_unroutable(url: str, *, admin_token: str, agent_token: Callable[[str], str], agent_id: str,
                             lease_ms: int, session: bool, limit_s: float = 120.0) -> float:
    """Seconds from SIGKILL of an SDK agent's process until the node stops resolving to it."""
    process = subprocess.Popen([sys.executable, "-c", AGENT_PROCESS, url, agent_token(agent_id), agent_id,
                                str(lease_ms), "1" if session else "0"], stdout=subprocess.PIPE, text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 60)  # type: ignore[union-attr]
        if not line.startswith("ready"):
            raise SystemExit(f"the SDK agent did not start: {line!r}")
        headers = {"Authorization": f"Bearer {admin_token}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            os.kill(process.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            while time.monotonic() - killed_at < limit_s:
                async with http.post(f"{url}/v1/resolve", json={"capability": "bench.kill", "semantic": False}) as answer:
                    await answer.read()
                    if answer.status != 200:
                        return time.monotonic() - killed_at
                await asyncio.sleep(0.005)
        return float("inf")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


__all__ = ["AGENTS_PER_SESSION", "SessionLoad", "agent_ids", "saturate", "steady", "time_to_unroutable"]
