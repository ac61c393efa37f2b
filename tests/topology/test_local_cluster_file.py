"""``~/.agent-reach/local.json``, where ``agent-reach up`` tells the clients on this machine which
URLs it chose: written whole with mode 0600 while ``up`` runs, removed after; read the same way
by the SDK (``node.client.default_node_url``) and by the command line (``topology.cli.nodeurl``,
which must not import pydantic), an explicit URL winning and a stale file read as absent."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from node.client import DEFAULT_NODE_URL, LOCAL_CLUSTER_FILE, default_node_url, running_local_cluster
from topology.cli import nodeurl
from topology.launcher import TOPIC_KINDS, LauncherError, published_cluster

pytestmark = pytest.mark.unit

NODES = {"us-east": "http://127.0.0.1:40101", "us-west": "http://127.0.0.1:40102"}
GONE_PID = 2**31 - 1  # beyond any pid_max: no such process


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("AGENT_REACH_URL", raising=False)
    return tmp_path


def _file(home: Path) -> Path:
    return home / ".agent-reach" / "local.json"


def _write(home: Path, content: object) -> None:
    _file(home).parent.mkdir(exist_ok=True)
    _file(home).write_text(content if isinstance(content, str) else json.dumps(content))


def _both() -> tuple[str, str]:
    """What the SDK and the command line each take when nobody names a node."""
    return default_node_url(), nodeurl.node_url(None)


def test_both_readers_name_the_same_file() -> None:
    assert nodeurl.LOCAL_CLUSTER_FILE == LOCAL_CLUSTER_FILE
    assert nodeurl.local_node_url() == DEFAULT_NODE_URL


def test_while_up_runs_both_take_its_first_node_and_the_file_is_private(home: Path) -> None:
    with published_cluster(topology="local", nodes=NODES, secret="$AGENT_REACH_SECRET", admin_token="ar1.x") as path:
        assert path == _file(home)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert _both() == ("http://127.0.0.1:40101", "http://127.0.0.1:40101")
        cluster = running_local_cluster()
        assert cluster is not None and cluster.pid == os.getpid() and cluster.nodes == NODES
        assert cluster.admin_token == "ar1.x" and cluster.secret == "$AGENT_REACH_SECRET"
        assert [name for name in os.listdir(path.parent) if name != "local.json"] == []  # no partial file left
    assert not _file(home).exists()
    assert _both() == (DEFAULT_NODE_URL, DEFAULT_NODE_URL)


def test_an_explicit_url_wins_over_the_file(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with published_cluster(topology="local", nodes=NODES, secret="s", admin_token="t"):
        assert nodeurl.node_url("http://10.0.0.5:7101/") == "http://10.0.0.5:7101"
        monkeypatch.setenv("AGENT_REACH_URL", "http://10.0.0.6:7101")
        assert _both() == ("http://10.0.0.6:7101", "http://10.0.0.6:7101")


@pytest.mark.parametrize("content", [
    {"pid": GONE_PID, "topology": "local", "url": "http://127.0.0.1:40101", "nodes": NODES, "secret": "s",
     "admin_token": "t"},
    "{not json",
    "[1, 2]",
    {"pid": "1", "url": "http://127.0.0.1:40101"},
    {"pid": 0, "url": "http://127.0.0.1:40101"},
    {"pid": 1},
], ids=["up-gone", "not-json", "not-an-object", "pid-a-string", "pid-zero", "no-url"])
def test_a_stale_or_broken_file_is_read_as_absent_by_both(home: Path, content: object) -> None:
    _write(home, content)
    assert running_local_cluster() is None
    assert _both() == (DEFAULT_NODE_URL, DEFAULT_NODE_URL)


def test_a_file_another_up_took_over_is_left_to_it(home: Path) -> None:
    with published_cluster(topology="local", nodes=NODES, secret="s", admin_token="t"):
        taken_over = {"pid": 1, "topology": "other", "url": "http://127.0.0.1:40999", "nodes": {"a": "x"},
                      "secret": "s", "admin_token": "t"}  # pid 1 runs
        _write(home, taken_over)
    assert json.loads(_file(home).read_text())["topology"] == "other"
    assert nodeurl.node_url(None) == "http://127.0.0.1:40999"


def test_an_unwritable_home_is_one_launcher_error(home: Path) -> None:
    (home / ".agent-reach").write_text("a file where the directory should be")
    with pytest.raises(LauncherError, match="cannot write .*local.json"):
        with published_cluster(topology="local", nodes=NODES, secret="s", admin_token="t"):
            pass


def test_the_banner_names_every_topic_kind_federation_uses() -> None:
    from federation.config import FederationConfig

    names = {"topic", "beacon_topic", "summary_topic", "revocation_topic", "acl_topic"}
    assert {name for name in dir(FederationConfig) if name.endswith("topic") and not name.startswith("_")} == names
    config = FederationConfig.model_construct(topic_prefix="p")
    assert {getattr(config, name)("r") for name in names} == {f"p.{kind}.r" for kind in TOPIC_KINDS}
