"""Schemathesis against a live node: the spec it serves is the contract its handlers keep.

One node (built by the composition root, lexical search) serves ``/v1/openapi.json`` on a real
port; schemathesis loads the spec from it over HTTP and sends every operation a bounded, seeded
set of requests generated from the spec, with an admin token:

* **positive** (valid by the spec) and **negative** (invalid) requests for every operation;
* positive again with integers written as integers and every URL at a real agent (``deliverable``);
* the operations on one agent again, with the agents the fuzzer managed to register;
* a few requests no generator finds: a resolve, a send and a callback-mode send to a real agent,
  a report on the real ticket, the trace of the send.

Every answer must have a documented status, content type and body, no 5xx the operation does
not document, and a valid request must be accepted — or refused for a reason no schema can
express, each named in ``REFUSALS`` with the error code that says so. Invalid requests must be
refused. The patterns the spec adds to the models are held to the validators, and a live
``/v1/watch`` stream is read and each of its events checked against the served spec.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import aiohttp
import hypothesis
import hypothesis.errors
import jsonschema_rs
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from node.config import NodeConfig, ProxySettings
from node.core.models import Probe, Registration, TokenRole, parse_version, version_constraint
from node.http.openapi import (
    CONSTRAINT_PATTERN,
    IPV6_PATTERN,
    VERSION_PATTERN,
    build_openapi,
    stored_url_pattern,
    url_pattern,
)
from node.trust import EgressPolicy
from topology import build_node

from ..conftest import TEST_SECRET
from ..helpers import AgentServer, RunningNode, Watcher, registration, start_node, wait_for

pytestmark = pytest.mark.timeout(200)  # about 40 operations, each fuzzed a bounded number of times

FUZZ_SEED = 20_250_601
FUZZ_EXAMPLES = 30                      # per operation and pass
FUZZ_DEADLINE = timedelta(seconds=10)   # per example; a slower answer fails it
REQUEST_TIMEOUT_S = 10.0
CALLER = "fuzz.caller.admin"   # the admin token's subject: a registered agent, so callbacks have somewhere to go
ECHO = "fuzz.echo.one"         # a real agent offering fuzz.echo

# Every IPv4 address but loopback, and all of IPv6: a fuzzed endpoint or callback never leaves
# this host (the agents the test runs listen on 127.0.0.1).
_NOT_LOOPBACK = tuple(str(network) for network in
                      ipaddress.ip_network("0.0.0.0/0").address_exclude(ipaddress.ip_network("127.0.0.0/8")))
EGRESS = EgressPolicy(allow=("loopback",), deny=(*_NOT_LOOPBACK, "::/0"))


# -- what a valid request may get instead of a 2xx, and why ---------------------------------


@dataclass(frozen=True)
class Refusal:
    """A status a request valid by the spec may get, with the error codes that say why."""

    status: int
    errors: frozenset[str]
    why: str
    message: str | None = None              # a regex the error message must match as well
    rules: frozenset[str] | None = None     # egress_denied: the rules (details.rule) that may refuse

    def covers(self, status: int, body: object) -> bool:
        if status != self.status or not isinstance(body, dict) or body.get("error") not in self.errors:
            return False
        if self.rules is not None and (body.get("details") or {}).get("rule") not in self.rules:
            return False
        return self.message is None or re.search(self.message, str(body.get("message", ""))) is not None


_UNKNOWN_AGENT = Refusal(404, frozenset({"unknown_agent"}), "the agent_id is not registered (or its lease ran out)")
# The region's egress policy refuses registrations with addresses it denies
# (node.trust.egress.check_registration; this test's policy denies everything but loopback). No schema
# can say which addresses a policy allows; what the spec's URL grammar can say (scheme, host
# syntax, userinfo) it does, so those rules are not among the reasons.
_EGRESS = Refusal(422, frozenset({"egress_denied"}), "an address the region's egress policy refuses",
                  rules=frozenset({"deny-list", "loopback", "private", "unspecified", "link-local", "multicast",
                                   "broadcast", "reserved", "metadata", "non-canonical-ipv4"}))
REFUSALS: dict[str, tuple[Refusal, ...]] = {
    "POST /v1/agents": (
        Refusal(422, frozenset({"validation_failed"}), "two capabilities with the same name and major version",
                message="is listed twice"),
        _EGRESS),
    "POST /v1/agent-cards": (
        Refusal(422, frozenset({"validation_failed"}), "two skills whose ids give the same capability name",
                message="does not give a unique capability name"),
        Refusal(422, frozenset({"validation_failed"}), "what a card's schema does not say: host:port on an interface "
                "that is not GRPC, a port above 65535, one kind per security scheme, one OAuth flow in A2A 1.0, "
                "the card's size and depth", message="only a GRPC interface|port above 65535|security scheme|"
                                                     "has one flow|bytes of JSON|nested deeper"),
        _EGRESS),
    "GET /v1/agents/{agent_id}": (_UNKNOWN_AGENT,),
    "GET /v1/agents/{agent_id}/agent-card.json": (_UNKNOWN_AGENT,),
    "GET /agents/{agent_id}/.well-known/agent-card.json": (_UNKNOWN_AGENT,),
    "GET /v1/agents/{agent_id}/decisions": (_UNKNOWN_AGENT,),
    "GET /v1/agents/{agent_id}/probes": (_UNKNOWN_AGENT,),
    "PATCH /v1/admin/agents/{agent_id}": (_UNKNOWN_AGENT,),
    "DELETE /v1/admin/agents/{agent_id}": (_UNKNOWN_AGENT,),
    "DELETE /v1/agents/{agent_id}": (_UNKNOWN_AGENT,),
    "PUT /v1/agents/{agent_id}/heartbeat": (_UNKNOWN_AGENT,),
    "PUT /v1/agents/{agent_id}/load": (_UNKNOWN_AGENT,),
    "POST /v1/resolve": (Refusal(404, frozenset({"no_agent_available"}), "nobody offers what is asked for"),),
    "POST /v1/reports": (Refusal(403, frozenset({"invalid_ticket"}), "the signature is no ticket of this cluster"),),
    "POST /v1/credentials": (Refusal(403, frozenset({"invalid_ticket"}),
                                     "the signature is no ticket of this cluster"),),
    "GET /v1/traces/{trace_id}": (Refusal(404, frozenset({"unknown_trace"}), "the trace has no events"),),
    "GET /v1/traces/{trace_id}/result": (Refusal(404, frozenset({"unknown_result"}),
                                                 "no send of this caller in the trace"),),
    "DELETE /v1/acl/{rule_id}": (Refusal(404, frozenset({"unknown_rule"}), "no such rule"),),
    "POST /v1/traces": (Refusal(409, frozenset({"trace_full"}), "the batch names more callers of one trace than it "
                                                                "keeps"),),
    "GET /v1/session": (Refusal(400, frozenset({"websocket_required"}), "a plain HTTP request, not a WebSocket "
                                                                         "upgrade (the fuzzer opens none)"),),
    "POST /v1/send": (
        Refusal(404, frozenset({"no_agent_available"}), "nobody offers the target or operation"),
        Refusal(410, frozenset({"envelope_expired"}), "expire_at_ms is in the past"),
        Refusal(422, frozenset({"expire_at_in_seconds"}), "expire_at_ms is so far in the past that it is a time in "
                                                          "seconds (node.core.hints)"),
        Refusal(502, frozenset({"delivery_failed"}), "the routed agent (one the fuzzer registered) does not answer, "
                                                     "or answers with a 5xx"),
    ),
}
# Operations whose JSON bodies have integers or URLs (see _only_whole_floats_refused, deliverable).
INTEGER_BODIES = frozenset({"POST /v1/agents", "POST /v1/agent-cards", "PUT /v1/agents/{agent_id}/heartbeat",
                            "PUT /v1/agents/{agent_id}/load",
                            "POST /v1/resolve", "POST /v1/reports", "POST /v1/send", "POST /v1/traces",
                            "POST /v1/admin/tokens/revoke", "PATCH /v1/admin/agents/{agent_id}"})
# Routes whose answer to a valid request is a redirect (to the console's page).
REDIRECTS = {"GET /": "302", "GET /ui": "302"}
# The 5xx an operation documents and gives while the node is healthy: not the node's failure.
UPSTREAM_FAILURES = {"POST /v1/send": ["502"]}
REGISTERING = ("POST /v1/agents", "POST /v1/agent-cards")
# Run again with the agents registered so far; deregistration last.
ON_ONE_AGENT = ("GET /v1/agents/{agent_id}", "GET /v1/agents/{agent_id}/agent-card.json",
                "GET /agents/{agent_id}/.well-known/agent-card.json",
                "GET /v1/agents/{agent_id}/probes", "PUT /v1/agents/{agent_id}/heartbeat",
                "PUT /v1/agents/{agent_id}/load", "PATCH /v1/admin/agents/{agent_id}", "DELETE /v1/agents/{agent_id}",
                "DELETE /v1/admin/agents/{agent_id}")


def refusal_reason(case: schemathesis.Case, response: schemathesis.Response) -> str | None:
    """Why a valid request was not accepted; None when it was (or when it was not valid).

    Raises AssertionError when no reason in REFUSALS explains the refusal.
    """
    negative = case.meta is not None and not case.meta.generation.mode.is_positive
    if negative or response.status_code < 300:
        return None
    try:
        body = response.json()
    except ValueError:
        body = None
    label = f"{case.method} {case.operation.path}"
    if REDIRECTS.get(label) == str(response.status_code):
        return None
    for refusal in REFUSALS.get(label, ()):
        if refusal.covers(response.status_code, body):
            return refusal.why
    if _only_whole_floats_refused(response.status_code, body, case.body):
        return "an integer written as a whole float (100.0)"
    raise AssertionError(f"{label}: a request valid by the spec was refused with {response.status_code} {body}")


def accepted_or_refused_for_a_reason(ctx: Any, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """A valid request is accepted, or refused for one of the reasons REFUSALS names for it."""
    refusal_reason(case, response)


def _only_whole_floats_refused(status: int, body: object, sent: object) -> bool:
    """Bodies are parsed strictly: ``100.0`` is not an integer (tests/trust/test_tenants.py holds the node
    to that, the spec's description says so). JSON Schema cannot tell ``100.0`` from ``100``, so
    schemathesis sends both; the 422 is right when every problem it names is such a number."""
    if status != 422 or not isinstance(body, dict) or body.get("error") != "validation_failed":
        return False
    problems = (body.get("details") or {}).get("problems") or [{"field": body.get("field"),
                                                                 "message": body.get("message", "")}]
    for problem in problems:
        if not str(problem.get("message", "")).endswith("Input should be a valid integer"):
            return False
        value = _at(sent, str(problem.get("field") or ""))
        if not (isinstance(value, float) and value.is_integer()):
            return False
    return True


def _at(document: object, path: str) -> object:
    for part in path.split(".") if path else []:
        if isinstance(document, dict) and part in document:
            document = document[part]
        elif isinstance(document, list) and part.isdigit() and int(part) < len(document):
            document = document[int(part)]
        else:
            return None
    return document


_URL = re.compile(url_pattern(("http", "https", "grpc", "grpcs", "ws", "wss")))


def _deliverable(value: Any, agent_url: str) -> Any:
    """``value`` with integers written as integers and every URL at the test's agent."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, str) and _URL.search(value):
        return f"{agent_url}/invoke"
    if isinstance(value, list):
        return [_deliverable(item, agent_url) for item in value]
    if isinstance(value, dict):
        return {key: _deliverable(item, agent_url) for key, item in value.items()}
    return value


def deliverable(agent_url: str) -> Callable[[schemathesis.Case], schemathesis.Case]:
    """A case mapper for the pass that exercises what the node does with requests it accepts: the
    generated ones are mostly refused for their whole floats and their addresses (the egress
    policy here denies all but loopback)."""

    def mapped(case: schemathesis.Case) -> schemathesis.Case:
        if isinstance(case.body, (dict, list)):
            case.body = _deliverable(case.body, agent_url)
        return case

    return mapped


# -- the run ------------------------------------------------------------------------------------


def _config(token: str) -> schemathesis.Config:
    operations: dict[str, dict[str, Any]] = {}
    for name in {*REFUSALS, *INTEGER_BODIES}:
        statuses = {str(refusal.status) for refusal in REFUSALS.get(name, ())}
        if name in INTEGER_BODIES:
            statuses.add("422")
        operations.setdefault(name, {}).setdefault("checks", {})["positive_data_acceptance"] = {
            "expected-statuses": ["2xx", *sorted(statuses)]}
    for name, status in REDIRECTS.items():
        operations.setdefault(name, {}).setdefault("checks", {})["positive_data_acceptance"] = {
            "expected-statuses": [status]}
    for name, statuses in UPSTREAM_FAILURES.items():
        operations.setdefault(name, {}).setdefault("checks", {})["not_a_server_error"] = {
            "expected-statuses": ["2xx", "3xx", "4xx", *statuses]}
    # A stream never ends: read its first event (hello); test_watch_events_conform reads whole streams.
    operations.setdefault("GET /v1/watch", {})["max-stream-events"] = 1
    return schemathesis.Config.from_dict({
        "seed": FUZZ_SEED,
        "headers": {"Authorization": f"Bearer {token}"},
        "request-timeout": REQUEST_TIMEOUT_S,
        "checks": {
            "enabled": False,
            "not_a_server_error": {"enabled": True},
            "status_code_conformance": {"enabled": True},
            "content_type_conformance": {"enabled": True},
            "response_schema_conformance": {"enabled": True},
            # By status (per operation above); accepted_or_refused_for_a_reason checks the error codes.
            "positive_data_acceptance": {"enabled": True, "expected-statuses": ["2xx"]},
            # A body over the node's limit is refused before it is read: 413 rejects it too.
            "negative_data_rejection": {"enabled": True, "expected-statuses": [
                "400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]},
            "ignored_auth": {"enabled": True},
        },
        "operations": [{"include-name": name, **overrides} for name, overrides in operations.items()],
    })


@dataclass
class FuzzRun:
    """One run against a node: what was sent, what came back, what failed."""

    schema: Any
    session: requests.Session
    token: str
    operations: list[str] = field(default_factory=list)
    examples: int = 0
    failures: list[str] = field(default_factory=list)
    statuses: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    reasons: Counter[tuple[str, str]] = field(default_factory=Counter)
    registered: set[str] = field(default_factory=set)
    seconds: float = 0.0

    def fuzz(self, operation: Any, name: str, strategy: st.SearchStrategy[schemathesis.Case]) -> None:
        """Send ``strategy``'s cases (seeded, at most FUZZ_EXAMPLES, no shrinking) and check each."""

        @hypothesis.seed(FUZZ_SEED)
        @settings(max_examples=FUZZ_EXAMPLES, derandomize=True, database=None, deadline=FUZZ_DEADLINE,
                  phases=[Phase.generate], print_blob=False,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                         HealthCheck.data_too_large])
        @given(case=strategy)
        def run(case: schemathesis.Case) -> None:
            self.check(case, name)

        try:
            run()
        except hypothesis.errors.Unsatisfiable:
            pass  # nothing to negate: no parameters and no body
        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - one report for every operation
            self.failures.append(f"{operation.label} ({name}): {exc}")

    def check(self, case: schemathesis.Case, name: str) -> schemathesis.Response:
        label = case.operation.label
        self.examples += 1
        response = case.call(session=self.session)
        self.statuses[(label, name, response.status_code)] += 1
        with contextlib.suppress(AssertionError):  # validate_response reports it
            reason = refusal_reason(case, response)
            if reason is not None:
                self.reasons[(label, reason)] += 1
        if label in REGISTERING and response.status_code in (200, 201):
            self.registered.add(case.body["agent_id"])
        case.validate_response(response, additional_checks=[accepted_or_refused_for_a_reason],
                               transport_kwargs={"session": self.session})
        return response

    def explicit(self, label: str, expected: int, **parts: Any) -> schemathesis.Response:
        """One request no generator finds (a real capability, a real ticket), checked the same way."""
        headers = {"Authorization": f"Bearer {self.token}"}
        case = self.schema.find_operation_by_label(label).Case(headers=headers, **parts)
        try:
            response = self.check(case, "explicit")
        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001
            self.failures.append(f"{label} (explicit {parts}): {exc}")
            raise
        if response.status_code != expected:
            self.failures.append(f"{label} (explicit {parts}): {response.status_code} {response.text[:500]}")
        return response


def _fuzz(base_url: str, token: str, agent_url: str) -> FuzzRun:
    """Every operation of the served spec, as the module docstring says (blocking: run it in a thread)."""
    started = time.perf_counter()
    to_agent = deliverable(agent_url)
    schema = schemathesis.openapi.from_url(f"{base_url}/v1/openapi.json", config=_config(token),
                                           timeout=REQUEST_TIMEOUT_S)
    schema.config.update(base_url=base_url)
    with requests.Session() as session:
        run = FuzzRun(schema=schema, session=session, token=token)
        for result in schema.get_all_operations():
            operation = result.ok()
            run.operations.append(operation.label)
            run.fuzz(operation, "positive", operation.as_strategy(GenerationMode.POSITIVE))
            run.fuzz(operation, "negative", operation.as_strategy(GenerationMode.NEGATIVE))
            if operation.label in INTEGER_BODIES:
                run.fuzz(operation, "loopback", operation.as_strategy(GenerationMode.POSITIVE).map(to_agent))
        known = sorted(run.registered)
        for label in ON_ONE_AGENT:
            operation = schema.find_operation_by_label(label)
            by_agent = {agent_id: operation.as_strategy(GenerationMode.POSITIVE, path_parameters={"agent_id": agent_id})
                        .map(to_agent) for agent_id in known}
            if by_agent:
                run.fuzz(operation, "registered", st.sampled_from(known).flatmap(by_agent.__getitem__))
        with contextlib.suppress(Exception, BaseExceptionGroup):  # failures are in run.failures
            _explicit(run)
    run.seconds = time.perf_counter() - started
    return run


def _explicit(run: FuzzRun) -> None:
    ticket = run.explicit("POST /v1/resolve", 200, body={"capability": "fuzz.echo", "trace_id": "fuzz-trace"}).json()
    run.explicit("POST /v1/reports", 200, body={"signature": ticket["signature"], "agent_id": ECHO,
                                                "outcome": "success", "latency_ms": 1.5})
    run.explicit("POST /v1/reports", 200, body={"reports": [{"signature": ticket["signature"], "agent_id": ECHO,
                                                             "outcome": "timeout"}]})
    run.explicit("POST /v1/credentials", 200, body={"signature": ticket["signature"], "agent_id": ECHO})
    run.explicit("GET /.well-known/jwks.json", 200, query={"kid": "nowhere." + "A" * 43})
    sent = run.explicit("POST /v1/send", 200, body={"operation": "fuzz.echo", "payload": {"n": 1}})
    run.explicit("POST /v1/send", 202, body={"operation": "fuzz.echo", "payload": "later"},
                 query={"delivery": "callback"})
    run.explicit("GET /v1/traces/{trace_id}", 200, path_parameters={"trace_id": sent.headers["X-Reach-Trace-Id"]})
    run.explicit("GET /v1/traces/{trace_id}", 200, path_parameters={"trace_id": "fuzz-trace"})
    run.explicit("GET /v1/search", 200, query={"q": "fuzz echo", "routable": "true"})
    run.explicit("GET /v1/agents", 200, query={"capability": "fuzz.echo", "label": ["role=echo"]})
    run.explicit("GET /v1/agents/{agent_id}/agent-card.json", 200, path_parameters={"agent_id": ECHO})
    run.explicit("GET /agents/{agent_id}/.well-known/agent-card.json", 200, path_parameters={"agent_id": ECHO})
    run.explicit("GET /.well-known/agent-card.json", 200)
    run.explicit("GET /v1/agents", 200, query={"tag": ["echo"]})
    run.explicit("GET /v1/agents/{agent_id}/decisions", 200, path_parameters={"agent_id": ECHO})
    run.explicit("GET /v1/agents/{agent_id}/probes", 200, path_parameters={"agent_id": ECHO})
    run.explicit("PATCH /v1/admin/agents/{agent_id}", 200, path_parameters={"agent_id": ECHO}, body={"weight": 100})
    run.explicit("GET /v1/watch", 200, query={"since": 0})


@pytest.fixture
async def agent() -> AsyncIterator[AgentServer]:
    server = await AgentServer("fuzz-target").start()
    try:
        yield server
    finally:
        await server.aclose()


@pytest.fixture
async def fuzz_node(redis_url: str, region: str, agent: AgentServer) -> AsyncIterator[RunningNode]:
    # Deliveries to fuzzed addresses fail fast (refused by the egress policy, or nobody listening).
    proxy = ProxySettings(connect_timeout_ms=300, read_timeout_ms=1_000, request_timeout_ms=2_000,
                          retry_initial_backoff_ms=10, retry_max_backoff_ms=50)
    config = NodeConfig(region=region, redis_url=redis_url, port=0, semantic_enabled=False, egress=EGRESS,
                        sweep_interval_ms=100, lease_sync_interval_ms=100, leader_ttl_ms=1_000, proxy=proxy)
    node = build_node(config, secret=TEST_SECRET)
    running = await start_node(node)
    try:
        # Long leases: nobody heartbeats them while the fuzzer runs.
        await running.register(registration(CALLER, capability="fuzz.callback", endpoint=f"{agent.url}/invoke",
                                            callback_endpoint=f"{agent.url}/invoke", lease_ttl_ms=3_600_000))
        await running.register(registration(ECHO, capability="fuzz.echo", endpoint=f"{agent.url}/invoke",
                                            labels={"role": "echo"}, lease_ttl_ms=3_600_000))
        yield running
    finally:
        await running.aclose()


async def test_every_operation_keeps_its_spec(fuzz_node: RunningNode, agent: AgentServer) -> None:
    token = fuzz_node.node.signer.issue(CALLER, TokenRole.ADMIN, ttl_s=3600)

    run = await asyncio.to_thread(_fuzz, fuzz_node.url, token, agent.url)

    print(f"\nschemathesis: {len(run.operations)} operations, {run.examples} examples "
          f"(at most {FUZZ_EXAMPLES} per operation and pass), {run.seconds:.1f} s")
    for (label, name, status), count in sorted(run.statuses.items()):
        print(f"  {label:45} {name:10} {status} x{count}")
    for (label, reason), count in sorted(run.reasons.items()):
        print(f"  {label:45} refused x{count}: {reason}")
    assert not run.failures, "\n\n".join(run.failures)
    # The spec lists what this node serves: discovery's vectors route, no federation status.
    assert "POST /v1/semantic/vectors" in run.operations
    assert not any("/v1/federation/status" in label for label in run.operations)
    assert len(run.operations) >= 20 and run.examples >= 20 * FUZZ_EXAMPLES




def _event_checker(spec: dict[str, Any]) -> Any:
    """Checks one event against the served spec: the item schema, then its data's contentSchema."""
    components = {"components": spec["components"]}
    item = spec["paths"]["/v1/watch"]["get"]["responses"]["200"]["content"]["text/event-stream"]["itemSchema"]
    events = spec["components"]["schemas"][item["$ref"].rsplit("/", 1)[1]]["oneOf"]
    item_validator = jsonschema_rs.Draft202012Validator({**item, **components})
    data_validators = {branch["properties"]["event"]["const"]: jsonschema_rs.Draft202012Validator(
        {**branch["properties"]["data"]["contentSchema"], **components}) for branch in events}

    def check(event: dict[str, str]) -> None:
        item_validator.validate(event)
        data_validators[event["event"]].validate(json.loads(event["data"]))

    return check


async def test_watch_events_conform_to_the_served_spec(fuzz_node: RunningNode) -> None:
    node = fuzz_node
    async with aiohttp.ClientSession() as anonymous, anonymous.get(f"{node.url}/v1/openapi.json") as response:
        check = _event_checker(await response.json())

    async with Watcher(node.session, "/v1/watch", node.admin_token) as live:
        await node.register(registration("watch.fuzz.one"))
        await node.register(registration("watch.fuzz.brief", lease_ttl_ms=1_000, allowed_callers=["admin", "ops.*.*"],
                                         labels={"team": "watch"}, capabilities=[]))
        status, _ = await node.call("PUT", "/v1/agents/watch.fuzz.one/heartbeat",
                                    json={"status": "degraded", "load": {"queued": 1, "inflight": 2, "rps": 0.5}})
        assert status == 200
        status, _ = await node.call("DELETE", "/v1/agents/watch.fuzz.one")
        assert status == 200

        def reasons() -> set[str]:
            return {change["reason"] for change in live.data("change") if change["kind"] == "delete"}

        await wait_for(lambda: reasons() >= {"deregistered", "expired"}, message="a deregistration and an expiry")
    changes = live.data("change")
    assert {change["kind"] for change in changes} == {"upsert", "status", "delete"}

    async with Watcher(node.session, "/v1/watch?since=0", node.admin_token) as replay:
        await wait_for(lambda: len(replay.data("change")) >= len(changes) + 2, message="the replayed changes")

    # A watcher whose queue fills up is cut off with an overflow event (a queue of one, and two
    # changes published before its handler runs).
    node.node.watch.subscriber_queue = 1
    async with Watcher(node.session, "/v1/watch", node.admin_token) as overflowing:
        for change in (await node.node.store.read_changes(after_version=0, count=2)):
            node.node.watch.publish(change)
        await wait_for(lambda: overflowing.ended, message="the overflowing watcher cut off")
    assert overflowing.kinds() == ["hello", "overflow"]

    events = live.events + replay.events + overflowing.events
    for event in events:
        check(event)
    assert {event["event"] for event in events} == {"hello", "change", "overflow"}
    # The checker refuses what the spec does not describe.
    for wrong in ({"event": "change", "data": json.dumps({"kind": "upsert"}), "id": "1"},
                  {"event": "hello", "data": "{}"}, {"event": "gossip", "data": "{}"}):
        with pytest.raises(jsonschema_rs.ValidationError):
            check(wrong)


@pytest.mark.unit
def test_the_spec_is_an_openapi_3_2_document() -> None:
    # schemathesis carries the OpenAPI meta-schemas (an internal module: the dev extra pins 4.x).
    from schemathesis.specs.openapi.definitions import OPENAPI_32_VALIDATOR

    for served in (None, frozenset({("get", "/healthz"), ("post", "/v1/send")})):
        spec = json.loads(json.dumps(build_openapi("fuzz", served=served)))
        assert spec["openapi"].startswith("3.2")
        assert [error.message for error in OPENAPI_32_VALIDATOR.iter_errors(spec)] == []
    assert set(build_openapi("fuzz", served=frozenset({("post", "/v1/send")}))["paths"]) == {"/v1/send"}


# -- the spec's patterns are the validators' ----------------------------------------------------

PATTERN_SETTINGS = settings(max_examples=300, derandomize=True, database=None, deadline=None,
                            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _spec_admits(pattern: str, text: str) -> bool:
    admitted = jsonschema_rs.is_valid({"type": "string", "pattern": pattern}, text)
    assert admitted == (re.search(pattern, text) is not None), "JSON Schema and Python read the pattern alike"
    return admitted


def _parses(text: str) -> bool:
    try:
        parse_version(text)
    except ValueError:
        return False
    return True


# Pieces of PEP 440 versions (and of near misses), joined at random.
VERSION_PIECES = ["0", "1", "10", ".", "-", "_", "+", "!", "a", "b", "c", "rc", "alpha", "beta", "pre", "preview",
                  "post", "rev", "r", "dev", "v", "V", "RC", "Post", "local", "x", ".*", " ", "\u3000", "\u00a0"]


@PATTERN_SETTINGS
@given(st.one_of(st.from_regex(VERSION_PATTERN, fullmatch=True),
                 st.lists(st.sampled_from(VERSION_PIECES), min_size=1, max_size=8).map("".join)))
def test_the_version_pattern_is_what_parse_version_accepts(text: str) -> None:
    assert _spec_admits(VERSION_PATTERN, text) == _parses(text), text


@PATTERN_SETTINGS
@given(st.from_regex(CONSTRAINT_PATTERN, fullmatch=True).filter(lambda text: len(text) <= 100))
def test_constraints_the_spec_admits_are_accepted(text: str) -> None:
    assert _spec_admits(CONSTRAINT_PATTERN, text)
    version_constraint(text)


NODE_URLS = url_pattern(("http", "https"))
ENDPOINT_URLS = url_pattern(("http", "https", "grpc", "grpcs", "ws", "wss"))


@PATTERN_SETTINGS
@given(node_url=st.from_regex(NODE_URLS, fullmatch=True).filter(lambda url: len(url) <= 2_000),
       endpoint=st.from_regex(ENDPOINT_URLS, fullmatch=True).filter(lambda url: len(url) <= 2_000))
def test_urls_the_spec_admits_are_accepted(node_url: str, endpoint: str) -> None:
    assert _spec_admits(NODE_URLS, node_url) and _spec_admits(ENDPOINT_URLS, endpoint)
    Probe(url=node_url)
    Registration(agent_id="url.spec.check", endpoints={"primary": endpoint}, callback_endpoint=node_url)
    # What a record may hold is wider still.
    assert _spec_admits(stored_url_pattern(("http", "https")), node_url)


@PATTERN_SETTINGS
@given(st.one_of(st.from_regex(f"^{IPV6_PATTERN}$", fullmatch=True),
                 st.lists(st.sampled_from(["0", "1", "ff", "ABCD", "12345", ":", "::", ".", "1.2.3.4", "256"]),
                          min_size=1, max_size=10).map("".join)))
def test_the_ipv6_pattern_is_what_ipaddress_reads(text: str) -> None:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        parsed = False
    else:
        parsed = True
    assert _spec_admits(f"^{IPV6_PATTERN}$", text) == parsed, text


# -- what the fuzzer found ------------------------------------------------------------------------


async def test_a_report_is_told_from_a_batch_by_its_keys(fuzz_node: RunningNode) -> None:
    headers = {"Content-Type": "application/json"}
    one = {"signature": "reports", "agent_id": ECHO, "outcome": "success"}   # the word inside a value
    status, body = await fuzz_node.call("POST", "/v1/reports", json=one)
    assert (status, body["error"]) == (403, "invalid_ticket"), body
    escaped = b'{"\\u0072eports": [{"signature": "x.y", "agent_id": "fuzz.echo.one", "outcome": "success"}]}'
    status, body = await fuzz_node.call("POST", "/v1/reports", data=escaped, headers=headers)
    assert (status, body["error"]) == (403, "invalid_ticket"), body
    status, body = await fuzz_node.call("POST", "/v1/reports", data=b'{"reports": [', headers=headers)
    assert (status, body["error"]) == (400, "invalid_json"), body


async def test_boolean_parameters_refuse_what_they_do_not_read(fuzz_node: RunningNode) -> None:
    for value, count in (("true", 2), ("YES", 2), ("0", 2), ("false", 2)):
        status, body = await fuzz_node.call("GET", f"/v1/agents?routable={value}")
        assert status == 200 and body["count"] == count, (value, body)
    for path in ("/v1/agents?routable=ture", "/v1/search?q=echo&routable=2"):
        status, body = await fuzz_node.call("GET", path)
        assert (status, body["field"]) == (422, "routable"), (path, body)
    status, body = await fuzz_node.call("GET", "/v1/search?q=" + "%20" * 10 + "a" * 1_995)
    assert (status, body["field"]) == (422, "q"), body
