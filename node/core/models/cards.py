"""An agent registered from its A2A Agent Card: the card as it was given, and what the registry
read of it (:class:`CardListing`, an :class:`~node.core.models.AgentRecord`'s ``a2a``). This module does no I/O.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .fields import SINGLE_LINE_PATTERN, JsonValue, Strict


class CardListing(Strict):
    """The card an agent registered with (kept as given) and its preferred interface."""

    card: dict[Annotated[str, Field(max_length=200)], JsonValue] = Field(
        description="The A2A Agent Card exactly as registered (v1.0 or v0.3).")
    format: Literal["1.0", "0.3"] = Field(description="1.0: the card has supportedInterfaces; 0.3: url.")
    public: bool = Field(default=False, description="The registration asked for its card to be served without a "
                                                    "token (when the region's policy allows public cards).")
    binding: str = Field(max_length=64, pattern=SINGLE_LINE_PATTERN,
                         description="The preferred interface's protocolBinding, upper case (JSONRPC, HTTP+JSON, "
                                     "GRPC, …): what a caller routed to the agent speaks.")
    protocol_version: str = Field(max_length=32, pattern=SINGLE_LINE_PATTERN)
    tenant: str | None = Field(default=None, max_length=200, pattern=SINGLE_LINE_PATTERN)


# The transports a registration names for the three core bindings (a card's binding sets it).
BINDING_TRANSPORTS = {"JSONRPC": "a2a+jsonrpc", "GRPC": "a2a+grpc", "HTTP+JSON": "a2a+http-json"}
TRANSPORT_BINDINGS = {transport: binding for binding, transport in BINDING_TRANSPORTS.items()}
DEFAULT_PROTOCOL_VERSION = "1.0"
PROTOCOL_VERSION_LABEL = "a2a.protocol_version"


def a2a_interface(listing: CardListing | None, transport: str, labels: dict[str, str]) -> tuple[str | None, str | None]:
    """The A2A binding and protocol version a caller speaks to an agent; ``(None, None)``: not A2A.

    From the card it registered with, else from an ``a2a+…`` transport (and its
    ``a2a.protocol_version`` label) of a registration made by hand.
    """
    if listing is not None:
        return listing.binding, listing.protocol_version
    if transport.startswith("a2a+"):
        binding = TRANSPORT_BINDINGS.get(transport, transport.removeprefix("a2a+").upper())
        return binding, labels.get(PROTOCOL_VERSION_LABEL, DEFAULT_PROTOCOL_VERSION)
    return None, None
