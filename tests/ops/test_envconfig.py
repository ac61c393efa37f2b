"""Node settings from the environment (node.envconfig): every NodeConfig field has its variable,
the precedence flags > environment > topology file > defaults holds in the node command, a bad
value is one line naming the variable, and docs/configuration.md carries the generated table."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from node.config import NodeConfig, ProxySettings
from node.envconfig import EnvConfigError, env_settings, env_table, settings_from_env, without_per_node_settings
from node.trust import EgressPolicy
from topology.cli import node as node_command
from topology.cli.entrypoint import build_parser
from topology.spec import load_topology

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = """
[node]
sweep_interval_ms = 2000
breaker_failures = 7
proxy = { max_hops = 5, trace_max_events = 50 }

[[regions]]
name = "eu-west"
node_urls = ["http://127.0.0.1:7301"]
redis_url = "redis://127.0.0.1:6390/0"
"""


def test_every_setting_has_a_variable_derived_from_the_model() -> None:
    variables = {setting.variable: setting.setting for setting in env_settings()}
    nested = {"egress": EgressPolicy, "proxy": ProxySettings}
    expected = set()
    for name in NodeConfig.model_fields:
        if name in nested:
            expected |= {f"AGENT_REACH_{name.upper()}_{inner.upper()}" for inner in nested[name].model_fields}
        else:
            expected.add(f"AGENT_REACH_{name.upper()}")
    assert set(variables) == expected
    assert variables["AGENT_REACH_PROXY_MAX_HOPS"] == "proxy.max_hops"
    assert variables["AGENT_REACH_EGRESS_ALLOW"] == "egress.allow"


def test_every_setting_is_defined_once_in_the_room_that_uses_it() -> None:
    """NodeConfig inherits the rooms' settings objects: each field is declared by one class of its
    bases, and the variable keeps the field's flat name."""
    declared: dict[str, list[type]] = {}
    for cls in NodeConfig.__mro__:
        for name in vars(cls).get("__annotations__", {}):
            if name in NodeConfig.model_fields:
                declared.setdefault(name, []).append(cls)
    assert set(declared) == set(NodeConfig.model_fields)
    assert {name: owners for name, owners in declared.items() if len(owners) > 1} == {}
    rooms = {name: owners[0].__module__ for name, owners in declared.items()}
    assert (rooms["key_prefix"], rooms["lease_sync_interval_ms"], rooms["sweep_interval_ms"]) == (
        "node.store.region", "node.view.settings", "node.duties.settings")
    assert (rooms["revocation_poll_interval_ms"], rooms["ticket_ttl_ms"], rooms["breaker_failures"]) == (
        "node.trust.settings", "node.routing.settings", "node.delivery.settings")
    assert rooms["header_read_timeout_ms"] == rooms["proxy"] == "node.config"  # node.http stands above the config
    assert {setting.variable for setting in env_settings()} >= {"AGENT_REACH_TICKET_TTL_MS",
                                                                "AGENT_REACH_PROXY_RETRY_INITIAL_BACKOFF_MS"}


def test_values_are_read_as_the_model_reads_them() -> None:
    settings = settings_from_env({
        "AGENT_REACH_PORT": "8080", "AGENT_REACH_ACCESS_LOG": "true", "AGENT_REACH_OVERPROVISIONING_FACTOR": "1.5",
        "AGENT_REACH_ALLOWED_TRANSPORTS": "http+token, https+token", "AGENT_REACH_EGRESS_ALLOW": '["loopback"]',
        "AGENT_REACH_PROXY_MAX_HOPS": "4", "AGENT_REACH_NODE_ID": "", "AGENT_REACH_SECRET": "not a node setting",
    })
    assert settings == {"port": 8080, "access_log": True, "overprovisioning_factor": 1.5,
                        "allowed_transports": ["http+token", "https+token"], "egress": {"allow": ("loopback",)},
                        "proxy": {"max_hops": 4}}


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("AGENT_REACH_PORT", "eighty", "AGENT_REACH_PORT='eighty': "),
    ("AGENT_REACH_PORT", "70000", "AGENT_REACH_PORT='70000': "),
    ("AGENT_REACH_ACCESS_LOG", "maybe", "AGENT_REACH_ACCESS_LOG='maybe': "),
    ("AGENT_REACH_PROXY_MAX_HOPS", "0", "AGENT_REACH_PROXY_MAX_HOPS='0': "),
    ("AGENT_REACH_EGRESS_ALLOW", "[not json", "AGENT_REACH_EGRESS_ALLOW: not a JSON array"),
])
def test_a_bad_value_is_one_line_naming_the_variable(variable: str, value: str, says: str) -> None:
    with pytest.raises(EnvConfigError) as raised:
        settings_from_env({variable: value})
    message = str(raised.value)
    assert message.startswith(says) and "\n" not in message, message


def _config(monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str]) -> NodeConfig:
    """The NodeConfig ``agent-reach node ARGV`` builds under ``env`` (no server is started)."""
    for key in [key for key in os.environ if key.startswith("AGENT_REACH_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AGENT_REACH_SECRET", "unit-test-secret-0123456789")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = build_parser().parse_args(["node", *argv])
    plan = node_command._plan(args)
    return node_command._node_config(args, plan, plan.redis_url or "redis://embedded:1/0")


def test_precedence_flags_over_environment_over_topology_over_defaults(monkeypatch, tmp_path: Path) -> None:
    topology = tmp_path / "prod.toml"
    topology.write_text(TOPOLOGY)
    argv = ["--topology", str(topology), "--region", "eu-west"]
    # The file over the defaults.
    config = _config(monkeypatch, argv, {})
    assert (config.port, config.sweep_interval_ms, config.breaker_failures) == (7301, 2000, 7)
    assert config.proxy.max_hops == 5 and config.redis_url == "redis://127.0.0.1:6390/0"
    assert config.access_log is False  # the default, set nowhere
    # The environment over the file (a nested setting merged key by key).
    env = {"AGENT_REACH_PORT": "7400", "AGENT_REACH_SWEEP_INTERVAL_MS": "500", "AGENT_REACH_PROXY_MAX_HOPS": "3",
           "AGENT_REACH_REDIS_URL": "redis://10.0.0.9:6379/1", "AGENT_REACH_ACCESS_LOG": "1"}
    config = _config(monkeypatch, argv, env)
    assert (config.port, config.sweep_interval_ms, config.breaker_failures) == (7400, 500, 7)
    assert (config.proxy.max_hops, config.proxy.trace_max_events) == (3, 50)
    assert config.redis_url == "redis://10.0.0.9:6379/1" and config.access_log is True
    # The flags over the environment.
    config = _config(monkeypatch, [*argv, "--port", "7500", "--redis", "redis://10.0.0.1:6379/2"], env)
    assert (config.port, config.redis_url, config.sweep_interval_ms) == (7500, "redis://10.0.0.1:6379/2", 500)
    # Without a topology: the environment over the defaults; the region from the environment.
    config = _config(monkeypatch, [], {"AGENT_REACH_REGION": "ap-south", "AGENT_REACH_HOST": "0.0.0.0"})
    assert (config.region, config.host, config.port) == ("ap-south", "0.0.0.0", 7101)
    assert node_command._listen_address(build_parser().parse_args(["node"]), node_command._plan(
        build_parser().parse_args(["node"]))) == ("0.0.0.0", 7101)
    config = _config(monkeypatch, ["--region", "eu-central"], {"AGENT_REACH_REGION": "ap-south"})
    assert config.region == "eu-central"


def test_the_node_command_names_a_bad_variable_in_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setenv("AGENT_REACH_SECRET", "unit-test-secret-0123456789")
    monkeypatch.setenv("AGENT_REACH_TICKET_TTL_MS", "soon")
    assert node_command._run(build_parser().parse_args(["node", "--region", "eu"])) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "AGENT_REACH_TICKET_TTL_MS='soon'" in err, err
    monkeypatch.delenv("AGENT_REACH_TICKET_TTL_MS")
    monkeypatch.delenv("AGENT_REACH_REGION", raising=False)
    assert node_command._run(build_parser().parse_args(["node"])) == 2
    assert "AGENT_REACH_REGION" in capsys.readouterr().err


def test_up_does_not_hand_per_node_settings_to_its_nodes() -> None:
    kept = without_per_node_settings({"AGENT_REACH_PORT": "1", "AGENT_REACH_REGION": "x",
                                      "AGENT_REACH_ACCESS_LOG": "true", "PATH": "/bin"})
    assert kept == {"AGENT_REACH_ACCESS_LOG": "true", "PATH": "/bin"}


def test_docs_carry_the_generated_table() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert env_table() in text, ("docs/configuration.md is out of date: replace its table with the output of "
                                 "python -m node.envconfig")


def test_the_example_topology_still_loads_under_the_environment(monkeypatch) -> None:
    """The packaged topology's node settings and an environment override build a config together."""
    topology = load_topology()
    config = topology.node_config("us-east", redis_url="redis://127.0.0.1:1/0",
                                  overrides=settings_from_env({"AGENT_REACH_EGRESS_ALLOW": "loopback,private"}))
    assert config.egress.allow == ("loopback", "private")
