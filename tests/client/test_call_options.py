"""A call's options as one object (``CallOptions``): checked when built, kept for many calls,
shared by call(), resolve() and send(), with keyword overrides on top."""

from __future__ import annotations

import dataclasses
import random

import pytest
from aiohttp import web

from node.client import CallFailed, CallOptions, Envelope, ReachClient, ValidationFailed
from node.core.models import Scope, TokenRole

from ..helpers import AgentServer, RunningNode, registration


class FailingAgent(AgentServer):
    """Answers every call 503."""

    async def _invoke(self, request: web.Request) -> web.Response:
        self.calls += 1
        return web.json_response({"error": "overloaded"}, status=503)


async def _no_wait(seconds: float) -> None:
    return None


def _resolves(node: RunningNode) -> float:
    value = node.node.metrics.registry.get_sample_value("agent_reach_resolves_total",
                                                        {"result": "ok", "match": "exact", "locality": "local"})
    return value or 0.0


@pytest.mark.unit
@pytest.mark.parametrize(("fields", "field"), [
    ({"version": ">=two"}, "version"),
    ({"scope": "nearby"}, "scope"),
    ({"preferred_region": "US East"}, "preferred_region"),
    ({"labels": {"tier": "gold\nsilver"}}, "labels.tier"),
    ({"conversation_id": "a\nb"}, "conversation_id"),
    ({"timeout_ms": 0}, "timeout_ms"),
    ({"connect_timeout_ms": 10_000_000}, "connect_timeout_ms"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"idempotent": "yes"}, "idempotent"),
    ({"trace_id": "not a trace"}, "trace_id"),
    ({"extensions": {"score": float("nan")}}, "extensions.score"),
])
def test_options_are_checked_when_built_and_the_error_names_the_field(fields: dict, field: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        CallOptions(**fields)
    assert caught.value.field == field and field in caught.value.message


@pytest.mark.unit
def test_options_are_frozen_and_hold_the_checked_values() -> None:
    labels = {"tier": "gold"}
    options = CallOptions(scope="local", labels=labels, timeout_ms=5_000, idempotent=True)
    labels["tier"] = "silver"  # the caller's dict changing later changes nothing
    assert options.scope is Scope.LOCAL and dict(options.labels) == {"tier": "gold"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.scope = Scope.GLOBAL  # type: ignore[misc]
    with pytest.raises(TypeError):
        options.labels["tier"] = "bronze"  # type: ignore[index]
    longer = options.replace(timeout_ms=9_000)
    assert (longer.timeout_ms, longer.scope, options.timeout_ms) == (9_000, Scope.LOCAL, 5_000)
    with pytest.raises(ValidationFailed) as caught:
        options.replace(timout_ms=9_000)
    assert caught.value.field == "timout_ms" and "timeout_ms" in caught.value.message
    with pytest.raises(ValidationFailed):
        options.replace(version="?")


async def test_one_options_object_routes_resolve_and_call_alike_and_a_keyword_overrides_it(
        node: RunningNode) -> None:
    one, two = await AgentServer("one").start(), await AgentServer("two").start()
    await node.register(registration("lang.translate.one", endpoint=one.url + "/invoke", version="1"))
    await node.register(registration("lang.translate.two", endpoint=two.url + "/invoke", version="2"))
    version_two = CallOptions(version=">=2", idempotent=True)
    try:
        async with ReachClient(node.url, token=node.token("caller.app.opts", TokenRole.CALLER),
                               ticket_reuse_ms=60_000) as client:
            ticket = await client.resolve("translate.text", options=version_two)
            before = _resolves(node)
            results = [await client.call("translate.text", {"n": n}, options=version_two) for n in range(5)]
            assert ticket.target.agent_id == "lang.translate.two"
            assert {result.agent_id for result in results} == {"lang.translate.two"}
            assert _resolves(node) == before, "the calls used the ticket resolve() cached for the same options"
            overridden = await client.call("translate.text", {"n": 9}, options=version_two, version="1")
            assert overridden.agent_id == "lang.translate.one" and version_two.version == ">=2"
            kept = await client.call("translate.text", {"n": 8}, options=version_two, version=None)
            assert kept.agent_id == "lang.translate.two"  # a keyword given None leaves the options' value
            with pytest.raises(ValidationFailed) as caught:
                await client.resolve("translate.text", options=version_two, timeout_ms=100)
            assert caught.value.field == "timeout_ms"  # a delivery option is no resolve() keyword
            with pytest.raises(ValidationFailed) as caught:
                await client.call("translate.text", {}, verison="2")
            assert caught.value.field == "verison" and one.calls + two.calls == 7
    finally:
        await one.aclose()
        await two.aclose()


async def test_max_attempts_in_the_options_bounds_an_idempotent_calls_retries(node: RunningNode) -> None:
    failing, healthy = await FailingAgent("failing").start(), await AgentServer("healthy").start()
    await node.register(registration("lang.translate.failing", endpoint=failing.url + "/invoke", weight=10_000))
    await node.register(registration("lang.translate.healthy", endpoint=healthy.url + "/invoke", weight=1))
    once = CallOptions(idempotent=True, max_attempts=1)
    try:
        async with ReachClient(node.url, token=node.admin_token, sleep=_no_wait, rng=random.Random(5),
                               draw_rng=random.Random(5)) as client:
            with pytest.raises(CallFailed) as caught:
                await client.call("translate.text", {"n": 1}, options=once)
            assert [a.agent_id for a in caught.value.attempts] == ["lang.translate.failing"]
            assert failing.calls == 1 and healthy.calls == 0
            result = await client.call("translate.text", {"n": 2}, options=once.replace(max_attempts=None))
            assert result.agent_id == "lang.translate.healthy" and len(result.attempts) == 2
    finally:
        await failing.aclose()
        await healthy.aclose()


async def test_send_refuses_options_the_proxy_cannot_route_by(node: RunningNode) -> None:
    async with ReachClient(node.url, token=node.admin_token) as client:
        for options in (CallOptions(labels={"tier": "gold"}), CallOptions(preferred_region="eu-west"),
                        CallOptions(semantic=False), CallOptions(conversation_id="c-1")):
            with pytest.raises(ValidationFailed) as caught:
                await client.send(Envelope(operation="translate.text"), options=options)
            assert "version and scope only" in caught.value.message, caught.value.message
        with pytest.raises(ValidationFailed) as caught:
            await client.send(Envelope(operation="translate.text"), scope="nearby")
        assert caught.value.field == "scope"
