"""Token revocation: every token has an id; revoking it (POST /v1/admin/tokens/revoke, or
``agent-reach token revoke``) puts it on the region's deny list in Redis, and every node of the
region refuses it within the poll interval — two replicas over one Redis here, a restarted one,
and the command line. Other regions: ``tests/federation/test_revocations.py``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

from node.core.models import TokenRole
from node.trust import RevocationList, Signer, token_claims_unverified
from node.trust.tokens import new_token_id

from ..conftest import TEST_SECRET, NodeFactory
from ..helpers import RunningNode, wait_for

AGENT_REACH = str(Path(sys.executable).with_name("agent-reach"))
POLL_MS = 50


async def _status(node: RunningNode, token: str) -> tuple[int, str | None]:
    status, body = await node.call("GET", "/v1/agents", token=token)
    return status, body.get("error") if isinstance(body, dict) else None


async def _revoke(node: RunningNode, token: str, *, admin: str | None = None) -> tuple[int, dict]:
    claims = token_claims_unverified(token)
    return await node.call("POST", "/v1/admin/tokens/revoke", json={"jti": claims.jti, "exp": claims.exp},
                           token=admin)


@pytest.mark.unit
def test_every_token_has_an_id_of_its_own() -> None:
    signer = Signer(TEST_SECRET)
    first, second = (signer.verify(signer.issue("reader.console.one", TokenRole.CALLER)) for _ in range(2))
    assert first.jti and second.jti and first.jti != second.jti
    assert token_claims_unverified(signer.issue("admin", TokenRole.ADMIN)).jti
    with pytest.raises(ValueError, match="not an Agent-Reach token"):
        token_claims_unverified("Bearer nonsense")


async def test_a_token_revoked_through_one_replica_is_refused_by_the_other_within_the_poll(
        node_factory: NodeFactory) -> None:
    first = await node_factory(revocation_poll_interval_ms=POLL_MS)
    second = await node_factory(revocation_poll_interval_ms=POLL_MS)  # the same region, the same Redis
    doomed, kept = first.token("reader.console.one", TokenRole.CALLER), first.token("reader.console.two", TokenRole.CALLER)
    assert await _status(first, doomed) == (200, None) and await _status(second, doomed) == (200, None)

    status, body = await _revoke(first, doomed, admin=first.token("reader.console.three", TokenRole.CALLER))
    assert status == 403 and body["error"] == "admins_only"
    assert await _status(second, doomed) == (200, None)

    status, body = await _revoke(first, doomed)
    revoked_at = time.monotonic()
    assert status == 200 and body["new"] is True and body["expired"] is False, body
    assert body["poll_interval_ms"] == POLL_MS and body["region"] == first.node.region
    assert await _status(first, doomed) == (401, "token_revoked")  # the revoking node: at once
    await wait_for(lambda: _refused(second, doomed), timeout_s=5, message="the other replica refusing the token")
    took_ms = (time.monotonic() - revoked_at) * 1000
    print(f"\nrevoked through one replica, refused by the other after {took_ms:.0f} ms (poll {POLL_MS} ms)")
    assert took_ms < POLL_MS * 10, took_ms  # about one poll (a loaded machine gets some slack)
    assert await _status(second, kept) == (200, None)  # only that token

    status, body = await _revoke(second, doomed)
    assert status == 200 and body["new"] is False

    # A node that starts later reads the list before it serves.
    third = await node_factory(revocation_poll_interval_ms=POLL_MS)
    assert await _status(third, doomed) == (401, "token_revoked")


async def _refused(node: RunningNode, token: str) -> bool:
    return await _status(node, token) == (401, "token_revoked")


async def test_an_expired_token_needs_no_entry_and_the_list_lives_as_long_as_its_longest_entry(
        node: RunningNode) -> None:
    status, body = await node.call("POST", "/v1/admin/tokens/revoke",
                                   json={"jti": "expiredtoken1", "exp": int(time.time()) - 10})
    assert status == 200 and body["expired"] is True and body["new"] is False
    status, body = await node.call("POST", "/v1/admin/tokens/revoke", json={"jti": "short", "exp": 1})
    assert status == 422 and body["field"] == "jti"
    status, body = await node.call("POST", "/v1/admin/tokens/revoke", json={"jti": "toolate01", "exp": 10**15})
    assert status == 422 and body["field"] == "exp"

    revocations: RevocationList = node.node.revocations
    now = int(time.time())
    await revocations.revoke("longlived01", expires_at_s=now + 3_600)
    await revocations.revoke("shortlived1", expires_at_s=now + 60)  # a later, shorter one must not shorten the key
    ttl_ms = await node.node.store.redis.pttl(revocations.key)
    assert 3_500_000 < ttl_ms <= 3_600_000, ttl_ms
    assert revocations.revoked("shortlived1") and revocations.revoked("longlived01")
    assert not revocations.revoked("shortlived1", at_ms=(now + 61) * 1000)  # an entry ends with its token


async def _cli(*args: str, env: dict[str, str] | None = None, stdin: bytes | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        AGENT_REACH, *args, env={**os.environ, **(env or {})}, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(stdin), timeout=60)
    return process.returncode or 0, out.decode(), err.decode()


async def test_token_revoke_on_the_command_line(node_factory: NodeFactory,
                                                                        tmp_path: Path) -> None:
    here = await node_factory(revocation_poll_interval_ms=POLL_MS)
    replica = await node_factory(revocation_poll_interval_ms=POLL_MS)
    there = await node_factory(region_name=f"{here.node.region}-b", revocation_poll_interval_ms=POLL_MS)
    env = {"AGENT_REACH_URL": here.url, "AGENT_REACH_TOKEN": here.admin_token}

    # By the token itself (read from stdin): this region only.
    doomed = here.token("reader.cli.one", TokenRole.CALLER)
    code, out, err = await _cli("token", "revoke", "-", env=env, stdin=doomed.encode())
    assert code == 0, err
    assert f"revoked in region {here.node.region}" in out
    await wait_for(lambda: _refused(replica, doomed), timeout_s=5, message="the replica refusing the token")
    assert await _status(there, doomed) == (200, None)  # another region keeps its own list

    # By --jti and --exp, as JSON; --all-regions (once region by region: now the federation's
    # relay carries a revocation to the peers, tests/federation/test_revocations.py) is accepted.
    other = here.token("reader.cli.two", TokenRole.CALLER)
    claims = token_claims_unverified(other)
    code, out, err = await _cli("token", "revoke", "--jti", claims.jti, "--exp", str(claims.exp), "--all-regions",
                                "--topology", str(tmp_path / "absent.toml"), "--json", env=env)
    assert code == 0, err
    answer = json.loads(out)
    assert (answer["region"], answer["jti"], answer["new"], answer["peers"]) == (here.node.region, claims.jti, True, [])
    for node in (here, replica):
        await wait_for(lambda node=node: _refused(node, other), timeout_s=5, message=f"{node.url} refusing")
    assert await _status(there, other) == (200, None)  # no federation between these regions

    # Usage and reachability.
    code, _, err = await _cli("token", "revoke", env=env)
    assert code == 2 and "TOKEN, or --jti and --exp" in err
    code, _, err = await _cli("token", "revoke", "--jti", claims.jti, "--exp", str(claims.exp), "--node",
                              "http://127.0.0.1:1", env=env)
    assert code == 3 and "cannot reach the node" in err
    code, _, err = await _cli("token", "revoke", other, "--token", here.token("reader.cli.three", TokenRole.CALLER),
                              env=env)
    assert code == 1 and "admins_only" in err


async def test_a_watch_opened_with_a_revoked_token_ends_at_its_next_event(node_factory: NodeFactory) -> None:
    from ..helpers import Watcher, registration

    here = await node_factory(revocation_poll_interval_ms=POLL_MS)
    replica = await node_factory(revocation_poll_interval_ms=POLL_MS)
    doomed = here.token("reader.watch.one", TokenRole.CALLER)
    async with Watcher(replica.session, "/v1/watch", doomed) as watcher:
        assert watcher.kinds() == ["hello"]
        status, _ = await _revoke(here, doomed)
        assert status == 200
        await wait_for(lambda: _refused(replica, doomed), timeout_s=5, message="the replica refusing the token")
        await here.register(registration("lang.translate.after"))
        await wait_for(lambda: watcher.ended, timeout_s=5, message="the stream ending")
        assert watcher.kinds() == ["hello", "revoked"]  # the change after the revocation is not sent


@pytest.mark.unit
def test_a_token_id_can_be_given_to_the_command_line() -> None:
    # One in 64 base64url ids starts with '-', which argparse takes for an option (--jti -x...).
    ids = [new_token_id() for _ in range(2_000)]
    assert not any(token_id.startswith("-") for token_id in ids) and len(set(ids)) == len(ids)
    assert all(len(token_id) == 16 for token_id in ids)


@pytest.mark.unit
def test_a_subject_revocation_is_a_token_id_the_federation_carries() -> None:
    from federation.events import RevokedToken
    from node.core.models import MAX_TOKEN_EXPIRY_S, TOKEN_ID_PATTERN
    from node.trust.revocation import subject_entry

    entry = subject_entry(TokenRole.AGENT, "payment.risk_check.prod_01_with_a_rather_long_name", issued_until_s=2**40)
    assert RevokedToken(jti=entry, until_ms=MAX_TOKEN_EXPIRY_S * 1000).jti == entry
    assert __import__("re").match(TOKEN_ID_PATTERN, entry)
    assert entry != subject_entry(TokenRole.CALLER, "payment.risk_check.prod_01_with_a_rather_long_name",
                                  issued_until_s=2**40)


async def test_a_subject_revocation_refuses_that_subjects_older_tokens_only(node: RunningNode) -> None:
    signer, revocations = node.node.signer, node.node.revocations
    cut_off = int(time.time())
    await revocations.revoke_subject(TokenRole.AGENT, "lang.translate.old", issued_until_s=cut_off)
    older = signer.verify(signer.issue("lang.translate.old", TokenRole.AGENT, now_s=cut_off))
    newer = signer.verify(signer.issue("lang.translate.old", TokenRole.AGENT, now_s=cut_off + 1))
    as_caller = signer.verify(signer.issue("lang.translate.old", TokenRole.CALLER, now_s=cut_off))
    other = signer.verify(signer.issue("lang.translate.new", TokenRole.AGENT, now_s=cut_off))
    assert revocations.refuses(older)
    assert not revocations.refuses(newer) and not revocations.refuses(as_caller) and not revocations.refuses(other)
    # Read back from Redis as another replica would (the list's own poll).
    fresh = RevocationList.of(node.node.store, poll_interval_ms=POLL_MS)
    await fresh.refresh()
    assert fresh.refuses(older) and not fresh.refuses(newer)
