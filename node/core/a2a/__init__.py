"""A2A: Agent Cards registered as given, served the way A2A clients look for them.

::

    card        the card as the registry accepts it (v1.0, v0.3 or both at once), bounded; AgentCard
    convert     a v0.3 card read as v1.0, as the A2A SDK reads it
    registration CardRegistration (POST /v1/agent-cards) and the registration a card describes
    export      the cards the registry serves: an agent's (as given, plus the registry's extension)
                and its own (/.well-known/agent-card.json)
    routes      the well-known HTTP routes (imports aiohttp.web; not imported here, so the SDK,
                which uses this package, loads no server code)

None of these modules but ``routes`` does I/O.
"""

from __future__ import annotations

from .card import MAX_CARD_BYTES, MAX_CARD_DEPTH, AgentCard, AgentInterface, AgentSkill
from .convert import as_v1
from .export import (
    AGENT_CARD_PATH,
    AGENT_CARD_ROUTE,
    ENVELOPE_BINDING_PREFIX,
    REGISTRY_BINDING,
    ROUTE_CREDENTIAL_SCHEME,
    agent_card_url,
    exported_card,
    registry_card,
    registry_extension,
)
from .registration import (
    REGISTRY_EXTENSION_URI,
    CardRegistration,
    capability_name,
    card_field,
    card_to_registration,
    interface_probe,
)

__all__ = [
    "AGENT_CARD_PATH", "AGENT_CARD_ROUTE", "ENVELOPE_BINDING_PREFIX", "MAX_CARD_BYTES", "MAX_CARD_DEPTH",
    "REGISTRY_BINDING", "REGISTRY_EXTENSION_URI", "ROUTE_CREDENTIAL_SCHEME", "AgentCard", "AgentInterface",
    "AgentSkill", "CardRegistration", "agent_card_url", "as_v1", "capability_name", "card_field",
    "card_to_registration", "exported_card", "interface_probe", "registry_card", "registry_extension",
]
