"""A2A Agent Cards: register an agent from its card, export any registered agent as a card.

Both shapes in the wild are accepted: v1.0 (``supportedInterfaces`` with ``protocolBinding``)
and v0.3 (``url`` + ``preferredTransport`` + ``additionalInterfaces``). Skills become
capabilities (id → name, with description, tags and examples); the first interface becomes the
``primary`` endpoint, the others are named by their binding; the binding sets the transport
(``a2a+jsonrpc``, ``a2a+grpc``, ``a2a+http-json``). Export writes a v1.0 card. Cards are
validated like every boundary model: an unknown or mistyped field is a 422 naming it.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from .models import (
    CAPABILITY_NAME_PATTERN,
    DEFAULT_LEASE_TTL_MS,
    MAX_LEASE_TTL_MS,
    MIN_LEASE_TTL_MS,
    AgentId,
    AgentRecord,
    Registration,
    Strict,
    parse_version,
)

A2A_PROTOCOL_VERSION = "1.0"
_BINDING_TO_TRANSPORT = {"JSONRPC": "a2a+jsonrpc", "GRPC": "a2a+grpc", "HTTP+JSON": "a2a+http-json"}
_TRANSPORT_TO_BINDING = {transport: binding for binding, transport in _BINDING_TO_TRANSPORT.items()}
_CAPABILITY_NAME_RE = re.compile(CAPABILITY_NAME_PATTERN)


class _Card(Strict):
    """Card parts: camelCase on the wire, as the A2A specification spells them."""


class AgentInterface(_Card):
    url: str = Field(max_length=2_000)
    protocolBinding: str | None = Field(default=None, max_length=64)
    transport: str | None = Field(default=None, max_length=64, description="v0.3 name of protocolBinding")
    protocolVersion: str | None = Field(default=None, max_length=32)
    tenant: str | None = Field(default=None, max_length=200)

    @property
    def binding(self) -> str:
        return (self.protocolBinding or self.transport or "JSONRPC").upper()


class AgentSkill(_Card):
    id: str = Field(min_length=1, max_length=128)
    name: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", max_length=4_000)
    tags: list[str] = Field(default_factory=list, max_length=32)
    examples: list[str] = Field(default_factory=list, max_length=16)
    inputModes: list[str] | None = None
    outputModes: list[str] | None = None
    security: list[dict[str, Any]] | None = None
    securityRequirements: list[dict[str, Any]] | None = None


class AgentProvider(_Card):
    organization: str = Field(max_length=200)
    url: str | None = Field(default=None, max_length=2_000)


class AgentCard(_Card):
    """An A2A Agent Card, v1.0 or v0.3."""

    name: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", max_length=4_000)
    version: str = Field(default="1", max_length=64)
    skills: list[AgentSkill] = Field(min_length=1, max_length=64)
    # v1.0
    supportedInterfaces: list[AgentInterface] | None = Field(default=None, max_length=16)
    # v0.3
    url: str | None = Field(default=None, max_length=2_000)
    preferredTransport: str | None = Field(default=None, max_length=64)
    additionalInterfaces: list[AgentInterface] | None = Field(default=None, max_length=16)
    protocolVersion: str | None = Field(default=None, max_length=32)
    supportsAuthenticatedExtendedCard: bool | None = None
    # both
    provider: AgentProvider | None = None
    iconUrl: str | None = Field(default=None, max_length=2_000)
    documentationUrl: str | None = Field(default=None, max_length=2_000)
    capabilities: dict[str, Any] | None = None
    securitySchemes: dict[str, Any] | None = None
    security: list[dict[str, Any]] | None = None
    securityRequirements: list[dict[str, Any]] | None = None
    defaultInputModes: list[str] = Field(default_factory=lambda: ["text/plain"])
    defaultOutputModes: list[str] = Field(default_factory=lambda: ["text/plain"])
    signatures: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _has_an_interface(self) -> AgentCard:
        if not self.supportedInterfaces and not self.url:
            raise ValueError("a card needs supportedInterfaces (v1.0) or url (v0.3)")
        return self

    def interfaces(self) -> list[AgentInterface]:
        """Interfaces in preference order, whichever shape the card has."""
        if self.supportedInterfaces:
            return list(self.supportedInterfaces)
        preferred = AgentInterface(url=self.url or "", protocolBinding=self.preferredTransport or "JSONRPC",
                                   protocolVersion=self.protocolVersion)
        others = [i for i in self.additionalInterfaces or [] if i.url != preferred.url or i.binding != preferred.binding]
        return [preferred, *others]


class CardRegistration(Strict):
    """``POST /v1/agent-cards``: an agent registered from its A2A card."""

    agent_id: AgentId
    card: AgentCard
    lease_ttl_ms: int = Field(default=DEFAULT_LEASE_TTL_MS, ge=MIN_LEASE_TTL_MS, le=MAX_LEASE_TTL_MS)
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    weight: int = Field(default=100, ge=0, le=10_000)

    @field_validator("card", mode="before")
    @classmethod
    def _card_is_an_object(cls, value: object) -> object:
        if not isinstance(value, dict):
            raise ValueError("card must be a JSON object (an A2A Agent Card)")
        return value


def capability_name(skill_id: str) -> str:
    """A skill id as a capability name (lower case; other characters become ``_``)."""
    name = re.sub(r"[^a-z0-9_.:/-]", "_", skill_id.strip().lower()).lstrip("_.:/-") or "skill"
    return name[:128]


def _endpoint_name(binding: str, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "_", binding.lower()).strip("_")[:24] or "interface"
    if not base[0].isalpha():
        base = f"if_{base}"  # endpoint names start with a letter
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    return name


def card_to_registration(request: CardRegistration) -> Registration:
    """The registration an A2A card describes (raises ValueError naming what does not fit)."""
    card = request.card
    try:
        version = str(parse_version(card.version))
    except ValueError:
        version = "1"
    capabilities = []
    seen: set[str] = set()
    for position, skill in enumerate(card.skills):
        name = capability_name(skill.id)
        if not _CAPABILITY_NAME_RE.match(name) or name in seen:
            raise ValueError(f"card.skills.{position}.id: {skill.id!r} does not give a unique capability name")
        seen.add(name)
        description = skill.description or skill.name
        # As data, validated with the registration, so a limit it breaks is named by card_field().
        capabilities.append({"name": name, "version": version, "description": description, "tags": skill.tags,
                             "examples": skill.examples})
    interfaces = card.interfaces()
    endpoints: dict[str, str] = {"primary": interfaces[0].url}
    for interface in interfaces[1:]:
        endpoints[_endpoint_name(interface.binding, set(endpoints))] = interface.url
    transport = _BINDING_TO_TRANSPORT.get(interfaces[0].binding, "a2a+" + re.sub(r"[^a-z0-9]+", "-",
                                                                                 interfaces[0].binding.lower()))
    labels = {"a2a.protocol_version": interfaces[0].protocolVersion or card.protocolVersion or A2A_PROTOCOL_VERSION,
              **request.labels}
    if card.provider is not None:
        labels.setdefault("a2a.provider", card.provider.organization[:200])
    return Registration.model_validate({
        "agent_id": request.agent_id, "display_name": card.name, "description": card.description,
        "capabilities": capabilities, "endpoints": endpoints, "transport": transport[:32],
        "lease_ttl_ms": request.lease_ttl_ms, "labels": labels, "weight": request.weight,
    })


# Where a registration field came from in the card, for errors that name what the author wrote.
_CARD_FIELDS = {"capabilities": "card.skills", "display_name": "card.name", "description": "card.description",
                "endpoints": "card.supportedInterfaces", "transport": "card.supportedInterfaces.0.protocolBinding",
                "labels": "labels"}


_SKILL_FIELDS = {"name": "id"}


def card_field(location: tuple[int | str, ...]) -> str:
    """The card path of a registration field's validation error location."""
    if not location:
        return "card"
    head, *rest = (str(part) for part in location)
    if head == "capabilities" and len(rest) >= 2:
        position, field, *inner = rest
        if field == "version":
            return "card.version"  # every skill takes the card's version
        return ".".join(["card.skills", position, _SKILL_FIELDS.get(field, field), *inner])
    return ".".join([_CARD_FIELDS.get(head, head), *rest])


def record_to_card(record: AgentRecord) -> dict[str, Any]:
    """A v1.0 A2A Agent Card for a registered agent."""
    binding = _TRANSPORT_TO_BINDING.get(record.transport, "HTTP+JSON" if record.transport.startswith("http")
                                        else record.transport.removeprefix("a2a+").upper())
    protocol_version = record.labels.get("a2a.protocol_version", A2A_PROTOCOL_VERSION)
    interfaces = [{"url": record.endpoints["primary"], "protocolBinding": binding, "protocolVersion": protocol_version}]
    for name, url in record.endpoints.items():
        if name != "primary":
            interfaces.append({"url": url, "protocolBinding": name.upper().replace("_", "+"),
                               "protocolVersion": protocol_version})
    versions = [capability.parsed_version for capability in record.capabilities]
    card: dict[str, Any] = {
        "name": record.display_name or record.agent_id,
        "description": record.description,
        "version": str(max(versions)) if versions else "1",
        "supportedInterfaces": interfaces,
        "capabilities": {},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [{"id": capability.name, "name": capability.name, "description": capability.description,
                    "tags": capability.tags, "examples": capability.examples} for capability in record.capabilities],
    }
    if "a2a.provider" in record.labels:
        card["provider"] = {"organization": record.labels["a2a.provider"]}
    return card
