"""Rate budgets as one process spends them (``node.trust.budgets``), on a clock the test moves; the
region-wide sharing through Redis is ``tests/http/test_tenant_shares.py``'s."""

from __future__ import annotations

import pytest

from node.core import RateLimited
from node.core.models import TokenClaims, TokenRole
from node.trust import RateBudgets, RateSettings, tenant_of

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _claims(sub: str, role: TokenRole) -> TokenClaims:
    return TokenClaims(sub=sub, role=role, exp=2**40, iat=0)


def _budgets(clock: Clock, **settings: object) -> RateBudgets:
    return RateBudgets(None, key_base="ar:{eu}", region="eu", settings=RateSettings(**settings), clock=clock)


def test_a_bucket_refills_at_its_rate_and_says_when_to_retry() -> None:
    clock = Clock()
    budgets = _budgets(clock, rate_limit_rps=2.0, rate_limit_burst=3)
    caller = _claims("app.one", TokenRole.CALLER)
    for _ in range(3):
        budgets.spend(caller)
    with pytest.raises(RateLimited) as refused:
        budgets.spend(caller)
    assert refused.value.details == {"retry_after_ms": 500, "budget": "caller"}
    clock.now = 0.5  # one token back at 2/s
    budgets.spend(caller)
    with pytest.raises(RateLimited):
        budgets.spend(caller)
    assert budgets.refused == {("caller", "caller"): 2}


def test_a_tenant_is_a_role_and_a_subject() -> None:
    clock = Clock()
    budgets = _budgets(clock, rate_limit_rps=1.0, rate_limit_burst=1, rate_limit_agent_rps=1.0,
                       rate_limit_agent_burst=1, rate_limit_admin_rps=1.0, rate_limit_admin_burst=1)
    for name in ("admin", "pay.core.prod"):
        budgets.spend(_claims(name, TokenRole.CALLER))
        with pytest.raises(RateLimited):
            budgets.spend(_claims(name, TokenRole.CALLER))
    budgets.spend(_claims("admin", TokenRole.ADMIN))  # the namesakes' buckets are their own
    budgets.spend(_claims("pay.core.prod", TokenRole.AGENT))
    assert tenant_of(_claims("admin", TokenRole.CALLER)) != tenant_of(_claims("admin", TokenRole.ADMIN))


def test_admins_and_peers_are_unlimited_by_default_and_capabilities_have_their_own_buckets() -> None:
    clock = Clock()
    budgets = _budgets(clock, rate_limit_capability_rps=1.0, rate_limit_capability_burst=2)
    for role in (TokenRole.ADMIN, TokenRole.PEER):
        for _ in range(5_000):
            budgets.spend(_claims("ops", role), "cap.one")
    caller = _claims("app.two", TokenRole.CALLER)
    budgets.spend(caller, "cap.one")
    budgets.spend(caller, "cap.one")
    with pytest.raises(RateLimited) as refused:
        budgets.spend(caller, "cap.one")
    assert refused.value.details["budget"] == "capability"
    budgets.spend(caller, "cap.two")
    budgets.spend(caller)  # its own budget is another bucket
