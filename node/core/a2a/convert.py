"""A v0.3 Agent Card read as v1.0, the way the A2A SDK reads one it fetches.

The SDK's card resolver (``a2a.client.card_resolver.parse_agent_card``) turns a v0.3 card into
the v1.0 one: ``url`` + ``preferredTransport`` (default JSONRPC) is the first interface and each
of ``additionalInterfaces`` follows, all at the card's ``protocolVersion`` (default ``0.3.0``);
``supportsAuthenticatedExtendedCard: true`` becomes ``capabilities.extendedAgentCard``;
``security`` (``{name: scopes}``) becomes ``securityRequirements``; a ``type``-tagged scheme
becomes its one-of wrapper (``apiKey``'s ``in`` is ``location``; of several OAuth flows, which 1.0
has as a one-of and the resolver cannot read, the last is kept, as the SDK's ``to_core_oauth_flows`` does). What 1.0 dropped
(``capabilities.stateTransitionHistory``) is left out. The registry exports a v0.3 card so, and
keeps the original. A v1.0 card (one with ``supportedInterfaces``) is returned as it is, v0.3
fields it also carries included (v1.0 readers ignore them). This module does no I/O.
"""

from __future__ import annotations

import copy
from typing import Any

_WRAPPERS = {"apiKey": "apiKeySecurityScheme", "http": "httpAuthSecurityScheme", "oauth2": "oauth2SecurityScheme",
             "openIdConnect": "openIdConnectSecurityScheme", "mutualTLS": "mtlsSecurityScheme"}
_FLOW_ORDER = ("authorizationCode", "clientCredentials", "implicit", "password", "deviceCode")
_V03_ONLY = ("url", "preferredTransport", "protocolVersion", "additionalInterfaces",
             "supportsAuthenticatedExtendedCard", "security")


def as_v1(card: dict[str, Any]) -> dict[str, Any]:
    """``card`` (validated by :class:`node.core.a2a.card.AgentCard`) as a v1.0 card; a copy."""
    card = copy.deepcopy(card)
    if card.get("supportedInterfaces"):
        return card
    version = card.get("protocolVersion") or "0.3.0"
    interfaces = [{"url": card["url"], "protocolBinding": card.get("preferredTransport") or "JSONRPC",
                   "protocolVersion": version}]
    interfaces += [{"url": other["url"], "protocolBinding": other.get("transport") or "JSONRPC",
                    "protocolVersion": version} for other in card.get("additionalInterfaces") or []]
    extended = card.get("supportsAuthenticatedExtendedCard")
    capabilities = card.get("capabilities") or {}
    capabilities.pop("stateTransitionHistory", None)
    if extended and "extendedAgentCard" not in capabilities:
        capabilities["extendedAgentCard"] = True
    if capabilities or "capabilities" in card:
        card["capabilities"] = capabilities
    legacy = card.get("security")
    if legacy is not None and "securityRequirements" not in card:
        card["securityRequirements"] = _requirements(legacy)
    for skill in card.get("skills") or []:
        skill_legacy = skill.pop("security", None)
        if skill_legacy is not None and "securityRequirements" not in skill:
            skill["securityRequirements"] = _requirements(skill_legacy)
    for name, scheme in list((card.get("securitySchemes") or {}).items()):
        card["securitySchemes"][name] = _wrapped(scheme)
    for key in (*_V03_ONLY, "supportedInterfaces"):  # a null supportedInterfaces gives way to the converted ones
        card.pop(key, None)
    head = {key: card.pop(key) for key in ("name", "description") if key in card}
    return {**head, "supportedInterfaces": interfaces, **card}


def _requirements(legacy: list[dict[str, list[str]]]) -> list[dict[str, Any]]:
    return [{"schemes": {name: {"list": scopes} for name, scopes in requirement.items()}} for requirement in legacy]


def _wrapped(scheme: dict[str, Any]) -> dict[str, Any]:
    kind = scheme.get("type")
    if kind not in _WRAPPERS:
        return scheme  # a 1.0 scheme already
    details = {key: value for key, value in scheme.items() if key != "type"}
    if kind == "apiKey" and "in" in details:
        details["location"] = details.pop("in")
    flows = details.get("flows")
    if isinstance(flows, dict) and len([flow for flow in flows.values() if flow is not None]) > 1:
        # 1.0's flows are a one-of; the SDK's own conversion (to_core_oauth_flows) keeps the last.
        last = [name for name in _FLOW_ORDER if flows.get(name) is not None][-1]
        details["flows"] = {last: flows[last]}
    return {_WRAPPERS[kind]: details}


__all__ = ["as_v1"]
