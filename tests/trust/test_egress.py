"""The egress policy: what the node itself contacts (proxy deliveries, callbacks, probes), on real sockets.

Every server here is a real HTTP/1.1 listener on 127.0.0.1 that counts TCP connections, so "never
connected" is checked at the socket, not inferred from a missing request.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult
from pydantic import ValidationError

from node.config import NodeConfig, ProxySettings
from node.core.models import Registration
from node.service import RegistryNode
from node.trust import EgressDenied, EgressPolicy, egress_denial, egress_session
from node.trust.egress import EgressConnector
from topology import TopologyError, load_topology

from ..conftest import TEST_SECRET, NodeFactory
from ..helpers import RunningNode, registration, start_node, wait_for

Responder = Callable[["Listener", asyncio.StreamWriter], Awaitable[None]]


class Listener:
    """A real HTTP/1.1 server on 127.0.0.1: counts connections, records requests, answers as told."""

    def __init__(self, responder: Responder | None = None) -> None:
        self.responder = responder or answer(b'{"ok": true}')
        self.connections = 0
        self.requests: list[tuple[str, bytes]] = []
        self.sent = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Listener:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n")
                           if line.lower().startswith("content-length:")), 0)
            self.requests.append((head, await reader.readexactly(length)))
            await self.responder(self, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away, which is what some tests want
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def answer(body: bytes, *, status: str = "200 OK", headers: str = "Content-Type: application/json\r\n"
           ) -> Responder:
    async def respond(listener: Listener, writer: asyncio.StreamWriter) -> None:
        writer.write(f"HTTP/1.1 {status}\r\n{headers}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                     .encode() + body)
        await writer.drain()
        listener.sent += len(body)
    return respond


def stream(total_bytes: int, *, chunk_bytes: int = 64 * 1024) -> Responder:
    """A chunked answer of ``total_bytes`` with no Content-Length; stops when the client hangs up."""
    async def respond(listener: Listener, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        chunk = b"x" * chunk_bytes
        while listener.sent < total_bytes:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            listener.sent += len(chunk)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    return respond


async def send(node: RunningNode, envelope: dict[str, Any], *, token: str, delivery: str = "sync"
               ) -> tuple[int, Any]:
    return await node.call("POST", f"/v1/send?delivery={delivery}", json=envelope, token=token)


# -- the policy, statically ------------------------------------------------------------------

PUBLIC_ONLY = EgressPolicy()
LOOPBACK_OK = EgressPolicy(allow=["loopback"])
NARROW = EgressPolicy(allow=["10.1.0.0/16", "loopback"], deny=["127.0.0.2/32", "203.0.113.0/24"])

# (url, rule under PUBLIC_ONLY, rule under LOOPBACK_OK); None = allowed
TABLE: list[tuple[str, str | None, str | None]] = [
    ("http://93.184.216.34/", None, None),
    ("https://example.com/x", None, None),
    ("http://bücher.example/", None, None),
    ("http://my_host.internal:8080/", None, None),               # names pass: connect time checks their addresses
    ("http://[2606:4700::1111]/", None, None),
    ("http://127.0.0.1:6379/", "loopback", None),
    ("http://127.8.9.10/", "loopback", None),
    ("http://[::1]:8080/", "loopback", None),
    ("http://[::ffff:127.0.0.1]/", "loopback", None),            # IPv4-mapped follows loopback's rule
    ("http://[::127.0.0.1]/", "loopback", None),                 # IPv4-compatible
    ("http://[64:ff9b::7f00:1]/", "loopback", None),             # NAT64
    ("http://[2002:7f00:1::]/", "loopback", None),               # 6to4
    ("http://localhost:7070/", "loopback", None),
    ("http://LOCALHOST./", "loopback", None),
    ("http://api.localhost/", "loopback", None),
    ("http://10.0.0.5/", "private", "private"),
    ("http://172.16.0.1/", "private", "private"),
    ("http://192.168.1.1/", "private", "private"),
    ("http://100.64.0.1/", "private", "private"),                # CGNAT
    ("http://[fd12::1]/", "private", "private"),
    ("http://[::ffff:10.0.0.5]/", "private", "private"),
    ("http://169.254.169.254/latest/meta-data/", "metadata", "metadata"),
    ("http://[::ffff:169.254.169.254]/", "metadata", "metadata"),
    ("http://[::ffff:a9fe:a9fe]/", "metadata", "metadata"),
    ("http://[fd00:ec2::254]/", "metadata", "metadata"),
    ("http://100.100.100.200/", "metadata", "metadata"),
    ("http://metadata.google.internal/computeMetadata/v1/", "metadata", "metadata"),
    ("http://METADATA/", "metadata", "metadata"),
    ("http://metadata.azure.com/", "metadata", "metadata"),
    ("http://instance-data.ec2.internal/", "metadata", "metadata"),
    ("http://169.254.1.1/", "link-local", "link-local"),
    ("http://[fe80::1]/", "link-local", "link-local"),
    ("http://[fe80::1%25eth0]/", "link-local", "link-local"),
    ("http://0.0.0.0:6379/", "unspecified", "unspecified"),
    ("http://[::]/", "unspecified", "unspecified"),
    ("http://224.0.0.1/", "multicast", "multicast"),
    ("http://[ff02::1]/", "multicast", "multicast"),
    ("http://255.255.255.255/", "broadcast", "broadcast"),
    ("http://240.0.0.1/", "reserved", "reserved"),
    # spellings libc reads as 127.0.0.1 (or 0.0.0.0): refused outright, whatever the policy
    ("http://0x7f000001/", "non-canonical-ipv4", "non-canonical-ipv4"),
    ("http://2130706433/", "non-canonical-ipv4", "non-canonical-ipv4"),
    ("http://017700000001/", "non-canonical-ipv4", "non-canonical-ipv4"),
    ("http://127.1/", "non-canonical-ipv4", "non-canonical-ipv4"),
    ("http://0177.0.0.1/", "non-canonical-ipv4", "non-canonical-ipv4"),
    ("http://127.000.000.001/", "non-canonical-ipv4", "non-canonical-ipv4"),
    ("http://0/", "non-canonical-ipv4", "non-canonical-ipv4"),
    ("http://%31%32%37.0.0.1/", "invalid-host", "invalid-host"),
    ("http://user:pass@example.com/", "userinfo", "userinfo"),
    ("http://user@127.0.0.1/", "userinfo", "userinfo"),
    ("http://@example.com/", "userinfo", "userinfo"),
    ("http://1.2.3.4:80@127.0.0.1/", "userinfo", "userinfo"),
    ("ftp://example.com/", "scheme", "scheme"),
    ("file:///etc/passwd", "scheme", "scheme"),
    ("gopher://127.0.0.1:6379/_INFO", "scheme", "scheme"),
    ("http://[::1/", "invalid-url", "invalid-url"),
]


@pytest.mark.unit
@pytest.mark.parametrize(("url", "public_only", "loopback_ok"), TABLE, ids=[row[0] for row in TABLE])
def test_the_policy_table(url: str, public_only: str | None, loopback_ok: str | None) -> None:
    for policy, expected in ((PUBLIC_ONLY, public_only), (LOOPBACK_OK, loopback_ok)):
        if expected is None:
            policy.check_url(url)
            continue
        with pytest.raises(EgressDenied) as caught:
            policy.check_url(url)
        denied = caught.value
        assert denied.rule == expected, (url, policy, denied.message)
        assert denied.code == "egress_denied" and denied.status == 422
        assert denied.details == {"address": denied.address, "rule": expected}


@pytest.mark.unit
def test_messages_name_the_address_and_the_rule() -> None:
    with pytest.raises(EgressDenied) as caught:
        LOOPBACK_OK.check_url("http://169.254.169.254/")
    assert caught.value.message == ("169.254.169.254 is a cloud metadata address; "
                                    "the region's egress policy never allows it")
    with pytest.raises(EgressDenied) as caught:
        PUBLIC_ONLY.check_url("http://[::ffff:127.0.0.1]:6379/")
    assert "carries 127.0.0.1) is loopback" in caught.value.message
    assert 'add "loopback"' in caught.value.message
    with pytest.raises(EgressDenied) as caught:
        PUBLIC_ONLY.check_url("http://0x7f000001/")
    assert "write it as 127.0.0.1" in caught.value.message
    with pytest.raises(EgressDenied) as caught:
        PUBLIC_ONLY.check_url("http://admin:secret@example.com/")
    assert "secret" not in caught.value.message and "secret" not in caught.value.address


@pytest.mark.unit
def test_allow_ranges_and_the_deny_list() -> None:
    NARROW.check_ip("10.1.2.3")
    NARROW.check_ip("127.0.0.1")
    NARROW.check_ip("8.8.8.8")
    for address, rule in (("10.2.0.1", "private"), ("127.0.0.2", "deny-list"), ("203.0.113.9", "deny-list"),
                          ("::ffff:127.0.0.2", "deny-list"), ("169.254.169.254", "metadata")):
        with pytest.raises(EgressDenied) as caught:
            NARROW.check_ip(address)
        assert caught.value.rule == rule, address
    # "private" opens the private ranges, never the metadata addresses inside them
    everything_internal = EgressPolicy(allow=["private", "loopback"])
    everything_internal.check_url("http://10.0.0.5/")
    for url in ("http://[fd00:ec2::254]/", "http://100.100.100.200/"):
        with pytest.raises(EgressDenied):
            everything_internal.check_url(url)
    # deny wins over allow
    with pytest.raises(EgressDenied):
        EgressPolicy(allow=["private"], deny=["private"]).check_url("http://10.0.0.5/")


@pytest.mark.unit
@pytest.mark.parametrize(("settings", "says"), [
    ({"allow": ["lo"]}, "neither a group"),
    ({"allow": ["10.0.0.1/8"]}, "did you mean 10.0.0.0/8"),
    ({"allow": ["169.254.0.0/16"]}, "never allows"),
    ({"allow": ["8.8.8.0/24"]}, "is public"),
    ({"deny": ["nonsense"]}, "neither a group"),
    ({"allow_all": True}, "Extra inputs"),
])
def test_a_bad_policy_is_refused_when_built(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        EgressPolicy(**settings)
    assert says in str(caught.value)


@pytest.mark.unit
def test_check_registration_names_the_field() -> None:
    def build(**extra: Any) -> Registration:
        return Registration.model_validate(registration("egress.reg.p1", endpoint="http://127.0.0.1:9000", **extra))

    probe = {"url": "http://127.0.0.1:9000/readyz"}
    assert LOOPBACK_OK.check_registration(build(callback_endpoint="http://localhost:9000/cb",
                                                readiness_probe=probe, liveness_probe=probe)) is None
    # endpoints: any scheme (callers dial them), but the host rules apply
    assert LOOPBACK_OK.check_registration(build(endpoints={"primary": "grpc://127.0.0.1:50051"})) is None
    cases = [
        (PUBLIC_ONLY, {}, "endpoints.primary", "loopback"),
        (LOOPBACK_OK, {"endpoints": {"primary": "http://127.0.0.1:1", "admin": "ws://169.254.169.254/"}},
         "endpoints.admin", "metadata"),
        (LOOPBACK_OK, {"endpoints": {"primary": "http://u:p@127.0.0.1:1/"}}, "endpoints.primary", "userinfo"),
        (LOOPBACK_OK, {"callback_endpoint": "http://user:pw@example.com/cb"}, "callback_endpoint", "userinfo"),
        (LOOPBACK_OK, {"callback_endpoint": "http://10.0.0.9/cb"}, "callback_endpoint", "private"),
        (LOOPBACK_OK, {"readiness_probe": {"url": "http://0x7f000001/readyz"}}, "readiness_probe.url",
         "non-canonical-ipv4"),
        (LOOPBACK_OK, {"liveness_probe": {"url": "http://metadata.google.internal/"}}, "liveness_probe.url",
         "metadata"),
    ]
    for policy, extra, field, rule in cases:
        denied = policy.check_registration(build(**extra))
        assert denied is not None, extra
        assert (denied.field, denied.rule, denied.status) == (field, rule, 422), extra
        assert denied.body()["error"] == "egress_denied" and denied.body()["field"] == field
        assert denied.message.startswith(f"{field}: ")


@pytest.mark.unit
def test_topology_maps_the_region_policy_to_node_config(tmp_path: Path) -> None:
    packaged = load_topology()
    for region in packaged.regions:
        config = packaged.node_config(region.name, redis_url="redis://127.0.0.1:1/0")
        assert config.egress == EgressPolicy(allow=["loopback"])  # everything runs on one machine
    file = tmp_path / "t.toml"
    file.write_text('[node]\negress = { allow = ["private"] }\n'
                    '[[regions]]\nname = "a"\nnode_urls = ["http://127.0.0.1:7301"]\n'
                    'policy = { egress = { allow = ["loopback", "10.1.0.0/16"], deny = ["10.1.9.0/24"] } }\n'
                    '[[regions]]\nname = "b"\nnode_urls = ["http://127.0.0.1:7302"]\n')
    topology = load_topology(file)
    assert topology.node_config("a", redis_url="redis://x:1/0").egress == \
        EgressPolicy(allow=["loopback", "10.1.0.0/16"], deny=["10.1.9.0/24"])
    assert topology.node_config("b", redis_url="redis://x:1/0").egress == EgressPolicy(allow=["private"])
    assert NodeConfig(region="c", redis_url="redis://x:1/0").egress == EgressPolicy()  # public only
    file.write_text('[[regions]]\nname = "a"\nnode_urls = ["http://127.0.0.1:7301"]\n'
                    'policy = { egress = { allow = ["169.254.169.254/32"] } }\n')
    with pytest.raises(TopologyError, match=r"regions\[0\]\.policy\.egress\.allow: .*never allows"):
        load_topology(file)


# -- at connect time ---------------------------------------------------------------------------


class RebindingDNS(AbstractResolver):
    """An attacker's DNS: the name passed the static check, and now it answers a loopback address."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        self.asked.append(host)
        return [ResolveResult(hostname=host, host=self.address, port=port, family=socket.AF_INET, proto=0,
                              flags=socket.AI_NUMERICHOST)]

    async def close(self) -> None:
        return None


async def test_a_name_that_resolves_to_a_denied_address_is_refused_at_connect_time() -> None:
    listener = await Listener().start()
    try:
        url = f"http://agent.rebind.example:{listener.port}/invoke"
        PUBLIC_ONLY.check_url(url)  # nothing to object to before DNS
        dns = RebindingDNS("127.0.0.1")
        async with aiohttp.ClientSession(connector=EgressConnector(PUBLIC_ONLY, resolver=dns)) as session:
            with pytest.raises(aiohttp.ClientConnectorError) as caught:
                async with session.get(url):
                    pass
        denied = egress_denial(caught.value)
        assert denied is not None and denied.rule == "loopback"
        assert denied.message.startswith("agent.rebind.example resolves to 127.0.0.1: 127.0.0.1 is loopback")
        assert dns.asked == ["agent.rebind.example"] and listener.connections == 0
        # the same name, DNS and listener with loopback allowed: connected — the policy refused, nothing else
        async with aiohttp.ClientSession(connector=EgressConnector(LOOPBACK_OK, resolver=RebindingDNS("127.0.0.1"))
                                         ) as session:
            async with session.get(url) as response:
                assert response.status == 200
        assert listener.connections == 1
    finally:
        await listener.aclose()


async def test_the_dialled_socket_address_is_checked_for_literals_and_real_dns() -> None:
    listener = await Listener().start()
    try:
        async with egress_session(PUBLIC_ONLY) as session:
            # straight to the connector, past any static check: its socket_factory has the last word
            for url, rule in ((f"{listener.url}/", "loopback"),
                              (f"http://[::ffff:127.0.0.1]:{listener.port}/", "loopback"),
                              (f"http://localhost:{listener.port}/", "loopback"),       # the real resolver
                              (f"http://0x7f000001:{listener.port}/", "non-canonical-ipv4")):
                with pytest.raises(aiohttp.ClientConnectorError) as caught:
                    async with session.get(url):
                        pass
                denied = egress_denial(caught.value)
                assert denied is not None and denied.rule == rule, (url, caught.value)
        assert listener.connections == 0
        async with egress_session(LOOPBACK_OK) as session:
            for url in (f"{listener.url}/", f"http://localhost:{listener.port}/"):
                async with session.get(url) as response:
                    assert response.status == 200
        assert listener.connections == 2
    finally:
        await listener.aclose()


# -- proxy deliveries and callbacks ------------------------------------------------------------


async def test_a_send_to_a_loopback_agent_is_refused_under_a_public_only_policy(node_factory: NodeFactory) -> None:
    # Two replicas of one region: the permissive one takes the registrations (as a region whose
    # policy was tightened afterwards would have them); the public-only one must refuse to deliver.
    permissive = await node_factory()
    strict = await node_factory(egress={})
    agent = await Listener().start()
    try:
        await permissive.register(registration("egress.loop.p1", capability="egress.literal",
                                               endpoint=f"{agent.url}/invoke"))
        await permissive.register(registration("egress.loop.p2", capability="egress.named",
                                               endpoint=f"http://localhost:{agent.port}/invoke"))
        await wait_for(lambda: strict.node.cache.index.get("egress.loop.p2"), message="the replica to see both")
        token = strict.token("app.caller.one")
        for capability, address in (("egress.literal", "127.0.0.1"), ("egress.named", "localhost")):
            status, body = await send(strict, {"operation": capability, "payload": {"x": 1}}, token=token)
            assert status == 502 and body["error"] == "delivery_failed", body
            [attempt] = body["details"]["attempts"]
            assert attempt["reason"] == "egress_denied"
            assert attempt["egress"] == {"address": address, "rule": "loopback"}
            assert attempt["error"].startswith(f"egress_denied: {address} is ")
        assert agent.connections == 0
        # the permissive replica delivers the same agent: it is the policy that refused
        status, body = await send(permissive, {"operation": "egress.literal", "payload": {"x": 1}},
                                  token=permissive.token("app.caller.one"))
        assert status == 200 and body == {"ok": True}
        assert agent.connections == 1
    finally:
        await agent.aclose()


async def test_userinfo_never_becomes_an_authorization_header(node: RunningNode) -> None:
    agent = await Listener().start()
    try:
        status, body = await node.call("POST", "/v1/agents", json=registration(
            "egress.creds.p1", capability="egress.creds", endpoint=f"http://admin:hunter2@127.0.0.1:{agent.port}/"))
        if status == 422:  # the registration check refuses it first: that is the same defence
            assert body["error"] == "egress_denied" and body["field"] == "endpoints.primary", body
        else:
            assert status in (200, 201), body
            status, body = await send(node, {"operation": "egress.creds", "payload": {}},
                                      token=node.token("app.caller.one"))
            assert status == 502 and body["details"]["attempts"][0]["egress"]["rule"] == "userinfo", body
            assert "hunter2" not in str(body)
        assert agent.connections == 0 and not agent.requests
    finally:
        await agent.aclose()


async def test_a_redirect_is_never_followed(node: RunningNode) -> None:
    second = await Listener().start()
    first = await Listener(answer(b"", status="307 Temporary Redirect",
                                  headers=f"Location: {second.url}/steal\r\n")).start()
    try:
        await node.register(registration("egress.redirect.p1", capability="egress.redirect",
                                         endpoint=f"{first.url}/invoke"))
        status, body = await send(node, {"operation": "egress.redirect", "payload": {"card_number": 1}},
                                  token=node.token("app.caller.one"))
        assert status == 502 and body["error"] == "delivery_failed", body
        [attempt] = body["details"]["attempts"]
        assert attempt["status"] == 307 and "never follows redirects" in attempt["error"]
        assert len(first.requests) == 1
        assert second.connections == 0  # the body was not re-posted to the redirect's target
    finally:
        await first.aclose()
        await second.aclose()


async def test_an_answer_beyond_the_size_cap_fails_the_attempt(redis_url: str, region: str) -> None:
    cap = 64 * 1024
    node = RegistryNode(NodeConfig(region=region, redis_url=redis_url, port=0, egress={"allow": ["loopback"]},
                                   proxy=ProxySettings(max_response_bytes=cap)), secret=TEST_SECRET)
    running = await start_node(node)
    total = 64 * 1024 * 1024
    endless = await Listener(stream(total)).start()
    declared = await Listener(answer(b"y" * (cap + 1))).start()
    fitting = await Listener(answer(b"z" * cap, headers="Content-Type: application/octet-stream\r\n")).start()
    try:
        for name, listener in (("endless", endless), ("declared", declared), ("fitting", fitting)):
            await running.register(registration(f"egress.big.{name}", capability=f"egress.{name}",
                                                endpoint=f"{listener.url}/invoke"))
        token = running.token("app.caller.one")
        for name in ("endless", "declared"):
            status, body = await send(running, {"operation": f"egress.{name}", "payload": {}}, token=token)
            assert status == 502, body
            assert f"exceeds the proxy's limit of {cap} bytes" in body["details"]["attempts"][0]["error"]
        # the node hung up instead of reading on: the stream never got to its end
        await wait_for(lambda: endless.connections == 1 and endless.sent < total, message="the stream cut short")
        status, body = await send(running, {"operation": "egress.fitting", "payload": {}}, token=token)
        assert status == 200 and body == "z" * cap
    finally:
        await running.aclose()
        for listener in (endless, declared, fitting):
            await listener.aclose()


async def test_a_callback_to_a_denied_address_is_never_connected(node_factory: NodeFactory) -> None:
    permissive = await node_factory()
    strict = await node_factory(egress={})
    target, callback = await Listener().start(), await Listener().start()
    try:
        await permissive.register(registration("egress.cb.target", capability="egress.cb", endpoint=target.url))
        await permissive.register(registration("egress.cb.caller", capability="egress.caller",
                                               endpoint="http://127.0.0.1:9",
                                               callback_endpoint=f"{callback.url}/results"))
        await wait_for(lambda: strict.node.find("egress.cb.caller"), message="the replica to see the caller")
        status, body = await send(strict, {"operation": "egress.cb", "payload": {}, "trace_id": "trace-egress-cb"},
                                  token=strict.token("egress.cb.caller"), delivery="callback")
        assert status == 202, body

        async def callback_events() -> list[dict[str, Any]]:
            status, trace = await strict.call("GET", "/v1/traces/trace-egress-cb")
            return [e for e in trace.get("events", []) if e["event"] == "callback"] if status == 200 else []

        [event] = await wait_for(callback_events, message="the callback attempt in the trace")
        assert event["result"] == "failure" and event["detail"].startswith("egress_denied: 127.0.0.1 is loopback")
        assert callback.connections == 0 and target.connections == 0
        assert len(await callback_events()) == 1  # a denial is not retried
    finally:
        await target.aclose()
        await callback.aclose()


# -- probes ------------------------------------------------------------------------------------


async def test_probes_of_a_denied_address_are_never_connected(node_factory: NodeFactory) -> None:
    # The public-only node leads (its prober runs); a long lease keeps it leading for the whole test.
    strict = await node_factory(egress={}, leader_ttl_ms=30_000)
    await wait_for(lambda: strict.node.leadership.is_leader, message="the strict node to lead")
    permissive = await node_factory(leader_ttl_ms=30_000)
    listener = await Listener().start()
    try:
        probe = {"url": f"{listener.url}/healthz", "interval_ms": 100, "failure_threshold": 2, "success_threshold": 1}
        await permissive.register(registration("egress.probe.p1", capability="egress.probe",
                                               endpoint="http://127.0.0.1:9", liveness_probe=probe))

        async def down() -> dict[str, Any] | None:
            status, record = await strict.call("GET", "/v1/agents/egress.probe.p1")
            return record if status == 200 and record.get("live") is False else None

        record = await wait_for(down, message="the agent marked down by denied probes")
        assert record["probe_error"].startswith("liveness probe not sent: egress_denied: 127.0.0.1 is loopback")
        assert "egress_denied" in (strict.node.prober.last_error("egress.probe.p1", "liveness") or "")
        assert strict.node.prober.probes_run >= 2
        assert listener.connections == 0
        assert strict.node.leadership.is_leader and not permissive.node.leadership.is_leader
    finally:
        await listener.aclose()
