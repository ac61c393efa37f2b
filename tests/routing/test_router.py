"""The router on its own (no Redis, no HTTP): records in an in-memory AgentIndex, a stand-in for
the three things the router reads of its RegionCache, a simulated clock and a seeded RNG.

Each test asserts what a caller relies on: shares that follow the effective weight, sticky
conversations, traffic that spills to peers only for the share the local region cannot carry,
breakers that eject at most half a pool (the breaker itself: tests/delivery/test_breakers.py),
agents the caller may not see that do not exist for it, version constraints, and the semantic
fallback.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest

from node.config import NodeConfig
from node.core import NoAgentAvailable
from node.core.models import Load, Outcome, RouteRequest, Status, TokenClaims, TokenRole
from node.delivery import OutcomeTracker
from node.routing import SemanticMatch, SemanticMatches
from node.routing.router import ALL_WEIGHT_FACTORS, WeightFactor
from node.service import RegistryNode
from topology.spec import Topology

from ..helpers import (
    ADMIN,
    CAPABILITY,
    INSIDER,
    LEASE_MS,
    REGION,
    START_MS,
    Peer,
    index_of,
    make_router,
    picks,
    record,
    stages,
)

pytestmark = pytest.mark.unit

OUTSIDER = TokenClaims(sub="ops.caller.x", role=TokenRole.CALLER, exp=2**40, iat=0)


# -- weighted choice -------------------------------------------------------------------------

def test_shares_follow_registered_weight_status_and_load() -> None:
    router, _, _ = make_router(record("lang.translate.w1", weight=100), record("lang.translate.w2", weight=200),
                               record("lang.translate.w7", weight=700))
    count = 3_000
    picked = picks(router, count, capability=CAPABILITY)
    for agent_id, share in {"lang.translate.w1": 0.1, "lang.translate.w2": 0.2, "lang.translate.w7": 0.7}.items():
        assert abs(picked[agent_id] / count - share) < 0.03, picked

    # degraded (×0.5) and at capacity (×0.5): a quarter of the calm one's weight, so 20 %.
    router, _, _ = make_router(record("lang.translate.calm", max_concurrency=10),
                               record("lang.translate.hot", max_concurrency=10, status=Status.DEGRADED,
                                      load=Load(inflight=10, queued=0)))
    picked = picks(router, 2_000, capability=CAPABILITY)
    assert abs(picked["lang.translate.hot"] / 2_000 - 0.2) < 0.03, picked


def test_weight_factors_switch_parts_of_the_effective_weight() -> None:
    agents = (record("lang.translate.light", weight=100), record("lang.translate.heavy", weight=900, status=Status.BUSY))
    uniform, _, _ = make_router(*agents, factors=WeightFactor(0))
    picked = picks(uniform, 2_000, capability=CAPABILITY)
    assert abs(picked["lang.translate.heavy"] / 2_000 - 0.5) < 0.03, picked
    weight_only, _, _ = make_router(*agents, factors=WeightFactor.WEIGHT)
    picked = picks(weight_only, 2_000, capability=CAPABILITY)
    assert abs(picked["lang.translate.heavy"] / 2_000 - 0.9) < 0.03, picked
    blend, _, _ = make_router(*agents)  # 900 × 0.2 (busy) = 180 against 100
    picked = picks(blend, 2_000, capability=CAPABILITY)
    assert abs(picked["lang.translate.heavy"] / 2_000 - 180 / 280) < 0.03, picked

    assert WeightFactor.from_names(["weight", "LOAD"]) == WeightFactor.WEIGHT | WeightFactor.LOAD
    assert ALL_WEIGHT_FACTORS == WeightFactor.from_names(["weight", "status", "load", "errors"])
    with pytest.raises(ValueError, match="unknown weight factor 'speed'; use errors, load, status, weight"):
        WeightFactor.from_names(["speed"])
    with pytest.raises(TypeError, match="WeightFactor"):
        make_router(*agents, factors=frozenset({"weight"}))


def test_alternates_are_other_agents_and_draining_ones_are_never_chosen() -> None:
    router, _, _ = make_router(*(record(f"lang.translate.a{i}") for i in range(12)),
                               record("lang.translate.leaving", status=Status.DRAINING))
    for _ in range(200):
        decision = router.decide_exact(RouteRequest(capability=CAPABILITY), ADMIN)
        named = [decision.target.agent_id, *(c.agent_id for c in decision.alternates)]
        assert len(named) == 3 and len(set(named)) == 3, named
        assert "lang.translate.leaving" not in named
    assert stages(router, agent_id="lang.translate.leaving") == {"local": "1 matched, none routable (1 draining)"}


# -- affinity --------------------------------------------------------------------------------

def test_a_conversation_stays_on_its_agent_and_moves_only_when_that_agent_goes() -> None:
    router, region, _ = make_router(*(record(f"lang.translate.s{i}") for i in range(4)))
    owners = {}
    for conversation in range(60):
        picked = picks(router, 10, capability=CAPABILITY, conversation_id=f"conv-{conversation}")
        assert len(picked) == 1, "a conversation moved between agents"
        owners[f"conv-{conversation}"] = next(iter(picked))
    assert len(set(owners.values())) == 4, "affinity should still spread conversations"

    removed = owners["conv-0"]
    region.index.remove(removed)
    for conversation, owner in owners.items():
        now = next(iter(picks(router, 1, capability=CAPABILITY, conversation_id=conversation)))
        assert now != removed
        if owner != removed:
            assert now == owner, "rendezvous hashing must not move conversations of surviving agents"


# -- levels and spill-over -------------------------------------------------------------------

def test_local_first_spills_only_the_share_the_local_region_cannot_carry() -> None:
    east = Peer("east", index_of("east", record("lang.translate.e1", region="east")))
    healthy = record("lang.translate.h1")
    unready = [record(f"lang.translate.u{i}", ready=False) for i in range(3)]
    router, _, _ = make_router(healthy, *unready, peers=(east,))
    # One of four equal agents is healthy: the local level takes min(1, 1.4 × 1/4) = 35 %.
    picked = picks(router, 2_000, capability=CAPABILITY)
    assert abs(picked["lang.translate.h1"] / 2_000 - 0.35) < 0.03, picked
    assert set(picked) == {"lang.translate.h1", "lang.translate.e1"}

    # The preferred region comes first, and a fully healthy level carries all the traffic.
    assert set(picks(router, 200, capability=CAPABILITY, preferred_region="east")) == {"lang.translate.e1"}
    decision = router.decide_exact(RouteRequest(capability=CAPABILITY, preferred_region="east"), ADMIN)
    assert decision.target.target["region"] == "east" and decision.target.target["locality"] == "remote"
    assert set(picks(router, 200, capability=CAPABILITY, scope="local")) == {"lang.translate.h1"}


def test_a_stale_peer_serves_only_when_nothing_fresher_can() -> None:
    stale = Peer("west", index_of("west", record("lang.translate.w1", region="west")), stale=True)
    router, region, _ = make_router(record("lang.translate.h1"), peers=(stale,))
    assert set(picks(router, 200, capability=CAPABILITY)) == {"lang.translate.h1"}
    decision = router.decide_exact(RouteRequest(capability=CAPABILITY), ADMIN)
    assert [c.agent_id for c in decision.alternates] == ["lang.translate.w1"], "the stale peer is the last resort"

    region.index.remove("lang.translate.h1")
    decision = router.decide_exact(RouteRequest(capability=CAPABILITY), ADMIN)
    assert decision.target.agent_id == "lang.translate.w1" and decision.target.target["stale"] is True
    stale.stale = False  # heard from again: the same peer is a fresh level now
    decision = router.decide_exact(RouteRequest(capability=CAPABILITY), ADMIN)
    assert decision.target.agent_id == "lang.translate.w1" and decision.target.target["stale"] is False
    assert stages(router, capability=CAPABILITY, scope="local") == {
        "local": "no agent has capability 'translate.text'", "remote": "scope=local"}


def test_a_passed_lease_takes_the_agent_out_without_waiting_for_the_index() -> None:
    router, _, clock = make_router(record("lang.translate.old"), record("lang.translate.new",
                                                                        lease_expires_at_ms=START_MS + 2 * LEASE_MS))
    assert set(picks(router, 100, capability=CAPABILITY)) == {"lang.translate.old", "lang.translate.new"}
    clock.now = START_MS + LEASE_MS  # the cached table must notice the lease horizon moving past
    assert set(picks(router, 100, capability=CAPABILITY)) == {"lang.translate.new"}
    assert stages(router, agent_id="lang.translate.old") == {"local": "1 matched, none routable (1 lease_expired)"}


# -- breakers --------------------------------------------------------------------------------

def test_breakers_eject_at_most_half_a_pool_and_a_named_agent_gets_no_exemption() -> None:
    outcomes = OutcomeTracker(failure_threshold=3)
    agents = [f"lang.translate.e{i}" for i in range(4)]
    router, _, clock = make_router(*(record(agent_id) for agent_id in agents), outcomes=outcomes)
    for agent_id in agents[:3]:
        for _ in range(3):
            outcomes.record(agent_id, Outcome.FAILURE, now_ms=clock.now)
    outcomes.record(agents[0], Outcome.TIMEOUT, now_ms=clock.now)  # e0 is the worst: it stays out
    routed = set(picks(router, 400, capability=CAPABILITY))
    assert len(routed) == 2 and agents[3] in routed and agents[0] not in routed, routed
    assert stages(router, agent_id=agents[1]) == {"local": "1 matched, none routable (1 circuit_open)"}


# -- visibility, exclusion, versions ---------------------------------------------------------

def test_an_agent_the_caller_may_not_see_does_not_exist_for_it() -> None:
    router, _, _ = make_router(record("lang.translate.pub"),
                               record("lang.translate.vip", allowed_callers=["finance.*.*"]))
    assert set(picks(router, 200, OUTSIDER, capability=CAPABILITY)) == {"lang.translate.pub"}
    assert set(picks(router, 400, INSIDER, capability=CAPABILITY)) == {"lang.translate.pub", "lang.translate.vip"}
    # Neither an ACL nor a count: the reasons read as if the agent were not registered.
    assert stages(router, OUTSIDER, agent_id="lang.translate.vip") == {"local": "no agent lang.translate.vip"}
    decision = router.decide_exact(RouteRequest(capability=CAPABILITY), OUTSIDER)
    assert [c.agent_id for c in decision.alternates] == [], "no ACL-denied alternate"
    assert stages(router, OUTSIDER, capability=CAPABILITY, exclude=["lang.translate.pub"]) == {
        "local": "1 matched, none routable (1 excluded)"}


def test_version_constraints_select_compatible_versions() -> None:
    router, _, _ = make_router(record("lang.translate.v1", version="1.4"), record("lang.translate.v2", version="v2.0.1"))
    for constraint, expected, version in [("1", "lang.translate.v1", "1.4"), ("v1.2", "lang.translate.v1", "1.4"),
                                          ("2", "lang.translate.v2", "v2.0.1"), (">=2,<3", "lang.translate.v2", "v2.0.1")]:
        decision = router.decide_exact(RouteRequest(capability=CAPABILITY, version=constraint), ADMIN)
        assert decision.target.agent_id == expected, constraint
        assert decision.match == {"kind": "exact", "capability": CAPABILITY, "version": version, "score": 1.0}
    assert stages(router, capability=CAPABILITY, version="1.5") == {
        "local": "2 matched, none routable (2 incompatible_version)"}


def test_a_ticket_is_signed_for_the_caller_and_expires_after_its_ttl() -> None:
    router, _, clock = make_router(record("lang.translate.t1"), ticket_ttl_ms=2_000)
    decision = router.decide_exact(RouteRequest(capability=CAPABILITY, trace_id="collab-1"), INSIDER)
    ticket = decision.ticket()
    assert (ticket.issued_at_ms, ticket.expires_at_ms) == (clock.now, clock.now + 2_000)
    assert ticket.caller == INSIDER.sub and ticket.trace_id == "collab-1"
    claims = router.signer.verify_ticket(ticket.signature)
    assert claims["a"] == ["lang.translate.t1"] and claims["c"] == INSIDER.sub


# -- semantic fallback -----------------------------------------------------------------------

class FixedMatcher:
    """Answers every query with the same scored hits, filtered by ``allow`` as a real one is, and
    the threshold of the ranking it claims to have used."""

    def __init__(self, *hits: SemanticMatch, threshold: float = 0.5, ranking: str = "hybrid") -> None:
        self.hits = list(hits)
        self.threshold = threshold
        self.ranking = ranking

    async def match(self, text: str, *, k: int, allow: Callable[[str, str], bool] | None = None
                    ) -> SemanticMatches:
        matches = [hit for hit in self.hits if allow is None or allow(hit.region, hit.agent_id)][:k]
        return SemanticMatches(matches=matches, threshold=self.threshold, ranking=self.ranking)


async def test_the_semantic_fallback_takes_the_best_routable_match_above_the_threshold() -> None:
    router, _, _ = make_router(record("lang.translate.best", capability="lang.translate"),
                               record("lang.translate.next", capability="lang.translate"),
                               record("lang.translate.vip", capability="lang.translate", allowed_callers=["finance.*.*"]))
    router.matcher = FixedMatcher(SemanticMatch("lang.translate.vip", REGION, "lang.translate", 0.95),
                                  SemanticMatch("lang.translate.best", REGION, "lang.translate", 0.9),
                                  SemanticMatch("lang.translate.next", REGION, "lang.translate", 0.7),
                                  SemanticMatch("lang.translate.gone", REGION, "lang.translate", 0.6))
    decision = await router.decide(RouteRequest(capability="turn french into english"), OUTSIDER)
    assert decision.target.agent_id == "lang.translate.best"
    assert [c.agent_id for c in decision.alternates] == ["lang.translate.next"]
    assert decision.match == {"kind": "semantic", "capability": "lang.translate", "score": 0.9, "version": "1"}

    router.semantic_threshold = 0.92
    with pytest.raises(NoAgentAvailable) as raised:
        await router.decide(RouteRequest(capability="turn french into english"), OUTSIDER)
    assert raised.value.details is not None
    assert raised.value.details["stages"] == {  # type: ignore[index]
        "local": "no agent has capability 'turn french into english'",
        "semantic": "no match above the threshold 0.92 (hybrid ranking; best lang.translate.best at 0.90)"}


async def test_the_semantic_fallback_holds_matches_to_the_threshold_of_their_ranking() -> None:
    # A lexically ranked request (a Chinese one) scores on the lexical scale: its own threshold
    # decides, not the hybrid one; the node's configured thresholds override each its own.
    router, _, _ = make_router(record("zh.lang.fanyi", capability="lang.translate"))
    router.matcher = FixedMatcher(SemanticMatch("zh.lang.fanyi", REGION, "lang.translate", 0.09),
                                  threshold=0.07, ranking="lexical")
    decision = await router.decide(RouteRequest(capability="把这段话翻译成英文"), OUTSIDER)
    assert decision.target.agent_id == "zh.lang.fanyi"
    router.matcher = FixedMatcher(SemanticMatch("zh.lang.fanyi", REGION, "lang.translate", 0.05),
                                  threshold=0.07, ranking="lexical")
    with pytest.raises(NoAgentAvailable) as raised:
        await router.decide(RouteRequest(capability="帮我查一下社保缴纳记录"), OUTSIDER)
    assert raised.value.details["stages"]["semantic"] == (  # type: ignore[index]
        "no match above the threshold 0.07 (lexical ranking; best zh.lang.fanyi at 0.05)")
    router.semantic_threshold = 0.3  # measured for a model's hybrid scores: not what a BM25 score is held to
    router.matcher = FixedMatcher(SemanticMatch("zh.lang.fanyi", REGION, "lang.translate", 0.09),
                                  threshold=0.07, ranking="lexical")
    decision = await router.decide(RouteRequest(capability="把这段话翻译成英文"), OUTSIDER)
    assert decision.target.agent_id == "zh.lang.fanyi"
    router.semantic_lexical_threshold = 0.1
    with pytest.raises(NoAgentAvailable) as raised:
        await router.decide(RouteRequest(capability="把这段话翻译成英文"), OUTSIDER)
    assert "threshold 0.10 (lexical ranking" in raised.value.details["stages"]["semantic"]  # type: ignore[index]


def test_a_draw_among_a_tickets_weighted_targets_gives_each_agent_its_weights_share() -> None:
    # What the SDK does with a cached ticket: draw each call among the targets that carry a weight.
    # The alternates of the target's level are drawn uniformly (Midzuno's sample), so over many
    # tickets every agent gets exactly its weight's share; drawn by weight they would count it twice.
    weights = {f"lang.translate.w{n:02d}": n for n in range(1, 13)}  # 12 agents: the sampled path
    router, _, _ = make_router(*(record(agent_id, weight=weight) for agent_id, weight in weights.items()))
    draw = random.Random(11)
    drawn: Counter[str] = Counter()
    tickets = 20_000
    for _ in range(tickets):
        ticket = router.decide_exact(RouteRequest(capability=CAPABILITY), ADMIN).as_dict(weights=True)
        targets = [target for target in (ticket["target"], *ticket["alternates"]) if "weight" in target]
        assert len(targets) == 3 and len({target["agent_id"] for target in targets}) == 3
        chosen = draw.choices(targets, weights=[target["weight"] for target in targets])[0]
        drawn[chosen["agent_id"]] += 1
    total = sum(weights.values())
    for agent_id, weight in weights.items():
        assert abs(drawn[agent_id] / tickets - weight / total) < 0.008, (agent_id, drawn[agent_id] / tickets)
    assert "weight" not in router.decide_exact(RouteRequest(capability=CAPABILITY), ADMIN).as_dict()["target"]


def test_only_the_targets_level_is_drawn_among() -> None:
    # One local agent, a peer's as the alternate: the peer's is for failover, never drawn.
    router, _, _ = make_router(record("lang.translate.home", weight=10), peers=(
        Peer("away", index_of("away", record("lang.translate.away", region="away", weight=1_000))),))
    ticket = router.decide_exact(RouteRequest(capability=CAPABILITY), ADMIN).as_dict(weights=True)
    assert ticket["target"]["agent_id"] == "lang.translate.home" and ticket["target"]["weight"] == 10
    assert [alternate["agent_id"] for alternate in ticket["alternates"]] == ["lang.translate.away"]
    assert "weight" not in ticket["alternates"][0]


def test_a_topology_sets_each_ranking_s_threshold() -> None:
    """``[semantic] threshold`` and ``lexical_threshold`` land on the node settings of every region;
    a lexical node (semantic off) holds its own ranking to ``threshold`` when it has no lexical one."""
    topology = Topology.model_validate({"regions": [{"name": "eu", "node_urls": ["http://127.0.0.1:7101"]}],
                                        "semantic": {"threshold": 0.3, "lexical_threshold": 0.05}})
    config = topology.node_config("eu", redis_url="redis://127.0.0.1:1/0")
    assert (config.semantic_threshold, config.semantic_lexical_threshold) == (0.3, 0.05)
    hybrid = RegistryNode(config, secret=b"s" * 32).router
    assert (hybrid.semantic_threshold, hybrid.semantic_lexical_threshold) == (0.3, 0.05)
    lexical = RegistryNode(NodeConfig(region="eu", redis_url="redis://127.0.0.1:1/0", semantic_enabled=False,
                                      semantic_threshold=0.12), secret=b"s" * 32).router
    assert lexical.semantic_lexical_threshold == 0.12
