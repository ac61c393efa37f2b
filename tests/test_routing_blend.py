"""The routing blend earns its place, on a short run of the simulation in bench/routing.py.

The real Router, AgentIndex and OutcomeTracker route the same simulated traffic under each
policy: uniform, each weight factor alone, the blend without the load factor, and the blend.
The blend must beat each of them on the bench's main metric (p99 time-to-success, a request
that never succeeded counting as the deadline; the success rate breaks a tie), so a load factor
that stops working — or works backwards — fails here. A quality assertion, not a timing one.
"""

from __future__ import annotations

import pytest

import node.router as router_module
from bench.routing import (
    BLEND,
    SINGLES,
    UNIFORM,
    SimConfig,
    Simulation,
    arrivals,
    losses,
    policies,
    run_policies,
    table,
)

TEST_DURATION_MS = 40_000
TEST_SEED = 1
WITHOUT_LOAD = "blend-load"


def test_blend_beats_uniform_each_factor_alone_and_the_blend_without_load() -> None:
    router_clock = router_module.now_ms
    rivals = (UNIFORM, *SINGLES, WITHOUT_LOAD)
    chosen = {name: factors for name, factors in policies().items() if name in (*rivals, BLEND)}
    results = run_policies(SimConfig(duration_ms=TEST_DURATION_MS, seed=TEST_SEED), chosen)
    print(f"\n{TEST_DURATION_MS // 1000} simulated s, seed {TEST_SEED}\n{table(results)}")

    assert router_module.now_ms is router_clock, "the simulation must give the router its clock back"
    blend = results[BLEND]
    # The run exercised what the comparison is about: bursts that overload, a failing agent, breakers.
    assert blend.requests > 10_000
    assert blend.failed_attempts["failure"] > 0, "the flaky agent never failed"
    assert results[UNIFORM].breaker_opens > 0
    lost = losses(results, rivals)
    assert not lost, "the blend does not beat " + "; ".join(
        f"{name} (p99 {results[name].p99_ms:.0f} ms, {results[name].success_rate:.2%} succeeded)" for name in lost
    ) + f" — blend: p99 {blend.p99_ms:.0f} ms, {blend.success_rate:.2%} succeeded"


@pytest.mark.unit
def test_the_simulation_is_deterministic() -> None:
    config = SimConfig(duration_ms=10_000, seed=TEST_SEED)
    traffic = arrivals(config)
    assert traffic == arrivals(config)
    first = Simulation(config, policies()[BLEND], traffic, name=BLEND).run()
    again = Simulation(config, policies()[BLEND], traffic, name=BLEND).run()
    assert first == again
