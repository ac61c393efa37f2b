"""The decision log: every route decision and reported outcome as a JSON line keyed by trace_id.

Each resolve this node decides (``kind: "decision"``, ``result: "ok"`` or the error code of a
refusal), each outcome report it accepts (``kind: "outcome"``) and each admin's action on an agent
through it (``kind: "admin"``: status, weight, deregister, revoke its tokens) becomes one JSON object per
line in the configured sink (``NodeConfig.decision_log``: ``"stdout"``, ``"stderr"`` or a file
path, appended to), so a collaboration can be followed across log pipelines by its
``trace_id``. A decision names its ticket; an outcome names the ticket it reports on, and its
trace_id is looked up in a bounded table of the tickets this node issued, so outcomes join their
decisions (an outcome on a ticket of another replica carries the ticket id alone).

Whatever the sink, the last :data:`RECENT_PER_AGENT` entries per agent stay in memory (for at most
:data:`MAX_AGENTS` agents, the first seen forgotten first), a decision as a tuple made into its
line only when read, as this runs on every resolve: ``GET
/v1/agents/{agent_id}/decisions`` serves them (the console's agent page). They are this node
process's, not the region's.

Writing is synchronous and line-buffered (a line is complete when the call returns); a sink that
cannot be written is reported once and then skipped, never failing a request.
"""

from __future__ import annotations

import logging
import sys
from collections import OrderedDict, deque
from pathlib import Path
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

import orjson

from ..core import NodeError
from ..core.models import RouteRequest, TokenClaims, TokenRole

if TYPE_CHECKING:
    from .router import Decision

__all__ = ["DecisionLog", "MAX_AGENTS", "RECENT_PER_AGENT", "STDERR_SINK", "STDOUT_SINK", "WITHHELD"]

log = logging.getLogger(__name__)

STDOUT_SINK = "stdout"
STDERR_SINK = "stderr"
RECENT_PER_AGENT = 50
MAX_AGENTS = 10_000
_MAX_TICKETS = 10_000
WITHHELD = "(withheld)"  # another caller's name, as an agent reading its own decisions sees it
_STREAMS = {STDOUT_SINK: lambda: sys.stdout, STDERR_SINK: lambda: sys.stderr}


class DecisionLog:
    """Decisions and outcomes to a JSON-lines sink and a per-agent memory; ``close()`` is idempotent."""

    def __init__(self, sink: str | None, *, region: str) -> None:
        self.sink = sink
        self.region = region
        self.written = 0
        self._handle: IO[str] | None = None
        self._failed = False
        self._recent: OrderedDict[str, deque[dict[str, Any] | tuple[Any, ...]]] = OrderedDict()
        self._tickets: OrderedDict[str, str] = OrderedDict()

    def decided(self, decision: Decision, *, at_ms: int, extensions: dict[str, Any] | None = None) -> None:
        """A ticket handed out (``extensions``: those of the envelope it was for, masked by the proxy)."""
        target, match = decision.target.target, decision.match
        _remember(self._tickets, decision.ticket_id, decision.trace_id, _MAX_TICKETS)
        row = (at_ms, decision.trace_id, decision.ticket_id, decision.caller, target["agent_id"], target["region"],
               target["locality"], match.get("kind"), match.get("capability"), match.get("score"),
               [candidate.target["agent_id"] for candidate in decision.alternates], extensions)
        self._keep(row[4], row)
        if self.sink is not None:
            self._sink(self._decision_line(row))

    def refused(self, request: RouteRequest, caller: TokenClaims, error: NodeError, *, at_ms: int,
                known: bool) -> None:
        """A resolve that found nobody (or was refused): ``result`` is the error's code. It is kept
        in memory under its ``agent_id`` only when that names an agent the node holds (``known``):
        the id is the caller's to choose, and every new one would take a slot of :data:`MAX_AGENTS`
        (up to 50 lines of caller-written text each) and push a real agent's entries out."""
        self._write({"kind": "decision", "at_ms": at_ms, "trace_id": request.trace_id, "node_region": self.region,
                     "caller": caller.sub, "result": error.code, "agent_id": request.agent_id,
                     "capability": request.capability, "detail": error.message[:500]}, keep=known)

    def outcome(self, *, at_ms: int, ticket_id: str | None, caller: str, agent_id: str, outcome: str,
                latency_ms: float | None) -> None:
        """One reported call outcome; its trace_id is the ticket's when this node issued it."""
        trace_id = self._tickets.get(ticket_id) if ticket_id is not None else None
        self._write({"kind": "outcome", "at_ms": at_ms, "trace_id": trace_id, "ticket_id": ticket_id,
                     "node_region": self.region, "caller": caller, "agent_id": agent_id, "outcome": outcome,
                     "latency_ms": latency_ms})

    def administered(self, *, at_ms: int, caller: str, agent_id: str, action: str, detail: str,
                     version: int | None = None) -> None:
        """An admin's action on an agent (``kind: "admin"``): ``action`` is ``status``, ``weight``,
        ``deregister`` or ``revoke_tokens``, ``detail`` what it did (``"ready -> draining"``)."""
        self._write({"kind": "admin", "at_ms": at_ms, "node_region": self.region, "caller": caller,
                     "agent_id": agent_id, "action": action, "result": "ok", "detail": detail[:500],
                     "version": version})

    def recent(self, agent_id: str, caller: TokenClaims, *, visible: Callable[[str], bool]) -> list[dict[str, Any]]:
        """The agent's last entries this node holds, newest first, as ``caller`` may see them:
        admins and peers every entry as written; the agent itself every caller's, but another
        caller's without its name, trace id or ticket id (:data:`WITHHELD`); anyone else only its
        own. Alternates ``visible`` says the reader may not see (an agent id) are left out."""
        entries = self._recent.get(agent_id)
        if entries is None:
            return []
        everything = caller.role in (TokenRole.ADMIN, TokenRole.PEER)
        itself = caller.sub == agent_id
        lines = (entry if isinstance(entry, dict) else self._decision_line(entry) for entry in reversed(entries))
        shown = []
        for line in lines:
            if everything:
                shown.append(line)
            elif line.get("caller") == caller.sub or itself:
                shown.append(_as_seen(line, mine=line.get("caller") == caller.sub, visible=visible))
        return shown

    def close(self) -> None:
        if self._handle is not None and self.sink not in _STREAMS:
            self._handle.close()
        self._handle = None

    # -- internals ---------------------------------------------------------------------------

    def _decision_line(self, row: tuple[Any, ...]) -> dict[str, Any]:
        names = ("at_ms", "trace_id", "ticket_id", "caller", "agent_id", "region", "locality", "match",
                 "capability", "score", "alternates", "extensions")
        fields = {name: value for name, value in zip(names, row, strict=True) if value is not None}
        return {"kind": "decision", "node_region": self.region, "result": "ok", **fields}

    def _write(self, entry: dict[str, Any], *, keep: bool = True) -> None:
        line = {key: value for key, value in entry.items() if value is not None}
        agent_id = line.get("agent_id")
        if agent_id is not None and keep:
            self._keep(agent_id, line)
        if self.sink is not None:
            self._sink(line)

    def _keep(self, agent_id: str, entry: dict[str, Any] | tuple[Any, ...]) -> None:
        entries = self._recent.get(agent_id)
        if entries is None:
            entries = deque(maxlen=RECENT_PER_AGENT)
            _remember(self._recent, agent_id, entries, MAX_AGENTS)
        entries.append(entry)

    def _sink(self, line: dict[str, Any]) -> None:
        if self._failed:
            return
        try:
            handle = self._open()
            handle.write(orjson.dumps(line).decode() + "\n")
            handle.flush()
            self.written += 1
        except (OSError, ValueError) as exc:  # ValueError: a closed stream
            self._failed = True
            log.error("the decision log %s cannot be written (%s); decisions are no longer logged there",
                      self.sink, getattr(exc, "strerror", None) or exc)

    def _open(self) -> IO[str]:
        if self._handle is None:
            stream = _STREAMS.get(str(self.sink))
            if stream is not None:
                self._handle = stream()
            else:
                path = Path(str(self.sink)).expanduser()
                path.parent.mkdir(parents=True, exist_ok=True)
                self._handle = path.open("a", encoding="utf-8", buffering=1)
        return self._handle


def _as_seen(line: dict[str, Any], *, mine: bool, visible: Callable[[str], bool]) -> dict[str, Any]:
    """``line`` as a non-admin reader sees it: the alternates it may see; of another caller's
    entry (the reader is the agent it is about), no name, trace id or ticket id of that caller."""
    seen = dict(line)
    if "alternates" in seen:
        seen["alternates"] = [agent_id for agent_id in seen["alternates"] if visible(agent_id)]
    if not mine:
        seen["caller"] = WITHHELD
        for name in ("trace_id", "ticket_id", "detail", "extensions"):
            seen.pop(name, None)
    return seen


def _remember(table: OrderedDict[str, Any], key: str, value: Any, limit: int) -> None:
    """Add ``key``; beyond ``limit`` keys the first added goes. An OrderedDict: a plain dict finds
    its first key by stepping over the slots of every key deleted since it last resized (4.3 µs a
    call at 10,000 keys, on every resolve, against 0.3)."""
    table[key] = value
    if len(table) > limit:
        table.popitem(last=False)
