"""Does the routing blend earn its place? Each weight factor alone vs all of them, same traffic.

A deterministic discrete-event simulation (seeded RNGs, a simulated clock, no sleeps, no
network) drives the real :class:`node.routing.router.Router` over a real :class:`AgentIndex` and a real
:class:`OutcomeTracker`. Only the Redis-backed ``RegionCache`` is replaced, by a stand-in that
exposes what the router reads (``index``, ``preserving``, ``routable_now_ms()``), and the
router is given the simulated clock (``Router(clock=...)``).

The fleet is one capability served by twelve agents of unequal capacity. Operators set some
registered weights in proportion to capacity and left others at the default (a new big box
3× under-weighted, two small ones 4–6× over-weighted, two without ``max_concurrency`` so the
load factor assumes 10). One agent runs 3× slow and says ``degraded`` (its weight still the
healthy one); one says ``busy`` when its queue is longer than its worker count; one fails 30 %
of its calls (fast HTTP 503s) for the middle 30 % of the run and then recovers. Agents queue FIFO behind their worker pool and
answer 429 once ``QUEUE_LIMIT_PER_WORKER`` × workers are waiting; abandoned calls still run.

Load arrives as Poisson traffic at 55 % of the fleet's true capacity, with bursts at 95 %
(3–6 s long, one every ~20 s on average). Leases are 10 s; agents heartbeat (lease and status)
every third of it, 3.3 s, each at its own phase, and send their inflight/queued every second
through the light load report (``PUT /v1/agents/{id}/load``, which touches no stream), so the
router sees load up to a second late and status up to 3.3 s late. ``--load-report-ms 0`` is the
node before the light report: load travels with the heartbeats only.

Callers behave like ``ReachClient.call`` with ``idempotent=True``: they keep one route ticket
per caller for 1 s (the SDK's ticket cache: ``ticket_reuse_ms``, at most 90 % of the ticket's
10 s life; ``--ticket-reuse-ms 9000`` is the cache before), draw each call's first target
among the ticket's target and the alternates of its level by the weights the node gave them
(``--sdk drawn``, the SDK now; ``pinned``: the SDK before, every call to the ticket's target;
``fresh``: a decision per call, no cache), then fail over to the other targets and to a fresh
decision excluding what was tried, at most 3 attempts, backoff 0.5 s × 2^n ± 20 %, one overall
deadline; a failed attempt evicts the caller's ticket if it names that agent. They report
every attempt's outcome in batches flushed every second (the SDK default), which is when the
node's OutcomeTracker learns of it. The breaker is not a weight factor: the router applies it
under every policy, uniform included.

The main metric is decided up front: **p99 of time-to-success, where a request that never
succeeded counts as the deadline** (it cost the caller at least that). It folds the success
rate into the latency tail without an arbitrary weighting; when two policies both sit at the
deadline (more than 1 % of requests failed), the success rate breaks the tie.

Every policy sees the same arrivals, job sizes and failure draws (common random numbers), so
differences come from routing, not from luck of the draw.

Run from the repository root: `make bench-routing` or `.venv/bin/python -m bench.routing` (`--help`
for duration, seeds, pairs).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

from node.routing.router import ALL_WEIGHT_FACTORS, WeightFactor

from .routing_simulation import PolicyResult, Simulation
from .routing_workload import (
    BASE_UTILIZATION,
    BURST_UTILIZATION,
    DEADLINE_MS,
    DEFAULT_DURATION_S,
    DEFAULT_HEARTBEAT_MS,
    DEFAULT_LOAD_REPORT_MS,
    DEFAULT_SEED,
    DEFAULT_TICKET_REUSE_MS,
    LEASE_TTL_MS,
    SDK_MODES,
    AgentSpec,
    SimConfig,
    arrivals,
)

__all__ = ["BLEND", "SINGLES", "UNIFORM", "AgentSpec", "PolicyResult", "SimConfig", "Simulation", "arrivals",
           "losses", "main", "policies", "run_policies", "shares", "table"]

# -- policies, table, verdict ---------------------------------------------------------------

UNIFORM = "uniform"
BLEND = "blend"
SINGLES = ("weight", "status", "load", "errors")


def policies(*, pairs: bool = False, leave_one_out: bool = True) -> dict[str, WeightFactor]:
    """Uniform, each factor alone, optionally pairs and the blend minus one, and the blend."""
    chosen: dict[str, WeightFactor] = {UNIFORM: WeightFactor(0)}
    chosen.update({name: WeightFactor.from_names([name]) for name in SINGLES})
    if pairs:
        chosen.update({f"{a}+{b}": WeightFactor.from_names([a, b]) for a, b in itertools.combinations(SINGLES, 2)})
    if leave_one_out:
        chosen.update({f"blend-{name}": ALL_WEIGHT_FACTORS & ~WeightFactor.from_names([name]) for name in SINGLES})
    chosen[BLEND] = ALL_WEIGHT_FACTORS
    return chosen


def run_policies(config: SimConfig, chosen: dict[str, WeightFactor]) -> dict[str, PolicyResult]:
    """Every policy over the same arrival sequence."""
    traffic = arrivals(config)
    return {name: Simulation(config, factors, traffic, name=name).run() for name, factors in chosen.items()}


def losses(results: dict[str, PolicyResult], rivals: tuple[str, ...] = (UNIFORM, *SINGLES)) -> list[str]:
    """The rivals the blend does not beat on the main metric (empty: the blend earns its place)."""
    blend = results[BLEND]
    return [name for name in rivals if name in results and not blend.beats(results[name])]


def table(results: dict[str, PolicyResult]) -> str:
    header = (f"{'policy':<14} {'success':>8} {'mean':>7} {'p50':>6} {'p99':>6} {'p99 ok':>7} "
              f"{'503':>6} {'timeout':>7} {'429':>6} {'retried':>7} {'breaker':>7}")
    lines = [header, "-" * len(header)]
    for result in results.values():
        failed = result.failed_attempts
        lines.append(
            f"{result.policy:<14} {100 * result.success_rate:>7.2f}% {result.mean_ms:>7.0f} {result.p50_ms:>6.0f} "
            f"{result.p99_ms:>6.0f} {result.p99_success_ms:>7.0f} {failed['failure']:>6} {failed['timeout']:>7} "
            f"{failed['rejected']:>6} {result.retried:>7} {result.breaker_opens:>7}")
    return "\n".join(lines)


def shares(results: dict[str, PolicyResult], fleet: tuple[AgentSpec, ...]) -> str:
    """Each agent's share of attempts per policy, next to its share of the fleet's capacity."""
    total = sum(spec.capacity_rps for spec in fleet)
    lines = [f"{'agent':<8} {'capacity':>8} " + " ".join(f"{name:>9}" for name in results)]
    for spec in fleet:
        lines.append(f"{spec.name:<8} {100 * spec.capacity_rps / total:>7.1f}% "
                     + " ".join(f"{100 * r.share[spec.name]:>8.1f}%" for r in results.values()))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=int, default=DEFAULT_DURATION_S, help="simulated seconds per run")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--seeds", type=int, default=2, help="also check the verdict on this many further seeds")
    parser.add_argument("--heartbeat-ms", type=int, default=DEFAULT_HEARTBEAT_MS, help="lease and status")
    parser.add_argument("--load-report-ms", type=int, default=DEFAULT_LOAD_REPORT_MS,
                        help="the light load report's cadence (0: load only with heartbeats)")
    parser.add_argument("--sdk", choices=SDK_MODES, default=SDK_MODES[0],
                        help="drawn: per call among the ticket's targets; pinned: the ticket's target; fresh: no cache")
    parser.add_argument("--ticket-reuse-ms", type=int, default=DEFAULT_TICKET_REUSE_MS,
                        help="how long a caller reuses a ticket (the SDK's ticket_reuse_ms; 9000: before)")
    parser.add_argument("--pairs", action="store_true", help="also run every pair of factors")
    args = parser.parse_args()

    def config_of(seed: int) -> SimConfig:
        return SimConfig(duration_ms=args.duration_s * 1000, seed=seed, heartbeat_ms=args.heartbeat_ms,
                         load_report_ms=args.load_report_ms, sdk=args.sdk, ticket_reuse_ms=args.ticket_reuse_ms)

    config = config_of(args.seed)
    traffic = arrivals(config)
    capacity = sum(spec.capacity_rps for spec in config.fleet)
    print(f"{len(config.fleet)} agents, true capacity {capacity:.0f} req/s; {len(traffic)} requests over "
          f"{args.duration_s} simulated s (mean {len(traffic) / args.duration_s:.0f} req/s, base "
          f"{BASE_UTILIZATION:.0%} / bursts {BURST_UTILIZATION:.0%} of capacity); lease {LEASE_TTL_MS} ms, "
          f"heartbeat {args.heartbeat_ms} ms, load report {args.load_report_ms or 'with heartbeats'} ms, "
          f"SDK {args.sdk} reusing tickets {args.ticket_reuse_ms} ms, deadline {DEADLINE_MS} ms, seed {args.seed}")
    started = time.perf_counter()
    results = run_policies(config, policies(pairs=args.pairs))
    print(f"\nlatencies in ms; a request that never succeeded counts as the {DEADLINE_MS} ms deadline "
          f"(p99 ok = successes only); 503/timeout/429 = failed attempts\n")
    print(table(results))
    print("\nshare of attempts per agent\n")
    print(shares(results, config.fleet))
    lost = losses(results)
    saturated = all(result.p99_ms >= DEADLINE_MS for result in results.values())
    how = (" (censored p99 is at the deadline for every policy: the success rate decided)" if saturated else "")
    print(f"\nseed {args.seed}: " + ("the blend beats uniform and every single factor" if not lost
                                        else f"the blend does NOT beat: {', '.join(lost)}") + how)
    verdicts = [not lost]
    for seed in range(args.seed + 1, args.seed + 1 + args.seeds):
        other = run_policies(config_of(seed), policies(leave_one_out=True))
        lost = losses(other)
        verdicts.append(not lost)
        p99s = "  ".join(f"{name} {r.p99_ms:.0f}/{100 * r.success_rate:.2f}%" for name, r in other.items())
        print(f"seed {seed}: p99/success  {p99s}\n         " + ("blend beats every single factor" if not lost
                                                                else f"blend does NOT beat: {', '.join(lost)}"))
    print(f"\n{sum(verdicts)} of {len(verdicts)} seeds: blend beats uniform and each factor alone "
          f"({time.perf_counter() - started:.1f} s wall)")
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
