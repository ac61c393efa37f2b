"""A2A with the official SDK (a2a-sdk): cards built with it, registered, served back, read by it.

* Round trip: a card built with the SDK (v1.0 protobuf, and the v0.3 compat model), every
  optional field set, registered over HTTP, fetched where A2A clients look and parsed by the SDK
  is the same card, byte for byte after the SDK's own serialisation — once the registry's
  extension (its own URI, appended to ``capabilities.extensions``) is taken out; a signed card
  keeps its signatures, which verify over the card without the registry's extension.
* Hostile cards: a link that is not http(s) (``javascript:``, ``data:``) is a 422 naming the
  field; an extension that passes for the registry's is refused, and whatever a card carries
  (made-up signatures included) the registry's extension served is the one it writes.
* Discovery: ``A2ACardResolver`` against a live node finds the registry's card and a public
  agent's card without a token; a card that is not public needs one and follows
  ``allowed_callers`` (404 for a caller who may not see the agent).
"""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
from a2a.client.card_resolver import A2ACardResolver, parse_agent_card
from a2a.client.errors import AgentCardResolutionError
from a2a.compat.v0_3 import types as v03
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types import a2a_pb2 as pb
from a2a.utils.signing import create_agent_card_signer, create_signature_verifier
from google.protobuf.json_format import MessageToDict, MessageToJson, ParseDict
from google.protobuf.struct_pb2 import Struct

from node.core.a2a import REGISTRY_EXTENSION_URI
from node.core.models import TokenRole

from ..conftest import NodeFactory
from ..helpers import RunningNode

SIGNING_SECRET = "a2a-card-signing-secret-of-32-bytes!"


def _nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(levels):
        value = {"deeper": value}
    return value


def _params(**values: Any) -> Struct:
    struct = Struct()
    struct.update(values)
    return struct


def _flows() -> pb.OAuthFlows:
    scopes = {"rates:read": "Read rates", "rates:write": "Change rates"}
    return pb.OAuthFlows(authorization_code=pb.AuthorizationCodeOAuthFlow(
        authorization_url="https://auth.example.com/authorize", token_url="https://auth.example.com/token",
        refresh_url="https://auth.example.com/refresh", scopes=scopes, pkce_required=True))


def full_v1_card(port: int) -> pb.AgentCard:
    """A v1.0 card with every optional field set (signatures are added by the signed variant)."""
    requirement = pb.SecurityRequirement(schemes={"oauth": pb.StringList(list=["rates:read"]),
                                                  "bearer": pb.StringList(list=[])})
    return pb.AgentCard(
        name="FX Rates", description="Exchange rates, quoted and converted.\nTwo lines.", version="2.1.0",
        supported_interfaces=[
            pb.AgentInterface(url=f"http://127.0.0.1:{port}/a2a/jsonrpc", protocol_binding="JSONRPC",
                              protocol_version="1.0", tenant="acme"),
            pb.AgentInterface(url=f"http://127.0.0.1:{port}/a2a/rest", protocol_binding="HTTP+JSON",
                              protocol_version="1.0"),
            pb.AgentInterface(url=f"127.0.0.1:{port + 1}", protocol_binding="GRPC", protocol_version="1.0"),
        ],
        provider=pb.AgentProvider(organization="Acme FX", url="https://acme.example.com"),
        documentation_url="https://acme.example.com/docs/fx", icon_url="https://acme.example.com/fx.png",
        capabilities=pb.AgentCapabilities(
            streaming=True, push_notifications=True, extended_agent_card=True,
            extensions=[pb.AgentExtension(uri="https://acme.example.com/ext/quota/v1", description="Quota",
                                          required=True, params=_params(limit=100, unit="calls/day",
                                                                        zones=["eu", "us"]))]),
        security_schemes={
            "apikey": pb.SecurityScheme(api_key_security_scheme=pb.APIKeySecurityScheme(
                description="Key", location="header", name="X-API-Key")),
            "bearer": pb.SecurityScheme(http_auth_security_scheme=pb.HTTPAuthSecurityScheme(
                description="JWT", scheme="Bearer", bearer_format="JWT")),
            "oauth": pb.SecurityScheme(oauth2_security_scheme=pb.OAuth2SecurityScheme(
                description="OAuth", flows=_flows(), oauth2_metadata_url="https://auth.example.com/.well-known")),
            "oidc": pb.SecurityScheme(open_id_connect_security_scheme=pb.OpenIdConnectSecurityScheme(
                description="OIDC", open_id_connect_url="https://auth.example.com/.well-known/openid-configuration")),
            "mtls": pb.SecurityScheme(mtls_security_scheme=pb.MutualTlsSecurityScheme(description="mTLS")),
        },
        security_requirements=[requirement],
        default_input_modes=["text/plain", "application/json"], default_output_modes=["application/json"],
        skills=[
            pb.AgentSkill(id="Get-Rates", name="Get rates", description="Current rates for a currency pair",
                          tags=["FX", "rates"], examples=["EUR to USD?", "rates for GBP"],
                          input_modes=["text/plain"], output_modes=["application/json"],
                          security_requirements=[requirement]),
            pb.AgentSkill(id="convert", name="Convert", description="Convert an amount", tags=["fx"],
                          examples=["100 EUR in JPY"], input_modes=["application/json"],
                          output_modes=["text/plain"]),
        ],
    )


def full_v03_card(port: int) -> v03.AgentCard:
    """A v0.3 card (the SDK's compat model) with every optional field set."""
    flows = v03.OAuthFlows(
        authorization_code=v03.AuthorizationCodeOAuthFlow(
            authorization_url="https://auth.example.com/authorize", token_url="https://auth.example.com/token",
            refresh_url="https://auth.example.com/refresh", scopes={"rates:read": "Read rates"}))
    schemes = {
        "apikey": v03.SecurityScheme(root=v03.APIKeySecurityScheme(description="Key", in_="header", name="X-Key")),
        "bearer": v03.SecurityScheme(root=v03.HTTPAuthSecurityScheme(description="JWT", scheme="Bearer",
                                                                     bearer_format="JWT")),
        "oauth": v03.SecurityScheme(root=v03.OAuth2SecurityScheme(
            description="OAuth", flows=flows, oauth2_metadata_url="https://auth.example.com/.well-known")),
        "oidc": v03.SecurityScheme(root=v03.OpenIdConnectSecurityScheme(
            description="OIDC", open_id_connect_url="https://auth.example.com/.well-known/openid-configuration")),
        "mtls": v03.SecurityScheme(root=v03.MutualTLSSecurityScheme(description="mTLS")),
    }
    return v03.AgentCard(
        name="Invoice Reader", description="Reads invoices", version="0.9.1",
        url=f"http://127.0.0.1:{port}/a2a/v1", preferred_transport="JSONRPC", protocol_version="0.3.0",
        additional_interfaces=[v03.AgentInterface(url=f"http://127.0.0.1:{port}/a2a/rest", transport="HTTP+JSON"),
                               v03.AgentInterface(url=f"http://127.0.0.1:{port + 1}/grpc", transport="GRPC")],
        provider=v03.AgentProvider(organization="Acme Finance", url="https://finance.example.com"),
        icon_url="https://finance.example.com/icon.png", documentation_url="https://finance.example.com/docs",
        capabilities=v03.AgentCapabilities(
            streaming=True, push_notifications=False, state_transition_history=True,
            extensions=[v03.AgentExtension(uri="https://finance.example.com/ext/v1", description="Ext",
                                           required=False, params={"depth": {"a": [1, 2]}})]),
        security_schemes=schemes, security=[{"oauth": ["rates:read"]}, {"bearer": []}],
        default_input_modes=["application/pdf"], default_output_modes=["application/json"],
        skills=[v03.AgentSkill(id="Read-Invoice", name="Read invoice", description="Fields of an invoice",
                               tags=["invoice", "OCR"], examples=["Read this invoice"],
                               input_modes=["application/pdf"], output_modes=["application/json"],
                               security=[{"bearer": []}])],
        supports_authenticated_extended_card=True,
        signatures=None,
    )


def v03_json(card: v03.AgentCard) -> dict[str, Any]:
    """The v0.3 card as the SDK serialises it (camelCase, no nulls)."""
    return card.model_dump(mode="json", by_alias=True, exclude_none=True)


def without_registry_extension(card: dict[str, Any]) -> dict[str, Any]:
    """The card an A2A client reads, minus what the registry added (its extension, by URI)."""
    card = copy.deepcopy(card)
    capabilities = card.get("capabilities") or {}
    ours = [e for e in capabilities.get("extensions", []) if e.get("uri") == REGISTRY_EXTENSION_URI]
    assert len(ours) == 1, capabilities
    capabilities["extensions"] = [e for e in capabilities["extensions"] if e.get("uri") != REGISTRY_EXTENSION_URI]
    if not capabilities["extensions"]:
        del capabilities["extensions"]
    return card


def sdk_json(card: dict[str, Any] | pb.AgentCard) -> str:
    """The SDK's serialisation of a card (a dict as the SDK reads it): its JSON, map keys sorted
    (protobuf maps have no order of their own), and its deterministic wire bytes, hex."""
    message = card if isinstance(card, pb.AgentCard) else parse_agent_card(copy.deepcopy(card))
    return MessageToJson(message, sort_keys=True) + message.SerializeToString(deterministic=True).hex()


async def register_card(node: RunningNode, agent_id: str, card: dict[str, Any], **extra: Any) -> None:
    status, body = await node.call("POST", "/v1/agent-cards", json={"agent_id": agent_id, "card": card, **extra})
    assert status == 201, body


async def resolve_card(base_url: str, *, token: str | None = None) -> pb.AgentCard:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(timeout=5.0) as client:
        return await A2ACardResolver(client, base_url).get_agent_card(http_kwargs={"headers": headers})


# -- the round trip ------------------------------------------------------------------------


async def test_a_v1_card_with_every_optional_field_round_trips_byte_for_byte(node: RunningNode) -> None:
    given = MessageToDict(full_v1_card(node.runner.addresses[0][1] + 1000))
    await register_card(node, "fx.rates.v1", given)

    exported = await resolve_card(f"{node.url}/agents/fx.rates.v1", token=node.admin_token)
    served = MessageToDict(exported)
    assert sdk_json(without_registry_extension(served)) == sdk_json(full_v1_card(node.runner.addresses[0][1] + 1000))
    # Case kept, names kept, modes, capabilities, schemes, provider and URLs kept.
    assert [skill.id for skill in exported.skills] == ["Get-Rates", "convert"]
    assert exported.skills[0].name == "Get rates" and exported.capabilities.streaming is True
    # The registry's additions are only in its extension.
    ours = next(e for e in exported.capabilities.extensions if e.uri == REGISTRY_EXTENSION_URI)
    params = MessageToDict(ours.params)
    assert params["agentId"] == "fx.rates.v1" and params["region"] == node.node.region
    assert params["ready"] is False and params["capabilities"] == ["get-rates", "convert"]
    # The v1 API's export is the same card.
    status, v1_export = await node.call("GET", "/v1/agents/fx.rates.v1/agent-card.json")
    assert status == 200 and sdk_json(without_registry_extension(v1_export)) == sdk_json(
        without_registry_extension(served))
    # The record keeps the card as given, and the routing names derived from it.
    status, record = await node.call("GET", "/v1/agents/fx.rates.v1")
    assert record["a2a"]["card"] == given and record["a2a"]["format"] == "1.0"
    assert record["endpoints"]["grpc"] == f"grpc://127.0.0.1:{node.runner.addresses[0][1] + 1001}"
    assert record["transport"] == "a2a+jsonrpc" and record["a2a"]["tenant"] == "acme"


async def test_a_signed_card_keeps_its_signatures_and_gets_the_registry_s_extension(node: RunningNode) -> None:
    card = full_v1_card(9000)
    signer = create_agent_card_signer(SIGNING_SECRET, {"kid": "k1", "alg": "HS256", "jku": None, "typ": "JOSE"})
    signed = signer(card)
    await register_card(node, "fx.rates.signed", MessageToDict(signed))

    exported = MessageToDict(await resolve_card(f"{node.url}/agents/fx.rates.signed", token=node.admin_token))

    ours = [e for e in exported["capabilities"]["extensions"] if e["uri"] == REGISTRY_EXTENSION_URI]
    assert len(ours) == 1 and ours[0]["params"]["agentId"] == "fx.rates.signed"
    as_signed = ParseDict(without_registry_extension(exported), pb.AgentCard())
    assert sdk_json(as_signed) == sdk_json(signed) and exported["signatures"] == MessageToDict(signed)["signatures"]
    create_signature_verifier(lambda kid, jku: SIGNING_SECRET, ["HS256"])(as_signed)


@pytest.mark.parametrize("mutate, field", [
    (lambda c: c.update(iconUrl="javascript:alert(document.cookie)"), "card.iconUrl"),
    (lambda c: c.update(documentationUrl="data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg=="),
     "card.documentationUrl"),
    (lambda c: c["provider"].update(url="javascript:alert(1)"), "card.provider.url"),
    (lambda c: c["provider"].update(url="JaVaScRiPt:alert(1)"), "card.provider.url"),
])
async def test_a_card_link_that_is_not_http_is_refused_naming_the_field(node: RunningNode, mutate: Any,
                                                                        field: str) -> None:
    card = MessageToDict(full_v1_card(9050))
    mutate(card)
    status, body = await node.call("POST", "/v1/agent-cards", json={"agent_id": "fx.rates.links", "card": card})
    assert status == 422 and body["field"] == field and "http or https" in body["message"], body
    assert (await node.call("GET", "/v1/agents/fx.rates.links"))[0] == 404


FAKE_SIGNATURE = {"protected": "eyJhbGciOiJIUzI1NiJ9", "signature": "bm90LWEtc2lnbmF0dXJl"}


@pytest.mark.parametrize("uri", [REGISTRY_EXTENSION_URI + " ", " " + REGISTRY_EXTENSION_URI,
                                 REGISTRY_EXTENSION_URI.upper(), "urn:agent-reach:a2a:registry:v2"])
async def test_an_extension_passing_for_the_registry_s_is_refused(node: RunningNode, uri: str) -> None:
    card = MessageToDict(full_v1_card(9060))
    card["signatures"] = [FAKE_SIGNATURE]
    card["capabilities"]["extensions"].append({"uri": uri, "params": {
        "agentId": "fx.rates.fake", "routable": True, "ready": True, "resolveUrl": "https://evil.example/v1/resolve"}})
    status, body = await node.call("POST", "/v1/agent-cards", json={"agent_id": "fx.rates.fake", "card": card})
    assert status == 422 and body["field"] == "card.capabilities.extensions.1.uri", body
    assert "only the registry writes" in body["message"]
    assert (await node.call("GET", "/v1/agents/fx.rates.fake"))[0] == 404


async def test_made_up_signatures_never_stop_the_registry_writing_its_extension(node: RunningNode) -> None:
    card = MessageToDict(full_v1_card(9070))
    card["signatures"] = [FAKE_SIGNATURE]
    card["capabilities"]["extensions"].append({"uri": REGISTRY_EXTENSION_URI, "params": {
        "routable": True, "ready": True, "resolveUrl": "https://evil.example/v1/resolve"}})
    await register_card(node, "fx.rates.unsigned", card)
    status, exported = await node.call("GET", "/agents/fx.rates.unsigned/.well-known/agent-card.json")
    assert status == 200 and exported["signatures"] == [FAKE_SIGNATURE]
    ours = [e for e in exported["capabilities"]["extensions"] if e["uri"] == REGISTRY_EXTENSION_URI]
    assert len(ours) == 1, exported["capabilities"]["extensions"]
    assert ours[0]["params"]["resolveUrl"] == f"{node.url}/v1/resolve" and ours[0]["params"]["ready"] is False


async def test_a_v03_card_with_every_optional_field_is_exported_as_v1_and_kept(node: RunningNode) -> None:
    given = v03_json(full_v03_card(9100))
    await register_card(node, "finance.invoice.v03", given)

    exported = await resolve_card(f"{node.url}/agents/finance.invoice.v03", token=node.admin_token)

    # Exactly what the SDK reads from the original v0.3 JSON.
    assert sdk_json(without_registry_extension(MessageToDict(exported))) == sdk_json(given)
    assert exported.supported_interfaces[0].protocol_version == "0.3.0"
    assert [i.protocol_binding for i in exported.supported_interfaces] == ["JSONRPC", "HTTP+JSON", "GRPC"]
    assert exported.capabilities.extended_agent_card is True
    status, record = await node.call("GET", "/v1/agents/finance.invoice.v03")
    assert record["a2a"]["card"] == given and record["a2a"]["format"] == "0.3"


async def test_the_card_an_sdk_server_serves_registers_as_served(node: RunningNode) -> None:
    """a2a-sdk's server writes v1.0 with the v0.3 fields merged in; that registers, and reads back the same."""
    card = full_v1_card(9200)
    for interface in card.supported_interfaces:
        interface.protocol_version = "0.3"  # the v0.3 fields are added for 0.3 interfaces
    served = agent_card_to_dict(card)
    assert "url" in served and "supportedInterfaces" in served  # both shapes at once
    await register_card(node, "fx.rates.served", served)

    exported = await resolve_card(f"{node.url}/agents/fx.rates.served", token=node.admin_token)

    assert sdk_json(without_registry_extension(MessageToDict(exported))) == sdk_json(served)


async def test_a_card_carrying_the_registry_extension_registers_without_it(node: RunningNode) -> None:
    """An exported card registers again (elsewhere, or here); the registry's extension is the registry's."""
    card = MessageToDict(full_v1_card(9300))
    card["capabilities"]["extensions"].append({"uri": REGISTRY_EXTENSION_URI, "params": {"ready": True}})
    await register_card(node, "fx.rates.spoof", card)
    status, record = await node.call("GET", "/v1/agents/fx.rates.spoof")
    assert [e["uri"] for e in record["a2a"]["card"]["capabilities"]["extensions"]] == [
        "https://acme.example.com/ext/quota/v1"]
    exported = await resolve_card(f"{node.url}/agents/fx.rates.spoof", token=node.admin_token)
    ours = [e for e in exported.capabilities.extensions if e.uri == REGISTRY_EXTENSION_URI]
    assert len(ours) == 1 and MessageToDict(ours[0].params)["ready"] is False  # the registry's word, not the card's


@pytest.mark.parametrize("mutate, field, words", [
    (lambda c: c["supportedInterfaces"][0].update(url="127.0.0.1:9"), "card.supportedInterfaces.0.url",
     "only a GRPC interface"),
    (lambda c: c["supportedInterfaces"][2].update(url="grpc.example.com:99999"), "card.supportedInterfaces.2.url",
     "port above 65535"),
    (lambda c: c["supportedInterfaces"][1].update(url="ftp://x/"), "card.supportedInterfaces.1.url",
     "absolute URL"),
    (lambda c: c.update(description="x" * 70_000), "card", "at most 65536"),
    (lambda c: c["capabilities"]["extensions"][0].update(params=_nested(14)), "card", "deeper than 16"),
    (lambda c: c["skills"][0].update(inputModes="text/plain"), "card.skills.0.inputModes", "valid array"),
    (lambda c: c["securitySchemes"]["bearer"].update(apiKeySecurityScheme={}), "card.securitySchemes.bearer",
     "one kind"),
])
async def test_a_hostile_card_gets_a_422_naming_the_field(node: RunningNode, mutate: Any, field: str,
                                                          words: str) -> None:
    card = MessageToDict(full_v1_card(9400))
    mutate(card)
    status, body = await node.call("POST", "/v1/agent-cards", json={"agent_id": "fx.rates.bad", "card": card})
    assert status in (413, 422) and body["field"] == field and words in body["message"], body
    assert (await node.call("GET", "/v1/agents/fx.rates.bad"))[0] == 404


# -- discovery with A2ACardResolver ---------------------------------------------------------


async def test_a2a_card_resolver_finds_the_registry_and_public_cards(node_factory: NodeFactory) -> None:
    node = await node_factory(public_cards=True)
    registry = await resolve_card(node.url)  # no token: the registry's own card is public
    assert registry.name.startswith("Agent-Reach registry") and {s.id for s in registry.skills} == {
        "resolve", "search", "list"}
    assert registry.supported_interfaces[0].url == f"{node.url}/v1"
    await register_card(node, "fx.rates.public", MessageToDict(full_v1_card(9500)), public_card=True)
    await register_card(node, "fx.rates.private", MessageToDict(full_v1_card(9500)),
                        allowed_callers=["shop.*.*"])
    await register_card(node, "fx.rates.unasked", MessageToDict(full_v1_card(9500)))

    public = await resolve_card(f"{node.url}/agents/fx.rates.public")
    assert public.name == "FX Rates" and public.skills[0].id == "Get-Rates"

    for agent_id in ("fx.rates.private", "fx.rates.unasked", "fx.rates.nobody"):  # 401 alike: nothing told
        with pytest.raises(AgentCardResolutionError) as refused:
            await resolve_card(f"{node.url}/agents/{agent_id}")
        assert refused.value.status_code == 401, agent_id
    allowed = node.token("shop.checkout.one", TokenRole.CALLER)
    assert (await resolve_card(f"{node.url}/agents/fx.rates.private", token=allowed)).name == "FX Rates"
    with pytest.raises(AgentCardResolutionError) as hidden:
        await resolve_card(f"{node.url}/agents/fx.rates.private", token=node.token("bank.ledger.one",
                                                                                  TokenRole.CALLER))
    assert hidden.value.status_code == 404
    with pytest.raises(AgentCardResolutionError) as forged:
        await resolve_card(f"{node.url}/agents/fx.rates.public", token="ar1.forged.token")
    assert forged.value.status_code == 401


async def test_public_cards_need_the_regions_consent(node: RunningNode) -> None:
    assert node.node.config.public_cards is False  # the default: every card needs a token
    await register_card(node, "fx.rates.asks", MessageToDict(full_v1_card(9600)), public_card=True)
    with pytest.raises(AgentCardResolutionError) as refused:
        await resolve_card(f"{node.url}/agents/fx.rates.asks")
    assert refused.value.status_code == 401
    card = await resolve_card(f"{node.url}/agents/fx.rates.asks", token=node.token("any.caller.one",
                                                                                  TokenRole.CALLER))
    assert card.name == "FX Rates"
    assert ParseDict(MessageToDict(card), pb.AgentCard()).name == "FX Rates"
