"""The routing blend earns its place, on a short run of the simulation in bench/routing.py.

The real Router, AgentIndex and OutcomeTracker route the same simulated traffic under each
policy (a 10 s lease, load reported every second, callers drawing each call among their cached
ticket's targets): uniform, each weight factor alone, the blend without the load factor, and the blend.
The blend must beat each of them on the bench's main metric (p99 time-to-success, a request
that never succeeded counting as the deadline; the success rate breaks a tie), so a load factor
that stops working — or works backwards — fails here. A quality assertion, not a timing one.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import node.routing.router as router_module
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

TEST_DURATION_MS = 60_000  # with cached tickets drawn among (the SDK now), 40 s runs are noisy (seed 1 lost by 0.1 %)
TEST_SEEDS = (1, 2)
TEST_SEED = TEST_SEEDS[0]
WITHOUT_LOAD = "blend-load"


@pytest.mark.parametrize("seed", TEST_SEEDS)
def test_blend_beats_uniform_each_factor_alone_and_the_blend_without_load(seed: int) -> None:
    router_clock = router_module.now_ms
    rivals = (UNIFORM, *SINGLES, WITHOUT_LOAD)
    chosen = {name: factors for name, factors in policies().items() if name in (*rivals, BLEND)}
    config = SimConfig(duration_ms=TEST_DURATION_MS, seed=seed)
    assert (config.sdk, config.load_report_ms, config.heartbeat_ms) == ("drawn", 1_000, 3_333), "the SDK and node now"
    results = run_policies(config, chosen)
    print(f"\n{TEST_DURATION_MS // 1000} simulated s, seed {seed}\n{table(results)}")

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


def test_the_simulation_does_not_depend_on_the_hash_seed() -> None:
    # Routing tables patched from a set of changed agents once kept them in hash order, so the
    # same seed gave another run under another PYTHONHASHSEED (and the verdict moved with it).
    code = ("from bench.routing import BLEND, SimConfig, Simulation, arrivals, policies; "
            "config = SimConfig(duration_ms=40_000, seed=1); "
            "print(Simulation(config, policies()[BLEND], arrivals(config), name=BLEND).run())")
    runs = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": hash_seed},
                           capture_output=True, text=True, check=True, timeout=120).stdout
            for hash_seed in ("0", "1", "2")}
    assert len(runs) == 1, runs
