"""Federation over the Kafka operators run: TLS, mutual TLS, SASL PLAIN and SCRAM, real sockets.

The embedded broker serves neither TLS nor usable SASL, so ``KafkaGateway`` (real TLS from the
``ssl`` module, the server's side of the SASL exchange, certificates made per test) stands in
front of it, and the broker advertises the gateway's address. Every wrong setting ends in one
``KafkaAccessDenied`` line naming what failed; the password shows nowhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from federation import FederationConfig, PeerConfig
from federation.errors import (
    KafkaAuthenticationFailed,
    KafkaHandshakeFailed,
    KafkaNotAuthorized,
    KafkaSettingsInvalid,
)
from federation.kafka import check_access
from federation.security import KafkaSecurity
from topology import Topology
from topology.embedded import EmbeddedKafka
from topology.spec import KafkaSpec

from ..conftest import TEST_SECRET
from ..helpers import Pair, free_port, registration, wait_for
from .kafka_gateway import Certificates, KafkaGateway, make_certificates, server_context

pytestmark = pytest.mark.timeout(120)

PASSWORD = "correct-horse-battery-staple-7"
USER = "agent-reach"
PASSWORD_ENV = "TEST_KAFKA_PASSWORD"
GatewayFactory = Callable[..., contextlib.AbstractAsyncContextManager[KafkaGateway]]


@pytest.fixture
def certificates(tmp_path: Path) -> Certificates:
    return make_certificates(tmp_path)


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "kafka-password"
    path.write_text(PASSWORD + "\n")
    return path


@pytest.fixture
def gateway() -> GatewayFactory:
    """``async with gateway(tls=…, users=…) as g``: an embedded broker advertising ``g``'s port, behind ``g``."""

    @contextlib.asynccontextmanager
    async def start(**options: Any) -> AsyncIterator[KafkaGateway]:
        # The gateway listens first, on a port of the kernel's choosing, and the broker advertises
        # it: a port found free and bound later was once taken in between (EADDRINUSE).
        async with KafkaGateway(port=0, broker_port=0, **options) as front, \
                EmbeddedKafka(advertised_port=front.port) as kafka:
            front.broker_port = kafka.port
            yield front

    return start


def _config(region: str, servers: str, **security: Any) -> FederationConfig:
    peer = PeerConfig(region=f"{region}-peer", node_urls=["http://127.0.0.1:9"])
    return FederationConfig(region=region, peers=[peer],
                            bootstrap_servers=servers, topic_prefix=f"sec-{region}", request_timeout_ms=3_000,
                            security=KafkaSecurity(**security))


def _secured(pair: Pair, **security: Any) -> None:
    """The pair's topology with ``security`` in its ``[kafka]`` section, as an operator writes it."""
    kafka = KafkaSpec(**{**pair.topology.kafka.model_dump(exclude_none=True), **security})
    pair.topology = Topology.model_validate({**pair.topology.model_dump(exclude_none=True),
                                             "kafka": kafka.model_dump(exclude_none=True)})


async def _events_flow(pair: Pair, agent_id: str) -> dict[str, Any]:
    """Start both regions; an agent registered in x reaches y over Kafka; returns y's federation status."""
    x, y = pair.names
    node_x, _ = await pair.start(x)
    node_y, federation_y = await pair.start(y)
    await node_x.register(registration(agent_id, lease_ttl_ms=600_000))
    await wait_for(lambda: federation_y.catalog.peer(x).index.get(agent_id), timeout_s=20,
                   message=f"{agent_id} replicated from {x} to {y} through the gateway")
    assert federation_y.consumer.stats.applied + federation_y.anti_entropy.stats.runs >= 1
    status, answer = await node_y.call("GET", "/v1/federation/status")
    assert status == 200
    return answer


async def test_federation_events_flow_over_tls(redis_url: str, region: str, gateway: GatewayFactory,
                                               certificates: Certificates) -> None:
    async with gateway(tls=server_context(certificates)) as front:
        pair = Pair(redis_url, region, front.bootstrap_servers, secret=TEST_SECRET)
        _secured(pair, security_protocol="SSL", ssl_cafile=str(certificates.ca))
        try:
            status = await _events_flow(pair, "tls.agent.one")
        finally:
            await pair.aclose()
        assert front.relayed >= 2  # both regions' clients went through the TLS listener
        assert status["kafka"]["security_protocol"] == "SSL"
        assert status["consumer"]["failures"] == 0 and status["publisher"]["failures"] == 0


async def test_federation_events_flow_over_mutual_tls(redis_url: str, region: str, gateway: GatewayFactory,
                                                      certificates: Certificates) -> None:
    async with gateway(tls=server_context(certificates, require_client_certificate=True)) as front:
        pair = Pair(redis_url, region, front.bootstrap_servers, secret=TEST_SECRET)
        _secured(pair, security_protocol="SSL", ssl_cafile=str(certificates.ca),
                 ssl_certfile=str(certificates.client_cert), ssl_keyfile=str(certificates.client_key))
        try:
            await _events_flow(pair, "mtls.agent.one")
        finally:
            await pair.aclose()
        assert front.relayed >= 2


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_federation_events_flow_over_sasl_ssl(redis_url: str, region: str, gateway: GatewayFactory,
                                                    certificates: Certificates, password_file: Path,
                                                    mechanism: str, caplog: pytest.LogCaptureFixture) -> None:
    """SASL_SSL with each mechanism; everything logged at DEBUG (aiokafka's SASL requests too), the
    federation status and the config's repr hold the user name but never the password."""
    caplog.set_level(logging.DEBUG)
    async with gateway(tls=server_context(certificates), users={USER: PASSWORD}) as front:
        pair = Pair(redis_url, region, front.bootstrap_servers, secret=TEST_SECRET)
        _secured(pair, security_protocol="SASL_SSL", sasl_mechanism=mechanism, sasl_username=USER,
                 sasl_password_file=str(password_file), ssl_cafile=str(certificates.ca))
        try:
            status = await _events_flow(pair, f"sasl.ssl.{mechanism.lower()}")
            config = pair.topology.federation_config(pair.names[0])
        finally:
            await pair.aclose()
        assert front.authenticated.count(USER) >= 2 and front.refused == 0
    assert status["kafka"]["sasl_username"] == USER and status["kafka"]["sasl_password"] == "***"
    assert "SaslAuthenticateRequest" in caplog.text  # aiokafka did log the exchange, masked
    options = config.security.client_options()
    for shown in (caplog.text, str(status), repr(config), config.model_dump_json(), repr(options)):
        assert PASSWORD not in shown


async def test_federation_events_flow_over_sasl_plaintext_with_the_password_from_the_environment(
        redis_url: str, region: str, gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    async with gateway(users={USER: PASSWORD}, mechanisms=("SCRAM-SHA-256",)) as front:
        pair = Pair(redis_url, region, front.bootstrap_servers, secret=TEST_SECRET)
        _secured(pair, security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256", sasl_username=USER,
                 sasl_password_env=PASSWORD_ENV)
        try:
            await _events_flow(pair, "sasl.plaintext.env")
        finally:
            await pair.aclose()
        assert USER in front.authenticated


async def test_a_wrong_ca_is_one_line_naming_the_certificate_check(region: str, gateway: GatewayFactory,
                                                                   certificates: Certificates) -> None:
    async with gateway(tls=server_context(certificates)) as front:
        config = _config(region, front.bootstrap_servers, security_protocol="SSL",
                         ssl_cafile=str(certificates.other_ca))
        with pytest.raises(KafkaHandshakeFailed) as failed:
            await check_access(config)
    message = str(failed.value)
    assert "\n" not in message and f"TLS handshake with Kafka broker {front.bootstrap_servers} failed" in message
    assert "certificate verify failed" in message and str(certificates.other_ca) in message


async def test_a_missing_client_certificate_is_one_line_asking_for_one(region: str, gateway: GatewayFactory,
                                                                       certificates: Certificates) -> None:
    async with gateway(tls=server_context(certificates, require_client_certificate=True)) as front:
        config = _config(region, front.bootstrap_servers, security_protocol="SSL", ssl_cafile=str(certificates.ca))
        with pytest.raises(KafkaHandshakeFailed) as failed:
            await check_access(config)
    message = str(failed.value)
    assert "\n" not in message and "requires a client certificate" in message and "ssl_certfile" in message


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
async def test_a_wrong_password_is_one_line_naming_the_authentication(region: str, gateway: GatewayFactory,
                                                                      tmp_path: Path, mechanism: str) -> None:
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password")
    async with gateway(users={USER: PASSWORD}) as front:
        config = _config(region, front.bootstrap_servers, security_protocol="SASL_PLAINTEXT",
                         sasl_mechanism=mechanism, sasl_username=USER, sasl_password_file=str(wrong))
        with pytest.raises(KafkaAuthenticationFailed) as failed:
            await check_access(config)
        assert front.refused == 1 and not front.authenticated
    message = str(failed.value)
    assert "\n" not in message and f"SASL authentication as '{USER}' ({mechanism})" in message
    assert str(wrong) in message and "not-the-password" not in message


async def test_a_mechanism_the_broker_does_not_offer_is_named(region: str, gateway: GatewayFactory,
                                                              password_file: Path) -> None:
    async with gateway(users={USER: PASSWORD}, mechanisms=("SCRAM-SHA-512",)) as front:
        config = _config(region, front.bootstrap_servers, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                         sasl_username=USER, sasl_password_file=str(password_file))
        with pytest.raises(KafkaAuthenticationFailed, match="does not offer PLAIN"):
            await check_access(config)


async def test_a_principal_without_the_create_right_is_one_line_naming_the_authorisation(
        region: str, gateway: GatewayFactory, password_file: Path) -> None:
    async with gateway(users={USER: PASSWORD}, refuse_create_topics=True) as front:
        config = _config(region, front.bootstrap_servers, security_protocol="SASL_PLAINTEXT",
                         sasl_mechanism="SCRAM-SHA-256", sasl_username=USER, sasl_password_file=str(password_file))
        with pytest.raises(KafkaNotAuthorized) as failed:
            await check_access(config)
    message = str(failed.value)
    assert "\n" not in message and f"does not let user '{USER}' create topic {config.topic(region)}" in message
    assert "TOPIC_AUTHORIZATION_FAILED" in message


async def test_an_unreachable_broker_is_not_an_access_error(region: str) -> None:
    """The duties retry an outage (the broker may come later); only a refusal stops the start."""
    config = _config(region, f"127.0.0.1:{free_port()}", security_protocol="SSL")
    await check_access(config)  # logs, raises nothing


def test_the_settings_are_checked_when_built(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="SASL_SSL needs sasl_mechanism, sasl_username, sasl_password_file or "
                                         "sasl_password_env"):
        KafkaSecurity(security_protocol="SASL_SSL")
    with pytest.raises(ValueError, match="ssl_cafile: set only with security_protocol SSL or SASL_SSL"):
        KafkaSecurity(ssl_cafile=tmp_path / "ca.pem")
    with pytest.raises(ValueError, match="set sasl_password_file or sasl_password_env, not both"):
        KafkaSecurity(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username=USER,
                      sasl_password_file=tmp_path / "p", sasl_password_env=PASSWORD_ENV)
    with pytest.raises(ValueError, match="sasl_password"):
        KafkaSpec(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username=USER,
                  sasl_password=PASSWORD)  # type: ignore[call-arg]  # never in clear in the topology
    missing = tmp_path / "no-such-ca.pem"
    with pytest.raises(KafkaSettingsInvalid, match=f"kafka ssl_cafile {missing} does not exist"):
        KafkaSecurity(security_protocol="SSL", ssl_cafile=missing).client_options()
    with pytest.raises(KafkaSettingsInvalid, match=f"the environment variable {PASSWORD_ENV} is unset or empty"):
        KafkaSecurity(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username=USER,
                      sasl_password_env=PASSWORD_ENV).client_options(environ={})


def test_kafka_settings_come_from_the_environment_over_the_topology(tmp_path: Path) -> None:
    topology = Topology.model_validate({"kafka": {"bootstrap_servers": "kafka-1:9093", "security_protocol": "SSL"},
                                        "regions": [{"name": "ra", "node_urls": ["http://127.0.0.1:7101"]}]})
    environ = {"AGENT_REACH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "AGENT_REACH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
               "AGENT_REACH_KAFKA_SASL_USERNAME": USER, "AGENT_REACH_KAFKA_SASL_PASSWORD_ENV": PASSWORD_ENV,
               "AGENT_REACH_KAFKA_SSL_CHECK_HOSTNAME": "false", "AGENT_REACH_KAFKA_TOPIC_PREFIX": ""}
    kafka = topology.with_kafka_env(environ).kafka
    assert (kafka.security_protocol, kafka.sasl_mechanism, kafka.sasl_password_env) == ("SASL_SSL", "SCRAM-SHA-512",
                                                                                       PASSWORD_ENV)
    assert kafka.ssl_check_hostname is False and kafka.bootstrap_servers == "kafka-1:9093"
    assert kafka.topic_prefix == "agent-reach"  # empty: unset
    with pytest.raises(ValueError, match="^AGENT_REACH_KAFKA_SASL_MECHANISM: Input should be 'PLAIN'"):
        topology.with_kafka_env({**environ, "AGENT_REACH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-1"})


def _node_command(tmp_path: Path, topology: Topology, region: str,
                  environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    file = tmp_path / "topology.json"
    file.write_text(topology.to_json())
    secret = tmp_path / "secret"
    secret.write_bytes(TEST_SECRET)
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **environ}
    return subprocess.run([sys.executable, "-m", "topology.cli", "--log-level", "WARNING", "node", "--topology",
                           str(file), "--region", region, "--secret-file", str(secret), "--port", "0", "--no-semantic"],
                          capture_output=True, text=True, timeout=60, env=environment,
                          cwd=Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("case", ["wrong password from the environment", "wrong ca", "missing ca file"])
async def test_the_node_exits_with_one_line_naming_what_failed(redis_url: str, region: str, tmp_path: Path,
                                                               gateway: GatewayFactory, certificates: Certificates,
                                                               password_file: Path, case: str) -> None:
    """``agent-reach node`` with wrong Kafka settings: a non-zero exit, one line on stderr, no traceback."""
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password")
    security: dict[str, Any] = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256",
                                "sasl_username": USER, "sasl_password_file": str(password_file),
                                "ssl_cafile": str(certificates.ca)}
    expected, code = {"wrong password from the environment": (
        f"failed (Authentication failed during authentication due to invalid credentials with SASL mechanism "
        f"SCRAM-SHA-256); check kafka sasl_username and the password in file {wrong}", 1),
        "wrong ca": ("certificate verify failed", 1),
        "missing ca file": (f"kafka ssl_cafile {tmp_path / 'gone.pem'} does not exist", 2)}[case]
    environ = {}
    if case.startswith("wrong password"):  # the file names the right one; the environment overrides it
        environ["AGENT_REACH_KAFKA_SASL_PASSWORD_FILE"] = str(wrong)
    elif case == "wrong ca":
        security["ssl_cafile"] = str(certificates.other_ca)
    else:
        security["ssl_cafile"] = str(tmp_path / "gone.pem")
    async with gateway(tls=server_context(certificates), users={USER: PASSWORD}) as front:
        pair = Pair(redis_url, region, front.bootstrap_servers, secret=TEST_SECRET)
        _secured(pair, **security)
        finished = await asyncio.to_thread(_node_command, tmp_path, pair.topology, pair.names[0], environ)
    lines = finished.stderr.strip().splitlines()
    assert finished.returncode == code, finished.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], finished.stderr
    assert "Traceback" not in finished.stderr and PASSWORD not in finished.stderr + finished.stdout
