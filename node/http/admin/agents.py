"""``/v1/admin/agents/{agent_id}``: an admin's actions on one agent of this region.

* ``PATCH`` (:class:`~node.core.models.AgentChange`): a new status (``draining`` takes the agent
  out of routing, ``ready`` brings it back) and/or routing weight, as one versioned change of the
  record that every replica and peer region sees; no lease is moved. The agent's own next
  heartbeat that names a status (the SDK names one once ``set_status`` was called), or its next
  registration, replaces the admin's.
* ``DELETE``: deregister it (a tombstone, like the agent's own ``DELETE /v1/agents/{agent_id}``).
* ``POST …/revoke-tokens``: refuse every agent token of that id issued so far, in this region and
  (with federation) its peers (:meth:`~node.trust.RevocationList.revoke_subject`); its next
  heartbeat is refused, so its lease ends unless it comes back with a new token.

Admin tokens only (403 ``admins_only`` for any other). An agent another region keeps is changed
there (409 ``not_home_region``, naming it). Each action is one ``kind: "admin"`` line of the
decision log (:class:`~node.routing.DecisionLog`), with the admin's name and what changed.
"""

from __future__ import annotations

import math
import re
import time

from aiohttp import web

from ...core import Conflict, Forbidden, UnknownAgent, ValidationFailed, now_ms
from ...core.models import (
    AGENT_ID_RE,
    SINGLE_LINE_PATTERN,
    AgentChange,
    AgentRecord,
    ChangeEvent,
    ChangeKind,
    TokenClaims,
    TokenRole,
)
from ...service import RegistryNode
from ..plumbing import CALLER, NODE_KEY, json_response, parse_body

__all__ = ["ADMIN_AGENT_ROUTES"]

AGENT_PATH = "/v1/admin/agents/{agent_id}"
MAX_REASON_CHARS = 200
_ONE_LINE = re.compile(SINGLE_LINE_PATTERN)


def _admin(request: web.Request, what: str) -> TokenClaims:
    caller = request[CALLER]
    if caller.role is not TokenRole.ADMIN:
        raise Forbidden(f"{what} is for admins (a token of role {caller.role.value} may not); "
                        "'agent-reach token issue --admin' prints an admin token", code="admins_only")
    return caller


def _agent_id(request: web.Request) -> str:
    agent_id = request.match_info["agent_id"]
    if not AGENT_ID_RE.match(agent_id):
        raise ValidationFailed("agent_id must be three dot-separated parts of lowercase letters, digits, '_' and "
                               "'-' (e.g. payment.risk_check.prod_01)", field="agent_id")
    return agent_id


def _home_record(node: RegistryNode, agent_id: str) -> AgentRecord:
    """The agent's record in this region; 409 when a peer region keeps it, 404 when nobody does."""
    record = node.find(agent_id)
    if record is None:
        raise UnknownAgent(f"agent {agent_id} is not registered in region {node.region}", field="agent_id")
    if record.region != node.region:
        raise Conflict(f"agent {agent_id} is kept by region {record.region}: change it through that region's node "
                       "(its console)", field="agent_id", code="not_home_region")
    return record


async def change_agent(request: web.Request) -> web.Response:
    caller = _admin(request, "changing an agent's status or weight")
    agent_id = _agent_id(request)
    change = await parse_body(request, AgentChange)
    node = request.app[NODE_KEY]
    known = _home_record(node, agent_id)
    done: list[str] = []

    def mutate(current: AgentRecord) -> AgentRecord | None:
        update: dict[str, object] = {}
        done.clear()
        if change.status is not None and change.status != current.status:
            update["status"] = change.status
            done.append(f"status {current.status.value} -> {change.status.value}")
        if change.weight is not None and change.weight != current.weight:
            update["weight"] = change.weight
            done.append(f"weight {current.weight} -> {change.weight}")
        return current.model_copy(update=update) if update else None

    now = now_ms()
    result = await node.store.update(agent_id, mutate, at_ms=now, known=known)
    record = result.stored
    if result.changed:
        node.cache.apply_local(ChangeEvent(kind=ChangeKind.STATUS, region=node.region, version=result.version,
                                           agent_id=agent_id, at_ms=now, record=record))
    action = "status" if change.weight is None else "weight" if change.status is None else "status_weight"
    detail = "; ".join(done) or "no change"
    node.decisions.administered(at_ms=now, caller=caller.sub, agent_id=agent_id, action=action,
                                detail=_with_reason(detail, change.reason), version=result.version)
    return json_response({"agent_id": agent_id, "region": node.region, "version": result.version,
                          "status": record.status.value, "weight": record.weight, "changed": result.changed})


async def deregister_agent(request: web.Request) -> web.Response:
    caller = _admin(request, "deregistering another's agent")
    agent_id = _agent_id(request)
    reason = _reason(request)
    node = request.app[NODE_KEY]
    _home_record(node, agent_id)
    version = await node.deregister(agent_id, caller)
    node.decisions.administered(at_ms=now_ms(), caller=caller.sub, agent_id=agent_id, action="deregister",
                                detail=_with_reason("deregistered", reason), version=version)
    return json_response({"agent_id": agent_id, "version": version, "deregistered": True})


async def revoke_agent_tokens(request: web.Request) -> web.Response:
    caller = _admin(request, "revoking an agent's tokens")
    agent_id = _agent_id(request)
    reason = _reason(request)
    node = request.app[NODE_KEY]
    # Every token issued up to this second; one the agent is given after it is accepted.
    issued_until_s = math.floor(time.time())
    done = await node.revocations.revoke_subject(TokenRole.AGENT, agent_id, issued_until_s=issued_until_s)
    node.decisions.administered(at_ms=now_ms(), caller=caller.sub, agent_id=agent_id, action="revoke_tokens",
                                detail=_with_reason(f"agent tokens issued up to {issued_until_s} (s) refused",
                                                    reason))
    return json_response({"agent_id": agent_id, "region": node.region, "issued_until_s": issued_until_s,
                          "new": done.new, "poll_interval_ms": node.config.revocation_poll_interval_ms,
                          "peers": list(node.revocations.peers)})


def _reason(request: web.Request) -> str | None:
    """The ``reason`` query parameter (why, for the decision log): one line, at most 200 characters."""
    reason = request.query.get("reason")
    if reason is not None and (len(reason) > MAX_REASON_CHARS or not _ONE_LINE.match(reason)):
        raise ValidationFailed(f"reason must be one line of at most {MAX_REASON_CHARS} characters", field="reason")
    return reason or None


def _with_reason(detail: str, reason: str | None) -> str:
    return f"{detail} ({reason})" if reason else detail


ADMIN_AGENT_ROUTES: tuple[web.RouteDef, ...] = (
    web.patch(AGENT_PATH, change_agent),
    web.delete(AGENT_PATH, deregister_agent),
    web.post(f"{AGENT_PATH}/revoke-tokens", revoke_agent_tokens),
)
"""The admin's actions on one agent, added to the app by ``node.http.api.build_app``."""
