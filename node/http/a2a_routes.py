"""The Agent Card routes: where A2A clients look (``A2ACardResolver``) and the v1 API's export.

* ``GET /.well-known/agent-card.json`` — the registry's own card (public, like the OpenAPI document).
* ``GET /agents/{agent_id}/.well-known/agent-card.json`` — an agent's card, so that
  ``A2ACardResolver(client, f"{node}/agents/{agent_id}")`` finds it at the SDK's default path.
  Without a token it is served only when the card is public: the registration asked for it
  (``public_card``), the region allows it (``NodeConfig.public_cards``, default off), the agent
  has no ``allowed_callers`` and is registered in this region (a peer's policy is not known
  here). Anything else without a token is a 401 — the same for an agent that does not exist, so
  the answer tells nothing. With a token the usual rules hold: ``allowed_callers`` decides, and
  an agent the caller may not see is a 404, as everywhere.
* ``GET /v1/agents/{agent_id}/agent-card.json`` — the same card, always with a token.

The middleware (:mod:`node.http.api`) leaves the agent card's well-known route unauthenticated when
the request has no ``Authorization`` header; these handlers decide.
"""

from __future__ import annotations

from aiohttp import web

from ..core import Unauthorized
from ..core.a2a import exported_card, registry_card
from ..core.models import AgentRecord
from ..service import RegistryNode
from .plumbing import CALLER, NODE_KEY, json_response

PUBLIC_CACHE = "public, max-age=60"
PRIVATE_CACHE = "private, no-store"


def node_url(request: web.Request) -> str:
    """This node's base URL for the URLs in a card: ``advertise_url``, else the address the
    request came in on (the socket's, never the Host header, which the client writes)."""
    node: RegistryNode = request.app[NODE_KEY]
    if node.config.advertise_url:
        return node.config.advertise_url.rstrip("/")
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if not sockname:
        return f"http://{node.config.host}:{node.config.port}"
    host, port = sockname[0], sockname[1]
    return f"{request.scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def card_is_public(node: RegistryNode, record: AgentRecord) -> bool:
    """Served without a token: see the module docstring for the four conditions (and no ACL rule about it)."""
    return (node.config.public_cards and record.a2a is not None and record.a2a.public
            and not record.allowed_callers and record.region == node.region and not node.acl.restricts(record.agent_id))


async def registry_agent_card(request: web.Request) -> web.Response:
    node: RegistryNode = request.app[NODE_KEY]
    response = json_response(registry_card(node_url=node_url(request), region=node.region,
                                           public_cards=node.config.public_cards))
    response.headers["Cache-Control"] = PUBLIC_CACHE
    return response


async def well_known_agent_card(request: web.Request) -> web.Response:
    node: RegistryNode = request.app[NODE_KEY]
    agent_id = request.match_info["agent_id"]
    caller = request.get(CALLER)
    if caller is None:
        record = node.find(agent_id)
        if record is None or not card_is_public(node, record):
            raise Unauthorized("this card is not public: send 'Authorization: Bearer <token>'", code="missing_token")
        public = True
    else:
        record = node.get(agent_id, caller)
        public = card_is_public(node, record)
    return _card_response(request, node, record, public=public)


async def v1_agent_card(request: web.Request) -> web.Response:
    node: RegistryNode = request.app[NODE_KEY]
    record = node.get(request.match_info["agent_id"], request[CALLER])
    return _card_response(request, node, record, public=False)


def _card_response(request: web.Request, node: RegistryNode, record: AgentRecord, *, public: bool) -> web.Response:
    response = json_response(exported_card(record, node_url=node_url(request), routable=node.routable(record)))
    response.headers["Cache-Control"] = PUBLIC_CACHE if public else PRIVATE_CACHE
    return response


__all__ = ["card_is_public", "node_url", "registry_agent_card", "v1_agent_card", "well_known_agent_card"]
