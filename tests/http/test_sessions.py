"""``GET /v1/session`` frame by frame, from a plain WebSocket client on 127.0.0.1."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson

from ..helpers import RunningNode, registration, wait_for


class Frames:
    """An open session read frame by frame."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    async def send(self, frame: dict[str, Any] | str) -> None:
        await self.ws.send_str(frame if isinstance(frame, str) else orjson.dumps(frame).decode())

    async def next(self, kind: str | None = None) -> dict[str, Any]:
        while True:
            message = await self.ws.receive(timeout=10)
            assert message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), message
            frame = orjson.loads(message.data)
            if kind is None or frame["t"] == kind:
                return frame


async def open_session(node: RunningNode, http: aiohttp.ClientSession, token: str | None = None) -> Frames:
    ws = await http.ws_connect(f"{node.url}/v1/session", headers=node.headers(token))
    return Frames(ws)


async def test_a_plain_get_is_told_to_upgrade_and_a_missing_token_is_refused(node: RunningNode) -> None:
    status, body = await node.call("GET", "/v1/session")
    assert status == 400 and body["error"] == "websocket_required"
    async with aiohttp.ClientSession() as http:
        try:
            await http.ws_connect(f"{node.url}/v1/session")
        except aiohttp.WSServerHandshakeError as exc:
            assert exc.status == 401
        else:
            raise AssertionError("a session without a token was opened")


async def test_frames_renew_report_load_and_refuse_by_name(node: RunningNode) -> None:
    await node.register(registration("sess.frames.a1", lease_ttl_ms=5_000))
    await node.register(registration("sess.frames.a2", lease_ttl_ms=5_000))
    before = node.node.cache.index.get("sess.frames.a1")
    assert before is not None
    registered_lease = before.lease_expires_at_ms  # the index moves leases in place
    await wait_for(lambda: time.time() * 1000 > registered_lease - 5_000 + 2, message="the clock past registration")
    async with aiohttp.ClientSession() as http:
        session = await open_session(node, http, node.token("sess.frames.a1"))
        await session.send({"t": "join", "agents": [
            {"agent_id": "sess.frames.a1", "token": node.token("sess.frames.a1")},
            {"agent_id": "sess.frames.a2", "token": node.token("sess.frames.a1")}]})  # not its token
        joined = await session.next("joined")
        assert joined["agents"] == ["sess.frames.a1"]
        assert [(r["agent_id"], r["error"]) for r in joined["refused"]] == [("sess.frames.a2", "forbidden")]

        await session.send({"t": "renew", "id": 7, "beats": [{"agent_id": "sess.frames.a1"},
                                                              {"agent_id": "sess.frames.a2"}]})
        renewed = await session.next("renewed")
        assert renewed["id"] == 7 and set(renewed["leases"]) == {"sess.frames.a1"}
        assert renewed["errors"]["sess.frames.a2"]["error"] == "not_joined"
        lease = renewed["leases"]["sess.frames.a1"]
        assert lease > registered_lease and lease > time.time() * 1000 + 4_000
        stored = await node.node.store.get("sess.frames.a1")
        assert stored is not None and stored.lease_expires_at_ms == lease and stored.version == before.version

        await session.send({"t": "load", "id": 8, "loads": [
            {"agent_id": "sess.frames.a1", "load": {"inflight": 3, "queued": 1, "rps": 2.0}}]})
        assert (await session.next("loaded")) == {"t": "loaded", "id": 8, "errors": {}}
        record = node.node.cache.index.get("sess.frames.a1")
        assert record is not None and record.load is not None and record.load.inflight == 3
        assert record.version == before.version  # load is soft state: no version

        await session.send({"t": "renew", "id": 9, "beats": [{"agent_id": "sess.frames.a1", "status": "busy"}]})
        changed = await session.next("renewed")
        assert "sess.frames.a1" in changed["leases"]
        record = node.node.cache.index.get("sess.frames.a1")
        assert record is not None and record.status.value == "busy" and record.version > before.version

        await session.send('{"t": "renew", "id": "x", "beats": []}')
        error = await session.next("error")
        assert error["error"] == "invalid_frame" and error["field"] == "renew.id"
        await session.send("not json")
        assert (await session.next("error"))["error"] == "invalid_frame"
        await session.send({"t": "renew", "id": 10, "beats": [{"agent_id": "sess.frames.a1"}]})
        assert (await session.next("renewed"))["id"] == 10  # a bad frame does not end the session
        await session.ws.close()


async def test_a_lapsed_lease_is_not_renewed_over_a_session(node: RunningNode) -> None:
    await node.register(registration("sess.lapse.a1", lease_ttl_ms=1_000))
    async with aiohttp.ClientSession() as http:
        session = await open_session(node, http)
        await session.send({"t": "join", "agents": [{"agent_id": "sess.lapse.a1", "token": node.admin_token}]})
        assert (await session.next("joined"))["agents"] == ["sess.lapse.a1"]
        await wait_for(lambda: node.node.cache.index.get("sess.lapse.a1") is None, timeout_s=10,
                       message="the lease to lapse and the record to go")
        await session.send({"t": "renew", "id": 1, "beats": [{"agent_id": "sess.lapse.a1"}]})
        renewed = await session.next("renewed")
        assert renewed["leases"] == {} and renewed["errors"]["sess.lapse.a1"]["error"] == "unknown_agent"
        await session.ws.close()


async def test_a_clean_leave_marks_nothing_and_a_drop_marks_the_agent_suspect(node: RunningNode) -> None:
    await node.register(registration("sess.leave.a1", lease_ttl_ms=30_000))
    await node.register(registration("sess.leave.a2", lease_ttl_ms=30_000))
    async with aiohttp.ClientSession() as http:
        session = await open_session(node, http)
        await session.send({"t": "join", "agents": [{"agent_id": agent_id, "token": node.admin_token}
                                                    for agent_id in ("sess.leave.a1", "sess.leave.a2")]})
        await session.next("joined")
        await session.send({"t": "leave", "agents": ["sess.leave.a1"]})
        await session.send({"t": "renew", "id": 1, "beats": [{"agent_id": "sess.leave.a1"}]})
        assert (await session.next("renewed"))["errors"]["sess.leave.a1"]["error"] == "not_joined"  # it left
        await session.ws.close()
    await wait_for(lambda: "sess.leave.a2" in node.node.cache.index.suspects, message="a2 suspect")
    assert "sess.leave.a1" not in node.node.cache.index.suspects
    status, _ = await node.resolve(capability="translate.text", agent_id=None)
    assert status == 200  # a1 still routable; a2 not
    status, body = await node.call("PUT", "/v1/agents/sess.leave.a2/heartbeat", json={})
    assert status == 200, body
    assert "sess.leave.a2" not in node.node.cache.index.suspects  # an HTTP heartbeat is a sign of life


async def test_an_agent_whose_tokens_are_revoked_renews_no_more_over_its_session(node: RunningNode) -> None:
    # The console's "revoke tokens" refuses every token of the agent's id: its session, joined
    # with one of them before, must refuse its renewals as the HTTP heartbeat does.
    await node.register(registration("sess.revoke.a1", lease_ttl_ms=30_000))
    await node.register(registration("sess.revoke.a2", lease_ttl_ms=30_000))
    async with aiohttp.ClientSession() as http:
        session = await open_session(node, http)
        await session.send({"t": "join", "agents": [
            {"agent_id": "sess.revoke.a1", "token": node.token("sess.revoke.a1")},
            {"agent_id": "sess.revoke.a2", "token": node.token("sess.revoke.a2")}]})
        assert (await session.next("joined"))["agents"] == ["sess.revoke.a1", "sess.revoke.a2"]
        both = [{"agent_id": "sess.revoke.a1"}, {"agent_id": "sess.revoke.a2"}]
        await session.send({"t": "renew", "id": 0, "beats": both})  # the session's tokens checked: both good
        assert set((await session.next("renewed"))["leases"]) == {"sess.revoke.a1", "sess.revoke.a2"}
        status, body = await node.call("POST", "/v1/admin/agents/sess.revoke.a1/revoke-tokens?reason=leaked")
        assert status == 200, body
        await session.send({"t": "renew", "id": 3, "beats": both})  # checked again: the deny list moved
        renewed = await session.next("renewed")
        assert renewed["errors"]["sess.revoke.a1"]["error"] == "token_revoked"
        assert set(renewed["leases"]) == {"sess.revoke.a2"}

        await session.send({"t": "renew", "id": 1, "beats": [{"agent_id": "sess.revoke.a1"},
                                                             {"agent_id": "sess.revoke.a2", "status": "busy"}]})
        renewed = await session.next("renewed")
        assert renewed["errors"]["sess.revoke.a1"]["error"] == "token_revoked"
        assert set(renewed["leases"]) == {"sess.revoke.a2"}  # its neighbour's token is good
        await session.send({"t": "renew", "id": 2, "beats": [{"agent_id": "sess.revoke.a1", "status": "busy"}]})
        assert (await session.next("renewed"))["errors"]["sess.revoke.a1"]["error"] == "token_revoked"
        await session.ws.close()


async def test_a_token_that_expires_while_its_agent_is_joined_renews_no_more(node: RunningNode) -> None:
    await node.register(registration("sess.expiry.a1", lease_ttl_ms=30_000))
    await node.register(registration("sess.expiry.a2", lease_ttl_ms=30_000))
    short = node.token("sess.expiry.a1", ttl_s=2)
    exp = node.node.signer.verify(short).exp
    async with aiohttp.ClientSession() as http:
        session = await open_session(node, http)
        await session.send({"t": "join", "agents": [{"agent_id": "sess.expiry.a1", "token": short},
                                                    {"agent_id": "sess.expiry.a2", "token": node.token("sess.expiry.a2")}]})
        assert (await session.next("joined"))["agents"] == ["sess.expiry.a1", "sess.expiry.a2"]
        both = [{"agent_id": "sess.expiry.a1"}, {"agent_id": "sess.expiry.a2"}]
        await session.send({"t": "renew", "id": 1, "beats": both})
        assert set((await session.next("renewed"))["leases"]) == {"sess.expiry.a1", "sess.expiry.a2"}
        await wait_for(lambda: time.time() > exp, timeout_s=10, message="the short token to expire")
        await session.send({"t": "renew", "id": 2, "beats": both})
        renewed = await session.next("renewed")
        assert renewed["errors"]["sess.expiry.a1"]["error"] == "token_expired"
        assert set(renewed["leases"]) == {"sess.expiry.a2"}
        await session.ws.close()
