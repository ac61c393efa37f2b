"""The A2A Agent Card as the registry accepts it: every field of v1.0 and of v0.3, bounded.

A card is hostile input, so it is checked before anything reads it: at most
:data:`MAX_CARD_BYTES` of JSON and :data:`MAX_CARD_DEPTH` levels of nesting, then a strict model
of both shapes — v1.0 (``supportedInterfaces`` with ``protocolBinding``, security schemes as a
one-of wrapper, requirements as ``{"schemes": {name: {"list": scopes}}}``) and v0.3 (``url`` +
``preferredTransport`` + ``additionalInterfaces``, schemes tagged with ``type``, requirements as
``{name: scopes}``) — in camelCase, as the specification and the SDK's JSON write them. The two
may be mixed (the A2A SDK's server writes a v1.0 card with the v0.3 fields added for old
clients). An unknown or mistyped field is a 422 naming it; text is bounded and free of control
characters; free-form JSON (extension ``params``, a signature's ``header``) is bounded like
envelope payloads. The model is only the check: the registry keeps the card as it was given
(:meth:`AgentCard.given`). This module does no I/O.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import orjson
from pydantic import AfterValidator, Field, PrivateAttr, model_validator

from ..models import MULTI_LINE_PATTERN, SINGLE_LINE_PATTERN, JsonValue, Strict, check_url

MAX_CARD_BYTES = 64 * 1024
MAX_CARD_DEPTH = 16
CORE_BINDINGS = ("JSONRPC", "HTTP+JSON", "GRPC")
ENDPOINT_SCHEMES = ("http", "https", "grpc", "grpcs", "ws", "wss")
# gRPC's "host:port" (the specification allows it for GRPC interfaces): a name or [IPv6], a port.
_HOST_PORT_RE = re.compile(r"^(?P<host>[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]):"
                           r"(?P<port>[0-9]{1,5})$")

Line = Annotated[str, Field(max_length=200, pattern=SINGLE_LINE_PATTERN)]
Prose = Annotated[str, Field(max_length=4_000, pattern=MULTI_LINE_PATTERN)]
Url = Annotated[str, Field(max_length=2_000, pattern=SINGLE_LINE_PATTERN)]
# A link a client may open or fetch (an icon, documentation, a provider's site, an OAuth endpoint):
# http(s) only, so no javascript: or data: URL reaches a console or a client that follows it.
WebUrl = Annotated[Url, AfterValidator(check_url)]
Mode = Annotated[str, Field(max_length=128, pattern=SINGLE_LINE_PATTERN)]
Modes = Annotated[list[Mode], Field(max_length=32)]
Scopes = Annotated[list[Line], Field(max_length=64)]
Json = dict[Annotated[str, Field(max_length=200)], JsonValue]


class _Card(Strict):
    """Card parts: camelCase on the wire, as the A2A specification spells them."""


def card_url(value: str, *, grpc: bool = False) -> str:
    """The address a card's URL gives, as the registry stores endpoints; raises ValueError saying why not.

    ``grpc``: the interface is GRPC, whose URL may also be ``host:port`` (stored as ``grpc://host:port``).
    """
    found = _HOST_PORT_RE.match(value)
    if found is not None:
        if not grpc:
            raise ValueError("is host:port, which only a GRPC interface may give; write an absolute URL "
                             "(http:// or https://)")
        if int(found["port"]) > 65_535:
            raise ValueError("has a port above 65535")
        return f"grpc://{value}"
    try:
        return check_url(value, schemes=ENDPOINT_SCHEMES)
    except ValueError as exc:
        also = " or host:port" if grpc else ""
        raise ValueError(f"{exc}{also}") from None


class AgentInterface(_Card):
    """One interface: v1.0 names its binding ``protocolBinding``, v0.3's ``additionalInterfaces`` ``transport``."""

    url: Url
    protocolBinding: Line | None = None
    transport: Line | None = Field(default=None, description="v0.3 name of protocolBinding")
    protocolVersion: Annotated[str, Field(max_length=32, pattern=SINGLE_LINE_PATTERN)] | None = None
    tenant: Line | None = None

    @property
    def binding(self) -> str:
        return (self.protocolBinding or self.transport or "JSONRPC").upper()


class AgentProvider(_Card):
    organization: Line
    url: WebUrl | None = None


class AgentExtension(_Card):
    uri: Url
    description: Prose | None = None
    required: bool | None = None
    params: Json | None = Field(default=None, max_length=64)


class AgentCapabilities(_Card):
    streaming: bool | None = None
    pushNotifications: bool | None = None
    extendedAgentCard: bool | None = None
    stateTransitionHistory: bool | None = Field(default=None, description="v0.3 only; 1.0 dropped it")
    extensions: list[AgentExtension] | None = Field(default=None, max_length=16)


class OAuthFlow(_Card):
    """Any of the five flows (each uses the URLs it has)."""

    authorizationUrl: WebUrl | None = None
    tokenUrl: WebUrl | None = None
    refreshUrl: WebUrl | None = None
    deviceAuthorizationUrl: WebUrl | None = None
    scopes: dict[Line, Prose] | None = Field(default=None, max_length=64)
    pkceRequired: bool | None = None


class OAuthFlows(_Card):
    """v0.3 may give several flows; in 1.0 they are a one-of (:mod:`node.core.a2a.convert` keeps the last)."""

    authorizationCode: OAuthFlow | None = None
    clientCredentials: OAuthFlow | None = None
    implicit: OAuthFlow | None = None
    password: OAuthFlow | None = None
    deviceCode: OAuthFlow | None = None

    def given_flows(self) -> list[str]:
        return [name for name in OAUTH_FLOWS if getattr(self, name) is not None]


OAUTH_FLOWS = ("authorizationCode", "clientCredentials", "implicit", "password", "deviceCode")


class SchemeDetails(_Card):
    """The fields of one scheme, in a v1.0 wrapper (``httpAuthSecurityScheme: {...}``)."""

    description: Prose | None = None
    location: Line | None = None
    name: Line | None = None
    scheme: Line | None = None
    bearerFormat: Line | None = None
    flows: OAuthFlows | None = None
    oauth2MetadataUrl: WebUrl | None = None
    openIdConnectUrl: WebUrl | None = None


V1_SCHEMES = ("apiKeySecurityScheme", "httpAuthSecurityScheme", "oauth2SecurityScheme",
              "openIdConnectSecurityScheme", "mtlsSecurityScheme")


class SecurityScheme(SchemeDetails):
    """v1.0: one wrapper field; v0.3: ``type`` and the fields beside it; the SDK's server writes both."""

    apiKeySecurityScheme: SchemeDetails | None = None
    httpAuthSecurityScheme: SchemeDetails | None = None
    oauth2SecurityScheme: SchemeDetails | None = None
    openIdConnectSecurityScheme: SchemeDetails | None = None
    mtlsSecurityScheme: SchemeDetails | None = None
    type: Literal["apiKey", "http", "oauth2", "openIdConnect", "mutualTLS"] | None = None
    in_: Line | None = Field(default=None, alias="in", description="v0.3 apiKey: where the key goes")

    @model_validator(mode="after")
    def _one_kind(self) -> SecurityScheme:
        wrapped = [name for name in V1_SCHEMES if getattr(self, name) is not None]
        if len(wrapped) > 1:
            raise ValueError(f"a security scheme is one kind: it gives {' and '.join(wrapped)}")
        if not wrapped and self.type is None:
            raise ValueError(f"a security scheme needs one of {', '.join(V1_SCHEMES)} (1.0) or type (0.3)")
        oauth2 = self.oauth2SecurityScheme
        flows = oauth2.flows.given_flows() if oauth2 is not None and oauth2.flows is not None else []
        if len(flows) > 1:
            raise ValueError(f"an A2A 1.0 oauth2 scheme has one flow; it gives {' and '.join(flows)}")
        return self


class StringList(_Card):
    list: Scopes = Field(default_factory=lambda: [])  # the SDK's JSON leaves an empty list out


class SecurityRequirement(_Card):
    """v1.0: ``{"schemes": {"bearer": {"list": ["scope"]}}}``."""

    schemes: dict[Line, StringList] = Field(default_factory=dict, max_length=16)


LegacyRequirement = Annotated[dict[Line, Scopes], Field(max_length=16)]  # v0.3: {"bearer": ["scope"]}


class AgentSkill(_Card):
    id: Annotated[str, Field(min_length=1, max_length=128, pattern=SINGLE_LINE_PATTERN)]
    name: Annotated[str, Field(min_length=1, max_length=200, pattern=SINGLE_LINE_PATTERN)]
    description: Prose | None = None
    tags: list[Annotated[str, Field(max_length=64, pattern=SINGLE_LINE_PATTERN)]] | None = Field(
        default=None, max_length=32)
    examples: list[Annotated[str, Field(max_length=500, pattern=MULTI_LINE_PATTERN)]] | None = Field(
        default=None, max_length=16)
    inputModes: Modes | None = None
    outputModes: Modes | None = None
    securityRequirements: list[SecurityRequirement] | None = Field(default=None, max_length=16)
    security: list[LegacyRequirement] | None = Field(default=None, max_length=16)


class AgentCardSignature(_Card):
    protected: Annotated[str, Field(max_length=8_000, pattern=SINGLE_LINE_PATTERN)]
    signature: Annotated[str, Field(max_length=8_000, pattern=SINGLE_LINE_PATTERN)]
    header: Json | None = Field(default=None, max_length=32)


class AgentCard(_Card):
    """An A2A Agent Card, v1.0 or v0.3 (or both at once); :meth:`given` is the card as it came."""

    name: Line = Field(min_length=1)
    description: Prose | None = None
    version: Annotated[str, Field(max_length=64, pattern=SINGLE_LINE_PATTERN)] | None = None
    skills: list[AgentSkill] = Field(min_length=1, max_length=64)
    # v1.0
    supportedInterfaces: list[AgentInterface] | None = Field(default=None, max_length=16)
    # v0.3
    url: Url | None = None
    preferredTransport: Line | None = None
    additionalInterfaces: list[AgentInterface] | None = Field(default=None, max_length=15)
    protocolVersion: Annotated[str, Field(max_length=32, pattern=SINGLE_LINE_PATTERN)] | None = None
    supportsAuthenticatedExtendedCard: bool | None = None
    security: list[LegacyRequirement] | None = Field(default=None, max_length=16)
    # both
    provider: AgentProvider | None = None
    iconUrl: WebUrl | None = None
    documentationUrl: WebUrl | None = None
    capabilities: AgentCapabilities | None = None
    securitySchemes: dict[Line, SecurityScheme] | None = Field(default=None, max_length=16)
    securityRequirements: list[SecurityRequirement] | None = Field(default=None, max_length=16)
    defaultInputModes: Modes | None = None
    defaultOutputModes: Modes | None = None
    signatures: list[AgentCardSignature] | None = Field(default=None, max_length=8)
    _given: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _bounded_and_kept(cls, value: Any, handler: Any) -> AgentCard:
        if isinstance(value, AgentCard):
            return value
        if not isinstance(value, dict):
            raise ValueError("must be a JSON object (an A2A Agent Card)")
        _check_bounds(value)
        card: AgentCard = handler(value)
        card._given = orjson.loads(orjson.dumps(value))  # a copy nobody else holds
        return card

    @model_validator(mode="after")
    def _interfaces(self) -> AgentCard:
        if not self.supportedInterfaces and not self.url:
            raise ValueError("a card needs supportedInterfaces (A2A 1.0) or url (A2A 0.3)")
        return self

    @property
    def is_v1(self) -> bool:
        """A v1.0 card (``supportedInterfaces``); else a v0.3 one, whose ``url`` is its preferred interface."""
        return bool(self.supportedInterfaces)

    def given(self) -> dict[str, Any]:
        """The card exactly as it was given (a fresh copy)."""
        return orjson.loads(orjson.dumps(self._given))

    def interfaces(self) -> list[AgentInterface]:
        """Interfaces in preference order, whichever shape the card has (v1.0 wins when it has both)."""
        if self.supportedInterfaces:
            return list(self.supportedInterfaces)
        version = self.protocolVersion or "0.3.0"
        preferred = AgentInterface(url=self.url or "", protocolBinding=self.preferredTransport or "JSONRPC",
                                   protocolVersion=version)
        return [preferred, *(AgentInterface(url=other.url, protocolBinding=other.binding, protocolVersion=version)
                             for other in self.additionalInterfaces or [])]

    def interfaces_field(self) -> str:
        """Where the interfaces are in this card, for errors."""
        return "card.supportedInterfaces" if self.supportedInterfaces else "card.url"


def interface_field(card: AgentCard, position: int) -> str:
    """The card path of interface ``position`` of :meth:`AgentCard.interfaces`."""
    if card.supportedInterfaces:
        return f"card.supportedInterfaces.{position}.url"
    return "card.url" if position == 0 else f"card.additionalInterfaces.{position - 1}.url"


def _check_bounds(value: dict[str, Any]) -> None:
    try:
        size = len(orjson.dumps(value))
    except TypeError:  # orjson.JSONEncodeError: an integer beyond 64 bits, a key that is no string
        raise ValueError("holds a value JSON encoders do not carry (an integer beyond 64 bits?)") from None
    if size > MAX_CARD_BYTES:
        raise ValueError(f"is {size} bytes of JSON; a card may have at most {MAX_CARD_BYTES}")
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_CARD_DEPTH:
            raise ValueError(f"is nested deeper than {MAX_CARD_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)


__all__ = ["CORE_BINDINGS", "MAX_CARD_BYTES", "MAX_CARD_DEPTH", "AgentCapabilities", "AgentCard",
           "AgentCardSignature", "AgentExtension", "AgentInterface", "AgentProvider", "AgentSkill", "SecurityScheme",
           "card_url", "interface_field"]
