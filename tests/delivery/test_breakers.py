"""The circuit breaker (node.delivery.outcomes): opening, the half-open trial, evidence by reporter.

On its own (OutcomeTracker), through the router over an in-memory index, and through a live
node's outcome reports: failures within the window open it; no caller decides for everyone (one
reporter's failures count for half the threshold, and eject the agent from that reporter's own
routing only); after the cool-down one trial ticket goes through, and only that ticket's report
closes or re-opens it; one reporter moves the shared error penalty only so far. How routing
treats open breakers (at most half a pool ejected) is tested with the router (tests/routing).
"""

from __future__ import annotations

import pytest

from node.core import now_ms
from node.core.models import Outcome, RouteRequest, TokenRole
from node.delivery import BreakerState, OutcomeTracker
from node.delivery.outcomes import MAX_REPORTERS

from ..helpers import (
    ADMIN,
    CAPABILITY,
    INSIDER,
    RunningNode,
    make_router,
    picks,
    record,
    registration,
    route_many,
    stages,
    wait_for,
)

FAIL = Outcome.FAILURE


@pytest.mark.unit
def test_two_reporters_open_the_shared_breaker_one_ejects_for_itself() -> None:
    tracker = OutcomeTracker(failure_threshold=4, window_ms=1_000, cooldown_ms=500)
    for at in range(10):
        assert tracker.record("a", FAIL, now_ms=at, reporter="alice") is BreakerState.CLOSED
    assert tracker.ejected_for("alice", now_ms=10) == {"a"} and tracker.ejected_for("bob", now_ms=10) == set()
    assert tracker.record("a", FAIL, now_ms=11, reporter="bob") is BreakerState.CLOSED  # 2 + 1 of 4
    assert tracker.record("a", FAIL, now_ms=12, reporter="bob") is BreakerState.OPEN  # 2 + 2
    assert tracker.ejected_for("alice", now_ms=9 + 499) == {"a"}  # a cool-down from her last failure
    assert tracker.ejected_for("alice", now_ms=9 + 500) == set()


@pytest.mark.unit
def test_trusted_evidence_and_the_window() -> None:
    tracker = OutcomeTracker(failure_threshold=3, window_ms=100, cooldown_ms=50)
    tracker.record("a", FAIL, now_ms=0, reporter="alice")
    tracker.record("a", FAIL, now_ms=1, reporter="alice")  # alice counts for 2 of 3 (half, rounded up)
    assert tracker.record("a", FAIL, now_ms=200) is BreakerState.CLOSED  # alice's are out of the window
    assert tracker.record("a", FAIL, now_ms=201) is BreakerState.CLOSED
    assert tracker.record("a", FAIL, now_ms=202) is BreakerState.OPEN  # trusted evidence alone: three


@pytest.mark.unit
def test_what_is_held_per_agent_is_bounded() -> None:
    tracker = OutcomeTracker(failure_threshold=10, window_ms=10_000)
    for n in range(MAX_REPORTERS * 3):
        tracker.record("a", FAIL, now_ms=n, reporter=f"r{n}")
        if tracker.state("a", now_ms=n) is BreakerState.OPEN:
            break
    assert tracker.state("a", now_ms=n) is BreakerState.OPEN and n == 9  # ten callers, one failure each
    tracker = OutcomeTracker(failure_threshold=10_000, window_ms=10_000)
    for n in range(MAX_REPORTERS * 3):
        tracker.record("a", FAIL, now_ms=n, reporter=f"r{n}")
    assert len(tracker._agents["a"].by_reporter) == MAX_REPORTERS


@pytest.mark.unit
def test_one_reporter_moves_the_shared_error_penalty_only_so_far() -> None:
    tracker = OutcomeTracker(failure_threshold=4, window_ms=1_000)
    for at in range(50):
        tracker.record("a", Outcome.REJECTED, now_ms=at, reporter="liar")
    alone = tracker.weight_factor("a", now_ms=50)
    assert alone == pytest.approx(1 - (1 - 0.8**2), abs=0.01)  # two moves (half of 4) of the EWMA, no more
    for at in range(50, 100):
        tracker.record("a", Outcome.REJECTED, now_ms=at)  # trusted evidence moves it every time
    assert tracker.weight_factor("a", now_ms=100) < alone


@pytest.mark.unit
def test_an_open_breaker_admits_one_trial_after_the_cool_down_and_closes_on_success() -> None:
    outcomes = OutcomeTracker(failure_threshold=2, cooldown_ms=500)
    router, _, clock = make_router(record("lang.translate.good"), record("lang.translate.bad"), outcomes=outcomes)
    for _ in range(2):
        outcomes.record("lang.translate.bad", Outcome.FAILURE, now_ms=clock.now)
    assert set(picks(router, 100, capability=CAPABILITY)) == {"lang.translate.good"}

    clock.now += 500  # the router reads the cool-down on its own clock
    trial = router.decide_exact(RouteRequest(agent_id="lang.translate.bad"), ADMIN)
    assert trial.target.agent_id == "lang.translate.bad"
    assert "circuit_open" in stages(router, agent_id="lang.translate.bad")["local"], "one trial per cool-down"
    outcomes.record("lang.translate.bad", Outcome.SUCCESS, now_ms=clock.now)
    assert set(picks(router, 200, capability=CAPABILITY)) == {"lang.translate.good", "lang.translate.bad"}


@pytest.mark.unit
def test_only_the_trial_ticket_decides_a_half_open_breaker() -> None:
    # A caller that kept an older ticket must not close a broken agent's breaker for everyone
    # with a made-up success, nor hold a mended one open with a made-up failure.
    outcomes = OutcomeTracker(failure_threshold=2, cooldown_ms=500)
    router, _, clock = make_router(record("lang.translate.good"), record("lang.translate.bad"), outcomes=outcomes)
    old = router.decide_exact(RouteRequest(agent_id="lang.translate.bad"), INSIDER)
    for reporter in ("a", "b"):  # two callers' word opens it
        outcomes.record("lang.translate.bad", Outcome.FAILURE, now_ms=clock.now, reporter=reporter)
    clock.now += 500
    trial = router.decide_exact(RouteRequest(agent_id="lang.translate.bad"), INSIDER)
    assert trial.target.agent_id == "lang.translate.bad" and trial.ticket_id != old.ticket_id
    for outcome in (Outcome.SUCCESS, Outcome.FAILURE):
        state = outcomes.record("lang.translate.bad", outcome, now_ms=clock.now, reporter=INSIDER.sub,
                                ticket_id=old.ticket_id)
        assert state is BreakerState.HALF_OPEN, outcome
    assert outcomes.record("lang.translate.bad", Outcome.SUCCESS, now_ms=clock.now, reporter=INSIDER.sub,
                           ticket_id=trial.ticket_id) is BreakerState.CLOSED
    assert set(picks(router, 200, capability=CAPABILITY)) == {"lang.translate.good", "lang.translate.bad"}


async def test_breaker_opens_on_failures_and_recovers(node_factory) -> None:
    node = await node_factory(breaker_failures=5, breaker_window_ms=10_000, breaker_cooldown_ms=1_500)
    await node.register(registration("lang.translate.good"))
    await node.register(registration("lang.translate.bad"))
    caller, other = node.token("ops.caller.c1", TokenRole.CALLER), node.token("ops.caller.c9", TokenRole.CALLER)

    async def report_failures(token: str, count: int) -> None:
        status, ticket = await node.resolve(capability="translate.text", token=token)
        assert "lang.translate.bad" in [ticket["target"]["agent_id"], *(a["agent_id"] for a in ticket["alternates"])]
        reports = [{"signature": ticket["signature"], "agent_id": "lang.translate.bad", "outcome": "failure"}] * count
        status, body = await node.call("POST", "/v1/reports", json={"reports": reports}, token=token)
        assert status == 200 and body["accepted"] == count

    # One caller's five failures take the agent out of that caller's routing only (for a cool-down) ...
    await report_failures(caller, 5)
    assert node.node.outcomes.ejected_for("ops.caller.c1", now_ms=now_ms()) == {"lang.translate.bad"}
    for _ in range(5):
        status, ticket = await node.resolve(capability="translate.text", token=caller)
        assert ticket["target"]["agent_id"] == "lang.translate.good" and not ticket["alternates"]
    assert set(route_many(node, 200, capability="translate.text")) == {"lang.translate.good", "lang.translate.bad"}
    # ... a second caller's word opens the breaker for everyone (each counts for half the threshold, rounded up).
    await report_failures(other, 3)
    assert set(route_many(node, 200, capability="translate.text")) == {"lang.translate.good"}
    status, body = await node.resolve(agent_id="lang.translate.bad")
    assert status == 404 and "circuit_open" in str(body["details"])

    # Half-open after the cool-down: one trial ticket, then closed again on success.
    trial = await wait_for(lambda: _ticket_for(node, "lang.translate.bad", caller), timeout_s=5,
                           message="half-open trial")
    status, again = await node.resolve(agent_id="lang.translate.bad", token=caller)
    assert status == 404, "half-open admits one trial per cool-down"
    status, _ = await node.call("POST", "/v1/reports", token=caller, json={
        "signature": trial["signature"], "agent_id": "lang.translate.bad", "outcome": "success"})
    assert status == 200
    status, ticket = await node.resolve(agent_id="lang.translate.bad", token=caller)
    assert status == 200


async def _ticket_for(node: RunningNode, agent_id: str, token: str) -> dict | None:
    status, body = await node.resolve(agent_id=agent_id, token=token)
    return body if status == 200 else None
