"""Registering an agent from its A2A Agent Card (``POST /v1/agent-cards``).

The card is kept as it was given (:class:`~node.core.models.CardListing`, the record's ``a2a``) and
read for what the registry routes by: each skill becomes a capability (its id lower-cased as
the name — the card keeps the id as written — with its description, or its name when it has
none, its tags and examples), the first interface the ``primary`` endpoint and the others named
by their binding (``jsonrpc``, ``http_json``, ``grpc``), the first interface's binding the
transport (``a2a+jsonrpc``, ``a2a+grpc``, ``a2a+http-json``). A GRPC interface may be
``host:port`` (stored as ``grpc://host:port``). Without a ``readiness_probe`` the node probes the
first interface (``accept: listening``), so an agent is ready only once something answers there.
The registry's own extension (:data:`REGISTRY_EXTENSION_URI`) in a card — one a registry
exported — is dropped when it is registered: the registry writes that one, nobody else; an
extension that only passes for it (another URI of the ``urn:agent-reach:`` namespace, a space or
a capital letter in it) is refused, naming the extension.
"""

from __future__ import annotations

import re
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field

from ..models import (
    BINDING_TRANSPORTS,
    CAPABILITY_NAME_PATTERN,
    DEFAULT_LEASE_TTL_MS,
    MAX_LEASE_TTL_MS,
    MIN_LEASE_TTL_MS,
    PROTOCOL_VERSION_LABEL,
    SINGLE_LINE_PATTERN,
    AgentId,
    CardListing,
    Probe,
    Registration,
    Strict,
    parse_version,
)
from .card import AgentCard, card_url, interface_field

REGISTRY_EXTENSION_URI = "urn:agent-reach:a2a:registry:v1"
_REGISTRY_NAMESPACE = "urn:agent-reach:"
_CAPABILITY_NAME_RE = re.compile(CAPABILITY_NAME_PATTERN)
_PROBE_SCHEMES = {"grpc": "http", "grpcs": "https", "ws": "http", "wss": "https"}


class CardRegistration(Strict):
    """``POST /v1/agent-cards``: an agent registered from its A2A card."""

    agent_id: AgentId
    card: AgentCard
    public_card: bool = Field(
        default=False, description="Serve this card without a token at /agents/{agent_id}/.well-known/agent-card.json "
                                   "(only where the region's policy allows public cards; otherwise the usual bearer "
                                   "rules and allowed_callers apply).")
    lease_ttl_ms: int = Field(default=DEFAULT_LEASE_TTL_MS, ge=MIN_LEASE_TTL_MS, le=MAX_LEASE_TTL_MS)
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    weight: int = Field(default=100, ge=0, le=10_000)
    allowed_callers: list[Annotated[str, Field(max_length=200, pattern=SINGLE_LINE_PATTERN)]] = Field(
        default_factory=list, max_length=64,
        description="As a registration's: who may see the agent (its card included) and call it; empty = anyone.")
    readiness_probe: Probe | None = Field(
        default=None, description="None: the node probes the card's first interface (accept: listening).")


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


def interface_probe(endpoint: str) -> Probe:
    """The readiness probe of an interface: a GET at it (an http(s) URL for gRPC and WebSocket
    addresses), where any answer below 500 — or a server speaking another protocol — is a success."""
    parts = urlsplit(endpoint)
    scheme = _PROBE_SCHEMES.get(parts.scheme, parts.scheme)
    return Probe(url=urlunsplit((scheme, parts.netloc, parts.path or "/", parts.query, "")), accept="listening")


def card_to_registration(request: CardRegistration) -> tuple[Registration, CardListing, dict[str, str]]:
    """The registration an A2A card describes, the listing that keeps the card, and where each
    endpoint came from in the card (for errors about an address). Raises ValueError ``"field: why"``."""
    card = request.card
    interfaces = card.interfaces()
    endpoints: dict[str, str] = {}
    sources: dict[str, str] = {}
    for position, interface in enumerate(interfaces):
        field = interface_field(card, position)
        try:
            url = card_url(interface.url, grpc=interface.binding == "GRPC")
        except ValueError as exc:
            raise ValueError(f"{field}: the {interface.binding} interface's url {exc}") from None
        name = "primary" if position == 0 else _endpoint_name(interface.binding, set(endpoints))
        endpoints[name] = url
        sources[f"endpoints.{name}"] = field
    preferred = interfaces[0]
    protocol_version = preferred.protocolVersion or card.protocolVersion or ("1.0" if card.is_v1 else "0.3.0")
    binding = preferred.binding
    transport = BINDING_TRANSPORTS.get(binding, "a2a+" + re.sub(r"[^a-z0-9]+", "-", binding.lower()).strip("-"))
    labels = {PROTOCOL_VERSION_LABEL: protocol_version, **request.labels}
    if card.provider is not None:
        labels.setdefault("a2a.provider", card.provider.organization)
    registration = Registration.model_validate({
        "agent_id": request.agent_id, "display_name": card.name, "description": card.description or "",
        "capabilities": _capabilities(card), "endpoints": endpoints, "transport": transport[:32],
        "lease_ttl_ms": request.lease_ttl_ms, "labels": labels, "weight": request.weight,
        "allowed_callers": request.allowed_callers,
        "readiness_probe": request.readiness_probe or interface_probe(endpoints["primary"]),
    })
    listing = CardListing(card=_without_registry_extension(card.given()), format="1.0" if card.is_v1 else "0.3", public=request.public_card,
                          binding=binding, protocol_version=protocol_version, tenant=preferred.tenant)
    return registration, listing, sources


def _capabilities(card: AgentCard) -> list[dict[str, object]]:
    try:
        version = str(parse_version(card.version or "1"))
    except ValueError:
        version = "1"
    capabilities = []
    seen: set[str] = set()
    for position, skill in enumerate(card.skills):
        name = capability_name(skill.id)
        if not _CAPABILITY_NAME_RE.match(name) or name in seen:
            raise ValueError(f"card.skills.{position}.id: {skill.id!r} does not give a unique capability name "
                             "(skill ids are compared lower-cased)")
        seen.add(name)
        # As data, validated with the registration, so a limit it breaks is named by card_field().
        capabilities.append({"name": name, "version": version, "description": skill.description or skill.name,
                             "tags": skill.tags or [], "examples": skill.examples or []})
    return capabilities


def registry_like(uri: object) -> bool:
    """Whether an extension's ``uri`` is, or passes for, the registry's own: in the registry's
    ``urn:agent-reach:`` namespace once spaces and case are ignored."""
    return isinstance(uri, str) and "".join(uri.split()).casefold().startswith(_REGISTRY_NAMESPACE)


def _without_registry_extension(card: dict[str, Any]) -> dict[str, Any]:
    """The card without the registry's extension (the registry writes that one, nobody else);
    raises ValueError naming an extension that only looks like it."""
    capabilities = card.get("capabilities")
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    if isinstance(extensions, list):
        for position, extension in enumerate(extensions):
            uri = extension.get("uri") if isinstance(extension, dict) else None
            if registry_like(uri) and uri != REGISTRY_EXTENSION_URI:
                raise ValueError(f"card.capabilities.extensions.{position}.uri: {uri!r} passes for the registry's "
                                 f"own extension ({REGISTRY_EXTENSION_URI}), which only the registry writes; give "
                                 "your extension a URI of your own")
        kept = [e for e in extensions if not (isinstance(e, dict) and e.get("uri") == REGISTRY_EXTENSION_URI)]
        if len(kept) < len(extensions):
            if kept:
                capabilities["extensions"] = kept
            else:
                del capabilities["extensions"]
    return card


# Where a registration field came from in the card, for errors that name what the author wrote.
_CARD_FIELDS = {"capabilities": "card.skills", "display_name": "card.name", "description": "card.description",
                "endpoints": "card.supportedInterfaces", "transport": "card.supportedInterfaces.0.protocolBinding",
                "labels": "labels", "readiness_probe": "readiness_probe", "allowed_callers": "allowed_callers"}
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


__all__ = ["REGISTRY_EXTENSION_URI", "CardRegistration", "capability_name", "card_field", "card_to_registration",
           "interface_probe", "registry_like"]
