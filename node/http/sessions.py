"""``GET /v1/session``: one long-lived WebSocket per SDK process, carrying its agents' lease
renewals and load reports, telling the region when it ends, and pushing ticket invalidations.

The upgrade request is authenticated like any request (the middleware, one bearer token); then
each agent of the process **joins** with its own token (``{"t": "join", "agents": [{"agent_id",
"token"}]}``): a session carries any number of agents, each authorised for its own id (an admin
token for any). Frames are JSON objects, a text or binary frame each; their models
(``node.core.models.sessions``, which the SDK reads and writes too) are the contract.

A lease-only renewal of an agent this replica holds moves the lease alone: the frame's renewals
are one batch of the store's ``RENEW`` script (no record read, no version), and the index's copy
moves with it. A renewal with a status or a load goes through :meth:`RegistryNode.heartbeat` as
an HTTP heartbeat does; load frames are one batch of the store's ``UPDATE``. Renewals are
counted by ``agent_reach_session_renewals_total``, not ``agent_reach_heartbeats_total``.

When the connection ends while agents are still joined (the process died, the network cut it:
aiohttp's ping finds a silent peer within one and a half ``DEFAULT_PING_MS``), they become
suspect on every replica of the region (``node.view.suspects``) while their leases run; a join
from any replica clears that. A node that shuts down or drains ends its sessions ("going away",
no suspicion) and refuses new ones, so its SDKs reconnect elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass, field

import orjson
from aiohttp import WSCloseCode, WSMsgType, web
from pydantic import ValidationError

from ..core import BadRequest, NodeError, StoreUnavailable, UnknownAgent, first_problem, now_ms
from ..core.models import (
    CLIENT_FRAMES,
    Beat,
    AgentRecord,
    ChangeEvent,
    ChangeKind,
    ClientFrame,
    Heartbeat,
    Join,
    Leave,
    Loads,
    Renew,
    TokenClaims,
)
from ..delivery import BreakerState
from ..service import NodeState, RegistryNode
from ..trust import authorize_agent
from .plumbing import CALLER
from .session_roster import Member, PlainRenewal, Roster, plain_renewal

__all__ = ["SESSION_PATH", "SESSIONS_KEY", "NodeDraining", "SessionHub", "install_sessions"]

log = logging.getLogger(__name__)

SESSION_PATH = "/v1/session"
DEFAULT_PING_MS = 2_000  # aiohttp pings every interval and ends a session whose pong is half an interval late:
# a silent peer is found within 3 s, and a client whose loop stalls under 1 s keeps its session
MAX_FRAME_BYTES = 1 << 20
MAX_MEMBERS = 1_000  # agents per session
MAX_WATCHED = 10_000  # agents one session asks to hear about
MAX_FRAMES_IN_FLIGHT = 32
MAX_OUTBOX = 10_000  # frames waiting for a client that stopped reading: then the session is cut
EJECTION_CHECK_S = 0.25


class NodeDraining(NodeError):
    """The node is going away (draining or shutting down): sessions belong with another node."""

    status = 503
    code = "node_draining"


@dataclass(eq=False, slots=True)
class Session:
    """One open session on this replica: its agents (with what their tokens said), what it
    watches, and what waits to be written to it."""

    id: str
    ws: web.WebSocketResponse
    caller: TokenClaims
    transport: asyncio.BaseTransport | None
    roster: Roster = field(default_factory=Roster)
    watched: set[str] = field(default_factory=set)
    outbox: list[bytes] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_FRAMES_IN_FLIGHT))
    renewals: int = 0

    def push(self, frame: dict[str, object]) -> None:
        if len(self.outbox) >= MAX_OUTBOX:
            log.warning("session %s stopped reading (%d frames waiting); cutting it", self.id, len(self.outbox))
            if self.transport is not None:
                self.transport.abort()  # type: ignore[attr-defined]
            return
        self.outbox.append(orjson.dumps(frame))
        self.wake.set()

    async def answer(self, frame: dict[str, object]) -> None:
        """Write the answer to a frame now (no hop through the writer task: a renewal's answer is
        most of what a session writes); a connection that went is the reader's to notice."""
        if self.outbox:
            self.push(frame)  # behind what waits, in order
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.ws.send_bytes(orjson.dumps(frame))


class SessionHub:
    """This replica's sessions: who holds which agent, who watches which, and the pushes."""

    def __init__(self, node: RegistryNode, *, ping_ms: int = DEFAULT_PING_MS) -> None:
        self.node = node
        self.ping_s = ping_ms / 1000
        self.sessions: set[Session] = set()
        self.holders: dict[str, Session] = {}  # agent -> the session of this replica holding it
        self.watchers: dict[str, set[Session]] = {}
        self.closing = False
        self.suspected = 0  # agents this replica marked suspect when their session ended
        self._ids = itertools.count(1)
        self._ejected: set[str] = set()

    # -- one session -------------------------------------------------------------------------

    async def serve(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=self.ping_s, max_msg_size=MAX_FRAME_BYTES)
        if not ws.can_prepare(request).ok:
            raise BadRequest(f"GET {SESSION_PATH} is a WebSocket: send 'Connection: Upgrade' and "
                             "'Upgrade: websocket' (node.client opens it)", code="websocket_required")
        if self.closing or self.node.state is not NodeState.RUNNING:
            raise NodeDraining("this node is going away: open the session with another node of the region")
        await ws.prepare(request)
        session = Session(id=f"{self.node.node_id}/{next(self._ids)}", ws=ws, caller=request[CALLER],
                          transport=request.transport)
        self.sessions.add(session)
        try:
            async with asyncio.TaskGroup() as tasks:
                writer = tasks.create_task(self._write(session))
                await self._read(session, tasks)
                writer.cancel()
        finally:
            self.sessions.discard(session)
            await self._ended(session)
        return ws

    async def _read(self, session: Session, tasks: asyncio.TaskGroup) -> None:
        async for message in session.ws:
            if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                break  # an error or a close: the session ends
            frame = _parsed(session, message.data)
            del message  # not held while the next one is awaited: a join of 1,000 agents is ~300 KB
            if frame is None:
                continue
            await session.slots.acquire()  # frames in flight are bounded: a flood waits here
            tasks.create_task(self._handle(session, frame))
            del frame

    async def _write(self, session: Session) -> None:
        while True:
            await session.wake.wait()
            session.wake.clear()
            frames, session.outbox = session.outbox, []
            try:
                for frame in frames:
                    await session.ws.send_bytes(frame)
            except (ConnectionError, RuntimeError):  # the connection went: the reader ends the session
                return
            del frames, frame  # not held while waiting for the next

    async def _handle(self, session: Session, frame: ClientFrame | PlainRenewal) -> None:
        try:
            if isinstance(frame, PlainRenewal):
                await self._renew_plain(session, frame)
            elif isinstance(frame, Renew):
                await self._renew(session, frame)
            elif isinstance(frame, Loads):
                await self._loads(session, frame)
            elif isinstance(frame, Join):
                await self._join(session, frame)
            elif isinstance(frame, Leave):
                await self._leave(session, frame.agents)
            else:
                self._watch(session, frame.agents)
        except asyncio.CancelledError:
            raise
        except NodeError as exc:
            session.push({"t": "error", **exc.body()})
        except Exception:  # noqa: BLE001 - one frame must not end the session
            log.exception("session %s: a %s frame failed", session.id, type(frame).__name__)
            session.push({"t": "error", "error": "internal_error", "message": "the node failed; see its log"})
        finally:
            session.slots.release()

    async def _join(self, session: Session, frame: Join) -> None:
        joined: list[str] = []
        refused: list[dict[str, object]] = []
        for item in frame.agents:
            try:
                claims = self.node.authenticate(f"Bearer {item.token}", remember=False)  # seen once
                authorize_agent(claims, item.agent_id)
                if item.agent_id not in session.roster.members and len(session.roster) >= MAX_MEMBERS:
                    raise BadRequest(f"a session carries at most {MAX_MEMBERS} agents; open another",
                                     code="too_many_agents")
            except NodeError as exc:
                refused.append({"agent_id": item.agent_id, **exc.body()})
                continue
            record = self.node.cache.index.records.get(item.agent_id)
            agent_id = record.agent_id if record is not None else item.agent_id  # the record's string, not a copy
            session.roster.join(agent_id, Member(claims, agent_id), self.node.revocations, now_ms())
            self.holders[agent_id] = session
            joined.append(agent_id)
        if joined:
            await self.node.cache.suspects.hold(joined, session=session.id)
        session.push({"t": "joined", "agents": joined, "refused": refused})

    async def _renew(self, session: Session, frame: Renew) -> None:
        """Lease-only beats of agents held here go to the store in one batch (``_renew_leases``);
        a beat with a status or a load, or of an agent not held yet, is an HTTP heartbeat's work."""
        plain: list[str] = []
        others: list[Beat] = []
        for beat in frame.beats:
            if beat.status is None and beat.load is None:
                plain.append(beat.agent_id)
            else:
                others.append(beat)
        await self._renewed(session, frame.id, plain, others)

    async def _renew_plain(self, session: Session, frame: PlainRenewal) -> None:
        """The frame an SDK sends every interval (``plain_renewal``): lease-only beats."""
        await self._renewed(session, frame.id, frame.agents, [])

    async def _renewed(self, session: Session, frame_id: int, plain: list[str], others: list[Beat]) -> None:
        answers, strays = await self._renew_leases(session, plain)
        others += [Beat.model_construct(agent_id=agent_id, status=None, load=None) for agent_id in strays]
        if others:
            results = await asyncio.gather(*(self._beat(session, beat) for beat in others), return_exceptions=True)
            answers.update(zip((beat.agent_id for beat in others), results))
        leases: dict[str, int] = {}
        errors: dict[str, object] = {}
        for agent_id, answer in answers.items():
            if isinstance(answer, int):
                leases[agent_id] = answer
            else:
                errors[agent_id] = _error_body(session, answer)
        session.renewals += len(leases)
        await session.answer({"t": "renewed", "id": frame_id, "leases": leases, "errors": errors})

    async def _renew_leases(self, session: Session,
                            agent_ids: list[str]) -> tuple[dict[str, int | BaseException], list[str]]:
        """Move the leases of joined agents the index holds: one store batch, no record read, no
        version (``RegionStore.renew_leases``); the index's copy of each lease moves with it. The
        agents the index does not hold (yet) are returned, for the HTTP heartbeat's way."""
        answers: dict[str, int | BaseException] = {}
        now, records, renewals, held, strays = now_ms(), self.node.cache.index.records, [], [], []
        roster, revocations = session.roster, self.node.revocations
        members, refused = roster.members, roster.refused(revocations, now)  # checked per roster, not per renewal
        for agent_id in agent_ids:
            if agent_id in refused or agent_id not in members:
                refusal = roster.refusal(agent_id, revocations, now)
                if refusal is not None:
                    answers[agent_id] = refusal
                    continue
            record = records.get(agent_id)
            if record is None:
                strays.append(agent_id)
                continue
            renewals.append((agent_id, now + record.lease_ttl_ms))
            held.append(record)
        if not renewals:
            return answers, strays
        moved = await self.node.store.renew_leases(renewals, at_ms=now)
        touched: list[tuple[AgentRecord, int]] = []
        for (agent_id, lease), record, result in zip(renewals, held, moved):
            if result is True:
                touched.append((record, lease))
                answers[agent_id] = lease
            else:
                answers[agent_id] = result if isinstance(result, BaseException) else UnknownAgent(
                    f"agent {agent_id} has no lease in region {self.node.region} (it lapsed): register again",
                    field="agent_id")
        self.node.cache.touch_leases(touched)
        renewed = len(touched)
        if renewed:
            self.node.metrics.session_renewals("lease").inc(renewed)
        suspects = self.node.cache.index.suspects
        if suspects and (marked := [a for a in agent_ids if a in suspects and isinstance(answers.get(a), int)]):
            await self.node.cache.suspects.hold(marked, session=session.id)  # a mark that raced this join
        return answers, strays

    async def _beat(self, session: Session, beat: Beat) -> int:
        claims = self._member(session, beat.agent_id).claims()
        heartbeat = Heartbeat.model_construct(status=beat.status, load=beat.load)  # validated as the frame was
        result = await self.node.heartbeat(beat.agent_id, heartbeat, claims, session=True)
        if beat.agent_id in self.node.cache.index.suspects:  # a mark that raced this session's join
            await self.node.cache.suspects.hold([beat.agent_id], session=session.id)
        return result.lease_expires_at_ms

    async def _loads(self, session: Session, frame: Loads) -> None:
        """``PUT …/load`` of each item, in one store batch; the same load again on a running lease
        writes nothing, as over HTTP."""
        errors: dict[str, object] = {}
        now, index, changed = now_ms(), self.node.cache.index, []
        for item in frame.loads:
            try:
                self._member(session, item.agent_id)
            except NodeError as exc:
                errors[item.agent_id] = exc.body()
                continue
            known = index.get(item.agent_id)
            if known is None or known.load != item.load or known.lease_expires_at_ms <= now:
                changed.append((item.agent_id, item.load))
        stored = await self.node.store.report_loads(changed, at_ms=now) if changed else []
        for (agent_id, load), result in zip(changed, stored):
            if result is True:
                index.set_load(agent_id, load)
            else:
                errors[agent_id] = _error_body(session, result if isinstance(result, BaseException) else UnknownAgent(
                    f"agent {agent_id} has no lease in region {self.node.region}: register again", field="agent_id"))
        self.node.metrics.load_reports.inc(len(frame.loads) - len(errors))
        await session.answer({"t": "loaded", "id": frame.id, "errors": errors})

    async def _leave(self, session: Session, agents: list[str]) -> None:
        left = [agent_id for agent_id in agents if session.roster.leave(agent_id)]
        for agent_id in left:
            if self.holders.get(agent_id) is session:
                del self.holders[agent_id]
        await self.node.cache.suspects.release(left, session=session.id)

    def _watch(self, session: Session, agents: list[str]) -> None:
        for agent_id in agents:
            if agent_id in session.watched:
                continue
            if len(session.watched) >= MAX_WATCHED:
                session.push({"t": "error", "error": "too_many_watched",
                              "message": f"a session hears about at most {MAX_WATCHED} agents"})
                return
            session.watched.add(agent_id)
            self.watchers.setdefault(agent_id, set()).add(session)

    def _member(self, session: Session, agent_id: str) -> Member:
        """What the token ``agent_id`` joined with said, still good; raises the HTTP error the SDK maps."""
        refusal = session.roster.refusal(agent_id, self.node.revocations, now_ms())
        if refusal is not None:
            raise refusal
        return session.roster.members[agent_id]

    async def _ended(self, session: Session) -> None:
        """The session's connection is gone: its agents still joined are suspect, unless this
        node is the one going away."""
        for agent_id in session.watched:
            watchers = self.watchers.get(agent_id)
            if watchers is not None:
                watchers.discard(session)
                if not watchers:
                    del self.watchers[agent_id]
        held = [agent_id for agent_id in session.roster.members if self.holders.get(agent_id) is session]
        for agent_id in held:
            del self.holders[agent_id]
        if not held:
            return
        try:
            if self.closing or self.node.state is not NodeState.RUNNING:
                await self.node.cache.suspects.release(held, session=session.id)
                return
            marked = await self.node.cache.suspects.drop(held, session=session.id)
        except StoreUnavailable as exc:  # the agents stay routable until their leases pass
            log.warning("session %s ended; could not mark its %d agents suspect: %s", session.id, len(held), exc)
            return
        self.suspected += len(marked)
        if marked:
            log.info("session %s ended: %d agents suspect until they return or their leases pass",
                     session.id, len(marked))

    # -- pushes ------------------------------------------------------------------------------

    def on_change(self, event: ChangeEvent) -> None:
        """A change of the region (cache listener): the agent's watchers hear when it is gone."""
        watchers = self.watchers.get(event.agent_id)
        if not watchers:
            return
        if event.kind is ChangeKind.DELETE:
            reason = event.reason.value if event.reason is not None else "deregistered"
        elif event.record is not None and not self.node.routable(event.record):
            reason = "suspect" if event.agent_id in self.node.cache.index.suspects else "status"
        else:
            return
        self._gone(event.agent_id, reason)

    def on_suspect(self, agent_id: str) -> None:
        if self.watchers.get(agent_id):
            self._gone(agent_id, "suspect")

    def _gone(self, agent_id: str, reason: str) -> None:
        frame = {"t": "gone", "agents": [agent_id], "reason": reason}
        for session in self.watchers.get(agent_id, ()):
            session.push(frame)

    async def watch_ejections(self) -> None:
        """Push ``ejected`` when this node's breaker opens for a watched agent (checked whenever the
        breakers moved, every ``EJECTION_CHECK_S``); end the sessions when the node drains."""
        outcomes, seen = self.node.outcomes, -1
        while True:
            await asyncio.sleep(EJECTION_CHECK_S)
            if self.node.state is NodeState.DRAINING and not self.closing:
                await self.end_all()
            if outcomes.generation == seen:
                continue
            seen = outcomes.generation
            now = now_ms()
            for agent_id in list(self.watchers):
                is_open = outcomes.state(agent_id, now_ms=now) is BreakerState.OPEN
                if is_open and agent_id not in self._ejected:
                    self._ejected.add(agent_id)
                    self._gone(agent_id, "ejected")
                elif not is_open:
                    self._ejected.discard(agent_id)

    async def end_all(self) -> None:
        """End every session, "going away" (no suspicion): the SDKs reconnect to another node."""
        self.closing = True
        for session in list(self.sessions):
            with contextlib.suppress(Exception):
                await session.ws.close(code=WSCloseCode.GOING_AWAY, message=b"node going away")


def _error_body(session: Session, error: BaseException) -> object:
    if isinstance(error, NodeError):
        return error.body()
    log.error("session %s: a renewal failed", session.id, exc_info=error)
    return {"error": "internal_error", "message": "the node failed; see its log", "field": None}


def _parsed(session: Session, data: str | bytes) -> ClientFrame | PlainRenewal | None:
    """The frame ``data`` holds (the SDK's plain renewal read at once), or None after telling the
    client what is wrong with it."""
    plain = plain_renewal(data, session.roster.members)
    if plain is not None:
        return plain
    try:
        return CLIENT_FRAMES.validate_json(data)
    except ValidationError as exc:
        problem = first_problem(exc)
        session.push({"t": "error", "error": "invalid_frame", "field": problem.field,
                      "message": f"frame {problem.field or ''}: {problem.message}".strip()})
        return None


SESSIONS_KEY = web.AppKey("sessions", SessionHub)


async def _session(request: web.Request) -> web.StreamResponse:
    return await request.app[SESSIONS_KEY].serve(request)


def install_sessions(app: web.Application, node: RegistryNode) -> None:
    """Serve ``GET /v1/session`` on ``app``; the hub follows the node's changes, marks and
    breakers while the app runs, and ends the sessions when it shuts down."""
    hub = app[SESSIONS_KEY] = SessionHub(node)
    app.router.add_get(SESSION_PATH, _session)

    async def lifecycle(app: web.Application):  # type: ignore[no-untyped-def]
        unsubscribe = node.cache.subscribe(hub.on_change)
        node.cache.suspects.on_suspect.append(hub.on_suspect)
        task = asyncio.create_task(hub.watch_ejections(), name=f"sessions-{node.region}")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            unsubscribe()
            with contextlib.suppress(ValueError):
                node.cache.suspects.on_suspect.remove(hub.on_suspect)

    async def end_sessions(app: web.Application) -> None:
        await hub.end_all()

    app.cleanup_ctx.append(lifecycle)
    app.on_shutdown.append(end_sessions)
    if "agent_reach_sessions" not in node.metrics.gauges:
        node.metrics.gauge("agent_reach_sessions", "Sessions open on this node (GET /v1/session)",
                           lambda: len(hub.sessions))
        node.metrics.counter_from("agent_reach_session_suspects", "Agents this node marked suspect when their "
                                  "session ended", lambda: hub.suspected)
