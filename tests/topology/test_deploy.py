"""deploy/: the production example — three regions on Sentinel-managed Redis over TLS, SASL_SSL
Kafka, nodes serving https with mutual TLS — passes the project's validators and builds every
region's node and federation config with the unit's and the example environment file's settings
on top; every variable they set is a setting that exists; no file holds a secret in clear, and
every secret the settings name is a credential the unit loads; the systemd unit is hardened and
its command line is one the CLI accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from node.envconfig import env_settings, settings_from_env
from node.store import parse_redis_url
from topology.cli.entrypoint import build_parser
from topology.spec import KAFKA_ENV_PREFIX, KafkaSpec, load_topology

pytestmark = pytest.mark.unit

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _env_file(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def _unit() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    text = (DEPLOY / "agent-reach-node@.service").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def _credentials(region: str) -> str:
    return f"/run/credentials/agent-reach-node@{region}.service"


def _unit_environment(region: str) -> dict[str, str]:
    """The variables the unit's Environment= lines set, its specifiers filled in for ``region``."""
    pairs = {}
    for line in _unit()["Environment"]:
        for assignment in shlex.split(line.replace("%d", _credentials(region)).replace("%i", region)):
            key, _, value = assignment.partition("=")
            pairs[key] = value
    return pairs


def _node_environment(region: str) -> dict[str, str]:
    """What a node of ``region`` finds in its environment: the env file, then the unit's lines."""
    return {**_env_file(DEPLOY / "region.env.example"), **_unit_environment(region)}


def test_the_production_topology_is_valid_and_builds_every_region() -> None:
    topology = load_topology(DEPLOY / "topology.prod.toml")
    assert [region.name for region in topology.regions] == ["us-east", "us-west", "eu-west"]
    assert topology.kafka.enable_idempotence is True
    assert len(topology.kafka.bootstrap_servers.split(",")) == 3
    for region in topology.regions:
        environ = _node_environment(region.name)
        # Redis: a Sentinel-managed primary named after the region, TLS to sentinels and servers,
        # an ACL user whose password is the unit's credential, WAIT for a replica on each write.
        target = parse_redis_url(region.redis_url)
        assert (target.kind, target.tls, target.master_name) == ("sentinel", True, region.name)
        assert len(target.addresses) == 3 and target.username and target.password is None
        config = topology.node_config(region.name, overrides=settings_from_env(environ))
        assert (config.host, config.port, config.access_log, config.decision_log) == ("0.0.0.0", 7101, True, "stdout")
        assert config.advertise_url == region.node_urls[0] and config.advertise_url.startswith("https://")
        assert config.redis_password_file == f"{_credentials(region.name)}/redis-password"
        assert config.redis_sentinel_password_file == f"{_credentials(region.name)}/sentinel-password"
        assert config.redis_ca_file and config.redis_wait_replicas == 1
        # TLS: served with a certificate and the key from the credentials, client certificates
        # required; as a client of its peers the node trusts a CA bundle and presents its own.
        assert config.tls_cert_file and config.tls_client_ca_file and config.ca_file
        assert config.tls_key_file == config.client_key_file == f"{_credentials(region.name)}/tls-key"
        assert config.client_cert_file == config.tls_cert_file
        # Kafka: SASL_SSL with SCRAM, the password from the unit's credential.
        federation = topology.with_kafka_env(environ).federation_config(region.name)
        assert federation.enable_idempotence and len(federation.peers) == 2
        security = federation.security
        assert (security.security_protocol, security.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
        assert security.ssl_cafile and security.ssl_check_hostname
        assert str(security.sasl_password_file) == f"{_credentials(region.name)}/kafka-password"
        assert security.sasl_password_env is None
        assert all(url.startswith("https://") for peer in federation.peers for url in peer.node_urls)


def test_every_variable_the_examples_set_is_a_setting() -> None:
    """An unknown AGENT_REACH_* variable would be ignored silently; every one set is a node
    setting or a [kafka] key."""
    known = {setting.variable for setting in env_settings()}
    known |= {f"{KAFKA_ENV_PREFIX}{key.upper()}" for key in KafkaSpec.model_fields}
    for region in ("us-east", "eu-west"):
        ours = [name for name in _node_environment(region) if name.startswith("AGENT_REACH_")]
        assert ours and set(ours) <= known, sorted(set(ours) - known)


_SECRET_KEY = re.compile(r"(password|passwd|secret|token|private_?key|(^|_)key($|_file))", re.I)
_PATH_VALUE = re.compile(r"^\"?(/etc/agent-reach/|%d/)[\w./%-]+\"?$")


def test_no_deploy_file_holds_a_secret_in_clear() -> None:
    for path in DEPLOY.iterdir():
        text = path.read_text()
        assert "PRIVATE KEY" not in text and "CHANGE-ME" not in text, path.name
        assert not re.search(r"://[^/@\s:]+:[^@\s/]+@", text), f"{path.name}: a URL with a password"
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                continue
            for key, value in re.findall(r"([\w-]+)\s*=\s*(\S+)", line.removeprefix("Environment=")):
                if _SECRET_KEY.search(key) and key not in ("sasl_username",):
                    # A secret is named by where it is (a file here or a systemd credential), never given.
                    assert _PATH_VALUE.match(value) or value.startswith("secret:"), (path.name, key, value)


def test_every_secret_is_a_credential_of_the_unit_and_every_file_is_listed() -> None:
    unit = _unit()
    text = (DEPLOY / "agent-reach-node@.service").read_text()
    loaded = dict(credential.split(":", 1) for credential in unit["LoadCredential"])
    used = set(re.findall(r"%d/([\w-]+)", " ".join(unit["ExecStart"] + unit["Environment"])))
    assert used == set(loaded), (used, set(loaded))  # each credential loaded is used, each used is loaded
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    topology_text = (DEPLOY / "topology.prod.toml").read_text()
    for source in loaded.values():
        assert f"{source} " in header and "secret:" in header.split(source, 1)[1].splitlines()[0], source
    for file in sorted(set(re.findall(r'"(/etc/agent-reach/[^"]+)"', topology_text))):
        assert f"{file} " in header, f"{file} (named in the topology) is not in the unit's list of files"
    # The topology's Kafka password file is the one the unit loads (it points at its copy).
    assert load_topology(DEPLOY / "topology.prod.toml").kafka.sasl_password_file == Path(loaded["kafka-password"])
    # The files the README's steps have the operator create are the ones the unit expects.
    readme = (DEPLOY.parent / "README.md").read_text()
    section = readme.split("## Deploying one node per region", 1)[1].split("\n## ", 1)[0]
    for source in loaded.values():
        assert source.replace("%i", "<region>") in section, f"the README's deploy steps do not name {source}"


def test_the_systemd_unit_is_hardened_and_runs_a_command_the_cli_accepts() -> None:
    unit = _unit()
    for key, value in {"DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
                       "ProtectHome": "yes", "PrivateTmp": "yes", "Restart": "on-failure", "KillSignal": "SIGTERM",
                       "CapabilityBoundingSet": ""}.items():
        assert unit.get(key) == [value], (key, unit.get(key))
    assert unit["EnvironmentFile"] == ["/etc/agent-reach/%i.env"]
    assert unit["LoadCredential"][0] == "secret:/etc/agent-reach/secret"
    command = shlex.split(unit["ExecStart"][0].replace("%i", "eu-west").replace("%d", "/run/credentials/x")
                          .replace("%S", "/var/lib"))
    assert command[0] == "/opt/agent-reach/bin/agent-reach"
    args = build_parser().parse_args(command[1:])
    assert (args.command, args.region, args.log_format) == ("node", "eu-west", "json")
    assert args.secret_file == "/run/credentials/x/secret"
    assert args.signing_key_file == "/var/lib/agent-reach/eu-west/signing-key.pem"
    # Stopping waits for the drain: the grace and the timeout fit in TimeoutStopSec.
    assert (args.drain_grace_ms + args.drain_timeout_ms) / 1000 < int(unit["TimeoutStopSec"][0].rstrip("s"))
