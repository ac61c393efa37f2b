"""The node over https: ``agent-reach node --tls-cert/--tls-key`` serves TLS (≥ 1.2), the SDK and
the CLI reach it with the CA bundle they are given (``ca_file``, ``$AGENT_REACH_CA_FILE``) and are
refused without it; ``--tls-client-ca`` requires a client certificate (mutual TLS), on every worker
of ``--workers``; a certificate or key the node cannot use is one line and exit code 2. The CA and
the certificates are made in the test (:mod:`tests.certs`)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from node.client import HeartbeatStats, NodeUnreachable, ReachClient
from node.core.models import TokenRole
from node.envconfig import settings_from_env
from node.trust import Signer

from ..certs import CertificateAuthority, Issued
from ..helpers import free_port, registration, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]

SECRET = "tls-test-secret-0123456789abcdef"
ADMIN = Signer(SECRET.encode()).issue("admin", TokenRole.ADMIN, ttl_s=3600)
CAPABILITY = "tls.echo"


class Pki:
    """The test's CA, the node's certificate, an agent's client certificate and a CA nobody trusts."""

    def __init__(self, directory: Path) -> None:
        self.ca = CertificateAuthority(directory)
        self.node = self.ca.issue("node", client=False)
        self.agent = self.ca.issue("agent.client", server=False)
        self.stranger = CertificateAuthority(directory, name="stranger CA").issue("stranger", server=False)

    @property
    def ca_file(self) -> str:
        return str(self.ca.ca_file)

    def context(self, *, client: Issued | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if client is not None:
            context.load_cert_chain(client.cert_file, client.key_file)
        return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def _node_command(region: str, redis_url: str, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "topology.cli", "--log-level", "WARNING", "node", "--region", region, "--redis",
            redis_url, "--port", str(port), "--no-semantic", "--drain-grace-ms", "0", *extra]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Node processes the test starts (output in ``tmp_path``); stopped and checked for a clean exit."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _start(spawned: list[subprocess.Popen[bytes]], command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        process = subprocess.Popen(command, env={**os.environ, "AGENT_REACH_SECRET": SECRET}, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    spawned.append(process)
    return process


async def _node_id(url: str, context: ssl.SSLContext | bool) -> str | None:
    """``/healthz``'s node id over a fresh connection; None while nothing answers."""
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, force_close=True)) as session:
            async with session.get(f"{url}/healthz", timeout=aiohttp.ClientTimeout(total=5)) as response:
                return (await response.json())["node_id"] if response.status == 200 else None
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None


async def _refusal(url: str, context: ssl.SSLContext | bool) -> BaseException:
    """The error of a GET with ``context``, which the node (or the client's own check) must refuse."""
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
            async with session.get(f"{url}/healthz", timeout=aiohttp.ClientTimeout(total=5)) as response:
                await response.read()
                raise AssertionError(f"the node answered {response.status} without the right TLS")
    except (aiohttp.ClientError, OSError) as exc:
        return exc


def _handshake(port: int, context: ssl.SSLContext) -> str | None:
    """The TLS version a blocking handshake with the node agrees on (raises ``ssl.SSLError`` when refused)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as wrapped:
            return wrapped.version()


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {name: value for name, value in os.environ.items() if not name.startswith("AGENT_REACH_")}
    return subprocess.run([sys.executable, "-m", "topology.cli", *args], capture_output=True, text=True, timeout=60,
                          env={**clean, "AGENT_REACH_TOKEN": ADMIN, **env})


@pytest.fixture
async def reach_clients() -> AsyncIterator[list[ReachClient]]:
    clients: list[ReachClient] = []
    yield clients
    for client in clients:
        await client.aclose()


async def test_the_node_serves_https_that_the_sdk_and_cli_reach_with_the_ca_and_nobody_without(
        pki: Pki, redis_url: str, region: str, tmp_path: Path, spawn: list[subprocess.Popen[bytes]],
        reach_clients: list[ReachClient]) -> None:
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    log = tmp_path / "node.log"
    _start(spawn, _node_command(region, redis_url, port, "--tls-cert", str(pki.node.cert_file), "--tls-key",
                                str(pki.node.key_file), "--egress-allow", "loopback"), log)
    await wait_for(lambda: _node_id(url, pki.context()), timeout_s=60, message="the node to answer over https")
    assert f"url={url}" in log.read_text()

    # TLS 1.2 at least: a client that offers only 1.0 and 1.1 (and would take them) is refused by the node
    old = pki.context()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version, old.maximum_version = ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    with pytest.raises((ssl.SSLError, ConnectionResetError)):  # the node's asyncio ends it without an alert
        await asyncio.to_thread(_handshake, port, old)
    assert await asyncio.to_thread(_handshake, port, pki.context()) in ("TLSv1.2", "TLSv1.3")
    # a client with the system's store (or another CA) refuses the node's certificate itself
    assert isinstance(await _refusal(url, True), aiohttp.ClientConnectorCertificateError)
    assert isinstance(await _refusal(url, ssl.create_default_context(cafile=str(pki.stranger.cert_file))),
                      aiohttp.ClientConnectorCertificateError)

    # the SDK with ca_file: registers, heartbeats on its own thread, resolves and verifies the keys
    agent = ReachClient(url, token=ADMIN, ca_file=pki.ca_file, heartbeat_interval_ms=100,
                        registration=registration("tls.agent.a1", capability=CAPABILITY, lease_ttl_ms=60_000))
    reach_clients.append(agent)
    await agent.start()
    ticket = await agent.resolve(CAPABILITY)
    assert ticket.target.agent_id == "tls.agent.a1"
    await wait_for(lambda: (agent.heartbeat_stats or HeartbeatStats()).sent >= 2, message="heartbeats over https")
    verifier = agent.call_verifier()
    try:  # the called agent's side: the region's key set, fetched over https
        claims = await verifier.verify(f"Bearer {ticket.target.credential}")
        assert (claims.aud, claims.sub) == ("tls.agent.a1", "admin")
        assert verifier.fetches == 1
    finally:
        await verifier.aclose()

    # the SDK without a CA: refused by its own verification, saying how to fix it
    stranger = ReachClient(url, token=ADMIN, register_max_wait_ms=0,
                           registration=registration("tls.agent.b1", capability=CAPABILITY))
    reach_clients.append(stranger)
    with pytest.raises(NodeUnreachable, match="ca_file"):
        await stranger.start()

    # the CLI: $AGENT_REACH_CA_FILE, else a one-line refusal (exit 3)
    listed = _cli("agents", "list", "--node", url, "--json", env={"AGENT_REACH_CA_FILE": pki.ca_file})
    assert listed.returncode == 0, listed.stderr
    assert "tls.agent.a1" in listed.stdout
    refused = _cli("agents", "list", "--node", url, env={})
    assert refused.returncode == 3, (refused.returncode, refused.stderr)
    assert "certificate is not trusted" in refused.stderr and "AGENT_REACH_CA_FILE" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    missing = _cli("agents", "list", "--node", url, env={"AGENT_REACH_CA_FILE": str(tmp_path / "no-such.pem")})
    assert missing.returncode == 2 and "AGENT_REACH_CA_FILE" in missing.stderr, missing.stderr


async def test_with_a_client_ca_every_worker_requires_a_client_certificate(
        pki: Pki, redis_url: str, region: str, tmp_path: Path, spawn: list[subprocess.Popen[bytes]],
        reach_clients: list[ReachClient]) -> None:
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    _start(spawn, _node_command(region, redis_url, port, "--tls-cert", str(pki.node.cert_file), "--tls-key",
                                str(pki.node.key_file), "--tls-client-ca", pki.ca_file, "--workers", "2",
                                "--egress-allow", "loopback"),
           tmp_path / "node.log")
    with_cert = pki.context(client=pki.agent)

    async def both_workers() -> bool:
        seen = {await _node_id(url, with_cert) for _ in range(20)}
        return len(seen - {None}) == 2

    await wait_for(both_workers, timeout_s=90, message="both workers to answer over mutual TLS")

    # no certificate, or one of a CA the node does not trust: the handshake fails, nothing is answered
    assert isinstance(await _refusal(url, pki.context()), aiohttp.ClientError)
    assert isinstance(await _refusal(url, pki.context(client=pki.stranger)), aiohttp.ClientError)

    agent = ReachClient(url, token=ADMIN, ca_file=pki.ca_file, client_cert_file=str(pki.agent.cert_file),
                        client_key_file=str(pki.agent.key_file),
                        registration=registration("tls.mutual.a1", capability=CAPABILITY, lease_ttl_ms=60_000))
    reach_clients.append(agent)
    await agent.start()
    assert (await agent.resolve(CAPABILITY)).target.agent_id == "tls.mutual.a1"
    without = ReachClient(url, token=ADMIN, ca_file=pki.ca_file, register_max_wait_ms=0,
                          registration=registration("tls.mutual.b1", capability=CAPABILITY))
    reach_clients.append(without)
    with pytest.raises(NodeUnreachable):
        await without.start()

    tls_env = {"AGENT_REACH_CA_FILE": pki.ca_file, "AGENT_REACH_CLIENT_CERT_FILE": str(pki.agent.cert_file),
               "AGENT_REACH_CLIENT_KEY_FILE": str(pki.agent.key_file)}
    listed = _cli("agents", "list", "--node", url, "--json", env=tls_env)
    assert listed.returncode == 0, listed.stderr
    assert "tls.mutual.a1" in listed.stdout
    refused = _cli("agents", "list", "--node", url, env={"AGENT_REACH_CA_FILE": pki.ca_file})
    assert refused.returncode == 3, (refused.returncode, refused.stderr)


@pytest.mark.parametrize("case", ["missing certificate", "key of another certificate", "certificate alone",
                                  "client CA that is no CA bundle"])
async def test_a_certificate_or_key_the_node_cannot_use_is_one_line_and_exit_2(
        pki: Pki, redis_url: str, region: str, tmp_path: Path, case: str) -> None:
    node, other = pki.node, pki.agent
    flags = {
        "missing certificate": ["--tls-cert", str(tmp_path / "absent.crt"), "--tls-key", str(node.key_file)],
        "key of another certificate": ["--tls-cert", str(node.cert_file), "--tls-key", str(other.key_file)],
        "certificate alone": ["--tls-cert", str(node.cert_file)],
        "client CA that is no CA bundle": ["--tls-cert", str(node.cert_file), "--tls-key", str(node.key_file),
                                           "--tls-client-ca", str(node.key_file)],
    }[case]
    expected = {"missing certificate": "no such file", "key of another certificate": "KEY_VALUES_MISMATCH",
                "certificate alone": "tls_cert_file needs tls_key_file",
                "client CA that is no CA bundle": "tls_client_ca_file"}[case]
    started = time.monotonic()
    # --workers 2: the parent refuses before any worker starts (no worker restarted in a loop)
    done = subprocess.run(_node_command(region, redis_url, free_port(), *flags, "--workers", "2"),
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AGENT_REACH_SECRET": SECRET})
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "workers (pids" not in done.stdout
    assert time.monotonic() - started < 60


async def test_tls_settings_come_from_the_environment_as_every_node_setting() -> None:
    assert settings_from_env({"AGENT_REACH_TLS_CERT_FILE": "/etc/n.crt", "AGENT_REACH_TLS_KEY_FILE": "/etc/n.key",
                              "AGENT_REACH_TLS_CLIENT_CA_FILE": "/etc/ca.pem",
                              "AGENT_REACH_CA_FILE": "/etc/ca.pem"}) == {
        "tls_cert_file": "/etc/n.crt", "tls_key_file": "/etc/n.key", "tls_client_ca_file": "/etc/ca.pem",
        "ca_file": "/etc/ca.pem"}
