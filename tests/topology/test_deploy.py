"""deploy/: the production topology passes the project's topology validator (three regions, an
external Redis each, a Kafka cluster with idempotence on) and builds every region's node and
federation config with the example environment file on top; the systemd unit is hardened and
its command line is one the CLI accepts."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from node.envconfig import settings_from_env
from topology.cli.entrypoint import build_parser
from topology.spec import load_topology

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


def test_the_production_topology_is_valid_and_builds_every_region() -> None:
    topology = load_topology(DEPLOY / "topology.prod.toml")
    assert [region.name for region in topology.regions] == ["us-east", "us-west", "eu-west"]
    assert topology.kafka.enable_idempotence is True
    assert len(topology.kafka.bootstrap_servers.split(",")) == 3
    env = settings_from_env(_env_file(DEPLOY / "region.env.example"))
    for region in topology.regions:
        assert region.redis_url and region.redis_url.startswith("rediss://")
        config = topology.node_config(region.name, overrides=env)
        assert (config.host, config.port, config.access_log, config.decision_log) == ("0.0.0.0", 7101, True, "stdout")
        assert config.advertise_url == region.node_urls[0]
        federation = topology.federation_config(region.name)
        assert federation.enable_idempotence and len(federation.peers) == 2


def test_the_systemd_unit_is_hardened_and_runs_a_command_the_cli_accepts() -> None:
    unit = _unit()
    for key, value in {"DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
                       "ProtectHome": "yes", "PrivateTmp": "yes", "Restart": "on-failure", "KillSignal": "SIGTERM",
                       "CapabilityBoundingSet": ""}.items():
        assert unit.get(key) == [value], (key, unit.get(key))
    assert unit["EnvironmentFile"] == ["/etc/agent-reach/%i.env"]
    assert unit["LoadCredential"] == ["secret:/etc/agent-reach/secret"]
    command = shlex.split(unit["ExecStart"][0].replace("%i", "eu-west").replace("%d", "/run/credentials/x")
                          .replace("%S", "/var/lib"))
    assert command[0] == "/opt/agent-reach/bin/agent-reach"
    args = build_parser().parse_args(command[1:])
    assert (args.command, args.region, args.log_format) == ("node", "eu-west", "json")
    assert args.secret_file == "/run/credentials/x/secret"
    assert args.signing_key_file == "/var/lib/agent-reach/eu-west/signing-key.pem"
    # Stopping waits for the drain: the grace and the timeout fit in TimeoutStopSec.
    assert (args.drain_grace_ms + args.drain_timeout_ms) / 1000 < int(unit["TimeoutStopSec"][0].rstrip("s"))
