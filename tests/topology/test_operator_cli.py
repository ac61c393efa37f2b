"""The operator commands against a live node, run as an operator runs them (the installed
``agent-reach``): ``--version``, ``agents list|get|deregister``, ``resolve``, ``search``, ``watch``;
a table by default, ``--json`` that parses, the node and token from flags or the environment, and
the documented exit codes (0 done, 1 the node said no, 2 usage, 3 unreachable)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from node.config import NodeConfig
from node.core.models import TokenRole
from node.service import RegistryNode
from topology.composition import attach_discovery

from ..conftest import TEST_SECRET
from ..helpers import RunningNode, registration, start_node, wait_for

AGENT_REACH = str(Path(sys.executable).with_name("agent-reach"))


@pytest.fixture
async def searchable(redis_url: str, region: str) -> AsyncIterator[RunningNode]:
    """A node with (lexical) search attached, as ``agent-reach node --no-semantic`` runs it."""
    config = NodeConfig(region=region, redis_url=redis_url, port=0, sweep_interval_ms=100,
                        lease_sync_interval_ms=100, leader_ttl_ms=1_000, egress={"allow": ["loopback"]})
    node = RegistryNode(config, secret=TEST_SECRET)
    attach_discovery(node, semantic_enabled=False)
    running = await start_node(node)
    yield running
    await running.aclose()


async def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``agent-reach ARGS`` in a child process (the node serves from this test's loop meanwhile)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("AGENT_REACH_URL", "AGENT_REACH_TOKEN")}
    process = await asyncio.create_subprocess_exec(AGENT_REACH, *args, env={**clean, **(env or {})},
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    return process.returncode or 0, out.decode(), err.decode()


async def test_version_and_the_documented_exit_codes() -> None:
    code, out, _ = await cli("--version")
    assert code == 0 and out.startswith("agent-reach ") and out.split()[1][0].isdigit()
    code, out, _ = await cli("agents", "--help")
    assert code == 0 and "3 the node cannot be reached" in out.replace("\n", " ")
    code, _, err = await cli("agents", "list", "--node", "http://127.0.0.1:9")
    assert code == 2 and "AGENT_REACH_TOKEN" in err  # no token: usage
    code, _, err = await cli("agents", "list", "--node", "http://127.0.0.1:9", "--token", "ar1.x.y")
    assert code == 3 and "cannot reach the node at http://127.0.0.1:9" in err
    code, _, _ = await cli("agents", "list", "--scope", "everywhere")
    assert code == 2  # argparse


async def test_every_command_against_a_live_node(searchable: RunningNode) -> None:
    node = searchable
    env = {"AGENT_REACH_URL": node.url, "AGENT_REACH_TOKEN": node.admin_token}
    # Long leases: a loaded machine can take seconds per command, and the leases must outlive them all.
    await node.register(registration("lang.translate.deepl", capability="translate.text", lease_ttl_ms=600_000,
                                     description="Translates contracts and letters between languages"))
    await node.register(registration("docs.ocr.tesseract", capability="ocr.image", lease_ttl_ms=600_000,
                                     description="Reads text from scanned images", status="degraded"))

    # agents list: a table, and JSON that parses; flags win over the environment.
    code, out, err = await cli("agents", "list", env=env)
    assert code == 0, err
    header, *rows = out.strip().splitlines()
    assert header.split()[:3] == ["AGENT", "REGION", "STATUS"]
    assert [row.split()[:3] for row in rows] == [["docs.ocr.tesseract", node.node.region, "degraded"],
                                                 ["lang.translate.deepl", node.node.region, "ready"]]
    code, out, _ = await cli("agents", "list", "--json", "--capability", "ocr.image", env=env)
    listed = json.loads(out)
    assert code == 0 and [a["agent_id"] for a in listed["agents"]] == ["docs.ocr.tesseract"]
    code, out, _ = await cli("agents", "list", "--json", "--node", node.url, "--token", node.admin_token)
    assert code == 0 and json.loads(out)["count"] == 2

    # agents get
    code, out, _ = await cli("agents", "get", "lang.translate.deepl", env=env)
    assert code == 0 and "translate.text" in out and "Translates contracts" not in out  # the record, not prose
    code, out, _ = await cli("agents", "get", "lang.translate.deepl", "--json", env=env)
    assert code == 0 and json.loads(out)["capabilities"][0]["name"] == "translate.text"
    code, _, err = await cli("agents", "get", "no.such.agent", env=env)
    assert code == 1 and "404 unknown_agent" in err

    # resolve
    code, out, _ = await cli("resolve", "translate.text", env=env)
    assert code == 0 and "match exact translate.text" in out and "lang.translate.deepl" in out
    code, out, _ = await cli("resolve", "translate.text", "--json", env=env)
    ticket = json.loads(out)
    assert code == 0 and ticket["target"]["agent_id"] == "lang.translate.deepl" and ticket["signature"]
    code, _, err = await cli("resolve", "nothing.offered", "--no-semantic", env=env)
    assert code == 1 and "no_agent_available" in err
    code, _, err = await cli("resolve", env=env)
    assert code == 2 and "exactly one of" in err

    # search
    code, out, _ = await cli("search", "translate", "a", "contract", env=env)
    assert code == 0 and "lexical ranking" in out and "lang.translate.deepl" in out.splitlines()[2]
    code, out, _ = await cli("search", "translate a contract", "--json", env=env)
    found = json.loads(out)
    assert code == 0 and found["hits"][0]["agent_id"] == "lang.translate.deepl" and found["mode"] == "lexical"

    # watch: the next change, as JSON lines; then agents deregister makes one.
    watcher = asyncio.create_task(cli("watch", "--json", "--count", "1", env=env))
    await wait_for(lambda: node.node.watch.subscribers, timeout_s=30, message="the watcher connected")
    code, out, _ = await cli("agents", "deregister", "docs.ocr.tesseract", "--json", env=env)
    assert code == 0 and json.loads(out)["deregistered"] is True
    code, out, err = await watcher
    assert code == 0, err
    events = [json.loads(line) for line in out.strip().splitlines()]
    assert [e["event"] for e in events] == ["hello", "change"]
    assert events[1]["data"]["agent_id"] == "docs.ocr.tesseract" and events[1]["data"]["kind"] == "delete"
    code, _, err = await cli("agents", "deregister", "docs.ocr.tesseract", env=env)
    assert code == 1 and "unknown_agent" in err

    # The token's visibility holds on the command line too.
    await node.register(registration("ops.secret.keeper", capability="vault.open", allowed_callers=["ops.*.*"]))
    outsider = node.token("sales.crm.viewer", TokenRole.CALLER)
    code, out, _ = await cli("agents", "list", "--json", env={**env, "AGENT_REACH_TOKEN": outsider})
    assert code == 0 and "ops.secret.keeper" not in [a["agent_id"] for a in json.loads(out)["agents"]]
    code, out, _ = await cli("agents", "deregister", "lang.translate.deepl", "--token", outsider, env=env)
    assert code == 1


async def test_watch_prints_a_line_per_change(searchable: RunningNode) -> None:
    node = searchable
    env = {"AGENT_REACH_URL": node.url, "AGENT_REACH_TOKEN": node.admin_token}
    first = await node.register(registration("lang.translate.one"))
    await node.register(registration("lang.translate.two"))
    code, out, err = await cli("watch", "--since", str(first["version"] - 1), "--count", "2", env=env)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith(f"watching region {node.node.region}")
    assert "upsert" in lines[1] and lines[1].endswith("lang.translate.one  ready")
    assert "lang.translate.two" in lines[2]


async def test_what_an_agent_registered_reaches_the_operator_s_terminal_inert(node: RunningNode) -> None:
    # A description may hold line breaks and carriage returns, and any text C1 controls (U+009B
    # is CSI) and bidi overrides: 'agents get' printed them raw, so a registration could overwrite
    # or make up rows, or drive the operator's terminal. Now each is printed as an escape.
    env = {"AGENT_REACH_URL": node.url, "AGENT_REACH_TOKEN": node.admin_token}
    description = "ok\rFORGED\npay.core.prod  1.0.0  refunds\x9b2J"
    record = registration("term.escape.one", lease_ttl_ms=600_000, display_name="invoice\u202efdp.exe",
                          labels={"team": "a\u2066b"})
    record["capabilities"][0]["description"] = description
    await node.register(record)
    code, out, err = await cli("agents", "get", "term.escape.one", env=env)
    assert code == 0, err
    assert not any(character in out for character in "\r\x9b\u202e\u2066"), repr(out)
    assert "invoice\\u202efdp.exe" in out and "a\\u2066b" in out
    rows = out.split("CAPABILITY", 1)[1].strip().splitlines()[1:]
    assert rows == ["translate.text  1        ok\\x0dFORGED\\x0apay.core.prod  1.0.0  refunds\\x9b2J"], rows
    code, out, err = await cli("agents", "get", "term.escape.one", "--json", env=env)
    assert code == 0 and not any(character in out for character in "\r\x9b\u202e\u2066"), repr(out)
    parsed = json.loads(out)
    assert parsed["display_name"] == "invoice\u202efdp.exe" and parsed["capabilities"][0]["description"] == description
    code, out, err = await cli("agents", "list", env=env)
    assert code == 0 and "term.escape.one" in out and "\u202e" not in out, err
