"""``/metrics``: lint-clean (promtool when installed, and the same rules in Python always), and
every family the operations issue asks for moves when the node does what it counts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

from node.config import NodeConfig
from node.core.models import TokenRole
from node.ops import NodeMetrics
from node.service import RegistryNode
from topology.composition import attach_discovery

from ..conftest import TEST_SECRET
from ..helpers import registration, start_node, wait_for
from ..metrics_lint import lint, parse_samples, promtool_problems


def _value(samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when there is none)."""
    wanted = set(labels.items())
    return sum(value for (sample, have), value in samples.items() if sample == name and wanted <= have)


async def _scrape(running) -> str:
    async with running.session.get("/metrics") as response:
        assert response.status == 200
        return await response.text()


async def test_metrics_lint_clean_and_every_node_family_moves(node_factory, region) -> None:
    running = await node_factory(lease_sync_interval_ms=50)
    node = running.node
    before = parse_samples(await _scrape(running))
    await running.register(registration("alpha.one.v1", capability="translate.text"))
    await running.register({**registration("short.lived.v1", capability="ocr.image"), "lease_ttl_ms": 1_000})
    for _ in range(2):
        status, _ = await running.call("PUT", "/v1/agents/alpha.one.v1/heartbeat", json={})
        assert status == 200
    status, _ = await running.resolve(capability="translate.text")
    assert status == 200
    status, _ = await running.resolve(capability="nobody.offers")
    assert status == 404
    status, _ = await running.call("GET", "/v1/agents", token="ar1.forged.token")
    assert status == 401
    for method in ("PROPFIND", "MKCOL", "PROPFIND"):  # WebDAV's: counted as one series, not one each
        status, _ = await running.call(method, "/v1/agents")
        assert status == 405
    await wait_for(lambda: node.sweeper.stats.expired >= 1, timeout_s=10, message="the short lease expired")
    text = await _scrape(running)
    after = parse_samples(text)

    assert lint(text) == [], lint(text)
    problems = promtool_problems(text)
    if problems is not None:  # promtool installed (make test installs Debian's prometheus when root)
        assert problems == [], problems

    def moved(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    # HTTP: the request counter and the latency histogram by route, method and status.
    assert moved("agent_reach_http_requests_total", route="/v1/resolve", status="200") == 1
    assert moved("agent_reach_http_request_duration_seconds_count", route="/v1/resolve", method="POST",
                 status="404") == 1
    assert moved("agent_reach_http_request_duration_seconds_bucket", route="/v1/agents", method="POST",
                 status="201", le="+Inf") == 2
    assert moved("agent_reach_http_request_duration_seconds_sum", route="/v1/resolve") > 0
    assert moved("agent_reach_http_request_duration_seconds_count", route="unmatched", method="OTHER",
                 status="405") == 3
    assert not any(("method", made_up) in labels for _, labels in after for made_up in ("PROPFIND", "MKCOL"))
    assert moved("agent_reach_auth_refusals_total", code="invalid_token") == 1
    assert moved("agent_reach_resolves_total", result="ok") == 1
    assert moved("agent_reach_registrations_total") == 2
    # The coalesced store writes: every registration went in some REGISTER script, one or more per script.
    assert moved("agent_reach_store_register_writes_total", region=region) == 2
    assert 1 <= moved("agent_reach_store_register_scripts_total", region=region) <= 2
    assert moved("agent_reach_store_update_writes_total", region=region) == 2  # the heartbeats, one at a time
    assert moved("agent_reach_store_update_scripts_total", region=region) == 2
    # Counters read at scrape time are counters (_total), not gauges.
    assert moved("agent_reach_leases_expired_total", region=region) >= 1
    assert ("agent_reach_leases_expired", frozenset({("region", region)})) not in after
    # Process and Python collectors.
    assert _value(after, "process_cpu_seconds_total") > 0
    assert _value(after, "process_resident_memory_bytes") > 0
    assert _value(after, "process_open_fds") > 0
    assert _value(after, "python_info") == 1
    assert ("python_gc_collections_total", frozenset({("generation", "0")})) in after


async def test_search_latency_by_mode(redis_url, region) -> None:
    config = NodeConfig(region=region, redis_url=redis_url, port=0, egress={"allow": ["loopback"]})
    node = RegistryNode(config, secret=TEST_SECRET)
    attach_discovery(node, semantic_enabled=False)  # lexical: no model load
    running = await start_node(node)
    try:
        await running.register(registration("pdf.reader.v1", capability="document.read"))
        for _ in range(3):
            status, body = await running.call("GET", "/v1/search?q=read+a+document")
            assert status == 200, body
        samples = parse_samples(await _scrape(running))
        assert _value(samples, "agent_reach_search_duration_seconds_count", mode="lexical") == 3
        assert _value(samples, "agent_reach_search_duration_seconds_sum", mode="lexical") > 0
    finally:
        await running.aclose()


def test_lint_finds_what_promtool_finds() -> None:
    """The Python lint is not vacuous: it refuses a gauge called _total, a counter without help, a unit in ms."""
    registry = CollectorRegistry()
    Counter("bad_latency_ms", "", registry=registry).inc()
    metrics = NodeMetrics("lint")
    metrics.gauge("agent_reach_things_total", "a running count as a gauge", lambda: 3)
    text = metrics.render().decode() + generate_latest(registry).decode()
    problems = lint(text)
    assert any("agent_reach_things_total: only counters end in _total" in p for p in problems), problems
    assert any("bad_latency_ms_total: abbreviated unit 'ms'" in p for p in problems), problems
    assert any("bad_latency_ms_total: no help text" in p for p in problems), problems
    promtool = promtool_problems(text)
    if promtool is not None:
        assert promtool, "promtool found nothing wrong in a bad exposition"


async def test_decisions_endpoint_respects_visibility(node) -> None:
    await node.register({**registration("private.agent.v1", capability="secret.work"),
                         "allowed_callers": ["friend.*.*"]})
    friend, stranger = node.token("friend.one.a", TokenRole.CALLER), node.token("stranger.one.c", TokenRole.CALLER)
    status, _ = await node.resolve(token=friend, capability="secret.work", trace_id="trace-visible-1")
    assert status == 200
    status, body = await node.call("GET", "/v1/agents/private.agent.v1/decisions", token=friend)
    assert status == 200, body
    assert [entry["trace_id"] for entry in body["decisions"]] == ["trace-visible-1"]
    status, body = await node.call("GET", "/v1/agents/private.agent.v1/decisions", token=stranger)
    assert status == 404 and body["error"] == "unknown_agent"
    other = node.token("friend.two.b", TokenRole.CALLER)  # may see the agent, not friend.one's calls
    status, body = await node.call("GET", "/v1/agents/private.agent.v1/decisions", token=other)
    assert status == 200 and body["decisions"] == []
    status, body = await node.call("GET", "/v1/agents/private.agent.v1/decisions")  # admin: everyone's
    assert status == 200 and body["count"] == 1 and body["decisions"][0]["caller"] == "friend.one.a"
