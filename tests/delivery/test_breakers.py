"""Breaker evidence by reporter (node.outcomes): no caller decides for everyone, each ejects for itself."""

from __future__ import annotations

import pytest

from node.core.models import Outcome
from node.delivery import BreakerState, OutcomeTracker
from node.delivery.outcomes import MAX_REPORTERS

pytestmark = pytest.mark.unit

FAIL = Outcome.FAILURE


def test_two_reporters_open_the_shared_breaker_one_ejects_for_itself() -> None:
    tracker = OutcomeTracker(failure_threshold=4, window_ms=1_000, cooldown_ms=500)
    for at in range(10):
        assert tracker.record("a", FAIL, now_ms=at, reporter="alice") is BreakerState.CLOSED
    assert tracker.ejected_for("alice", now_ms=10) == {"a"} and tracker.ejected_for("bob", now_ms=10) == set()
    assert tracker.record("a", FAIL, now_ms=11, reporter="bob") is BreakerState.CLOSED  # 2 + 1 of 4
    assert tracker.record("a", FAIL, now_ms=12, reporter="bob") is BreakerState.OPEN  # 2 + 2
    assert tracker.ejected_for("alice", now_ms=9 + 499) == {"a"}  # a cool-down from her last failure
    assert tracker.ejected_for("alice", now_ms=9 + 500) == set()


def test_trusted_evidence_and_the_window() -> None:
    tracker = OutcomeTracker(failure_threshold=3, window_ms=100, cooldown_ms=50)
    tracker.record("a", FAIL, now_ms=0, reporter="alice")
    tracker.record("a", FAIL, now_ms=1, reporter="alice")  # alice counts for 2 of 3 (half, rounded up)
    assert tracker.record("a", FAIL, now_ms=200) is BreakerState.CLOSED  # alice's are out of the window
    assert tracker.record("a", FAIL, now_ms=201) is BreakerState.CLOSED
    assert tracker.record("a", FAIL, now_ms=202) is BreakerState.OPEN  # trusted evidence alone: three


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


def test_one_reporter_moves_the_shared_error_penalty_only_so_far() -> None:
    tracker = OutcomeTracker(failure_threshold=4, window_ms=1_000)
    for at in range(50):
        tracker.record("a", Outcome.REJECTED, now_ms=at, reporter="liar")
    alone = tracker.weight_factor("a", now_ms=50)
    assert alone == pytest.approx(1 - (1 - 0.8**2), abs=0.01)  # two moves (half of 4) of the EWMA, no more
    for at in range(50, 100):
        tracker.record("a", Outcome.REJECTED, now_ms=at)  # trusted evidence moves it every time
    assert tracker.weight_factor("a", now_ms=100) < alone
