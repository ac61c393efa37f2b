"""The defaults tell one story: which node a command talks to, how long a token lasts, which
regions a request sees. Reads configuration and help texts only (no server, socket or process)."""

from __future__ import annotations

import pytest

from node.client import parse_agent_config
from node.config import DEFAULT_PORT, NodeConfig
from node.core.models import RouteRequest, Scope
from node.http.openapi import build_openapi
from node.trust import DEFAULT_TOKEN_TTL_S
from topology.cli.entrypoint import build_parser
from topology.cli.nodeurl import local_node_url, node_url, node_url_of
from topology.cli.tokens import admin_token_line, lifetime

pytestmark = pytest.mark.unit


def test_every_client_command_finds_the_node_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_REACH_URL", raising=False)
    assert local_node_url() == "http://127.0.0.1:7101" == f"http://127.0.0.1:{DEFAULT_PORT}"
    assert node_url(None) == local_node_url()
    monkeypatch.setenv("AGENT_REACH_URL", "http://10.0.0.5:7101/")
    assert node_url(None) == "http://10.0.0.5:7101"
    assert node_url("http://n:1") == "http://n:1"
    config = parse_agent_config({"node": {"token": "t"}})
    assert node_url_of(config, None).node.url == "http://10.0.0.5:7101"
    assert node_url_of(config, "http://flag:2").node.url == "http://flag:2"
    in_file = parse_agent_config({"node": {"url": "http://file:3", "token": "t"}})
    assert node_url_of(in_file, None).node.url == "http://file:3"
    parser = build_parser()
    for command in ("register", "preflight", "sidecar"):
        text = parser._subparsers._group_actions[0].choices[command].format_help()  # type: ignore[union-attr]
        assert "--node URL" in text and "AGENT_REACH_URL" in text and "7101" in text and "7070" not in text, command


def test_one_token_lifetime_said_the_same_way_everywhere() -> None:
    assert DEFAULT_TOKEN_TTL_S == 30 * 24 * 3600 and lifetime(DEFAULT_TOKEN_TTL_S) == "30 days"
    assert admin_token_line("ar1.x.y") == "admin token (valid 30 days): ar1.x.y"
    parser = build_parser()
    token = parser._subparsers._group_actions[0].choices["token"]  # type: ignore[union-attr]
    issue = token._subparsers._group_actions[0].choices["issue"].format_help()  # type: ignore[union-attr]
    assert "30 days" in issue
    node_help = parser._subparsers._group_actions[0].choices["node"].format_help()  # type: ignore[union-attr]
    assert "30 days" in node_help and "24 h" not in node_help
    assert NodeConfig(region="r", redis_url="redis://x").port == 7101


def test_scope_defaults_resolve_and_list_local_first_search_global() -> None:
    assert RouteRequest(capability="x").scope is Scope.LOCAL_FIRST
    paths = build_openapi("r")["paths"]
    scope = {path: next(p for p in paths[path]["get"]["parameters"] if p["name"] == "scope")["schema"]["default"]
             for path in ("/v1/agents", "/v1/search")}
    assert scope == {"/v1/agents": "local-first", "/v1/search": "global"}


@pytest.mark.parametrize("semantic, model_ids", [
    ({}, ["sentence-transformers/all-MiniLM-L6-v2", "universal-sentence-encoder-multilingual-3"]),
    ({"encoders": ["usem3"]}, ["universal-sentence-encoder-multilingual-3"]),
    ({"model": "minilm"}, ["sentence-transformers/all-MiniLM-L6-v2"]),
])
def test_a_node_ranks_with_the_encoders_its_topology_names(semantic: dict[str, object], model_ids: list[str]) -> None:
    """Unset, a node ranks with all-MiniLM-L6-v2 and the multilingual USE together (a Chinese
    request finds an English-described agent); ``[semantic] encoders`` or ``model`` say otherwise.
    Built, not started: no model is loaded."""
    from topology import build_node
    from topology.composition import SemanticDiscovery
    from topology.spec import Topology

    topology = Topology.model_validate({"regions": [{"name": "eu", "node_urls": ["http://127.0.0.1:7101"]}],
                                        "semantic": semantic})
    node = build_node(topology.node_config("eu", redis_url="redis://127.0.0.1:1/0"), secret=b"s" * 32)
    assert isinstance(node.searcher, SemanticDiscovery)
    assert [embedder.model_id for embedder in node.searcher.search_index.embedders] == model_ids
