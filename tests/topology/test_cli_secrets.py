"""Secrets and clear errors of the command line: masked URL passwords, the admin token and secret
file rules, and one ``error: …`` line (no traceback, non-zero exit) for every set-up mistake."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.trust import CredentialFilter, SecretError, load_secret, mask_credentials, mask_url
from topology.embedded import DataDirLock, redis_server_executable

pytestmark = pytest.mark.timeout(120)

CLI = [sys.executable, "-m", "topology.cli"]
SECRET = "secrets-test-secret-0123456789"
PASSWORD = "s3cret-Pa55word"


def cli(*args: str, home: Path, env: dict[str, str] | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_REACH_SECRET")}
    base["HOME"] = str(home)
    return subprocess.run([*CLI, *args], env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout_s)


def assert_one_line_error(out: subprocess.CompletedProcess, *fragments: str) -> None:
    assert out.returncode != 0, out
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# -- masking -----------------------------------------------------------------------------------

@pytest.mark.unit
def test_mask_url_hides_only_the_password() -> None:
    assert mask_url("redis://app:hunter2@10.0.0.5:6379/0") == "redis://app:***@10.0.0.5:6379/0"
    assert mask_url("redis://:hunter2@10.0.0.5:6379/0") == "redis://:***@10.0.0.5:6379/0"
    assert mask_url("rediss://u:p%40ss@h/1") == "rediss://u:***@h/1"
    assert mask_url("redis://u:p@ss@host:1/0") == "redis://u:***@host:1/0"  # an unencoded "@" in it
    assert mask_url("redis://10.0.0.5:6379/0") == "redis://10.0.0.5:6379/0"
    assert mask_url("redis://user@host/0") == "redis://user@host/0"  # a user name is no secret
    assert mask_url(None) == "-"
    two = "a redis://a:one@h1/0 and kafka+sasl://b:two@h2:9092 end"
    assert mask_credentials(two) == "a redis://a:***@h1/0 and kafka+sasl://b:***@h2:9092 end"


@pytest.mark.unit
def test_credential_filter_masks_messages_arguments_and_tracebacks() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(CredentialFilter())
    logger = logging.getLogger("tests.redact")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("connecting to %s", f"redis://app:{PASSWORD}@db:6379/0")
        try:
            raise ConnectionRefusedError(f"cannot reach redis://:{PASSWORD}@db:6379/0")
        except ConnectionRefusedError:
            logger.exception("start failed")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert PASSWORD not in text
    assert "redis://app:***@db:6379/0" in text and "redis://:***@db:6379/0" in text


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Iterator[int]:
    """A real redis-server that requires ``PASSWORD`` (the embedded one has none)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([redis_server_executable(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--requirepass", PASSWORD, "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as client:
                if client.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.01)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_node_masks_the_redis_password_in_every_line(tmp_path: Path, redis_with_password: int) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{redis_with_password}/0"
    env = {**os.environ, "AGENT_REACH_SECRET": SECRET, "HOME": str(tmp_path)}
    process = subprocess.Popen([*CLI, "--log-level", "DEBUG", "node", "--region", "masked", "--port", "0",
                                "--no-semantic", "--redis", url], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        seen = []
        while not any(line.startswith("agent-reach node ") for line in seen):
            line = process.stdout.readline()
            assert line, "the node exited while starting:\n" + "".join(seen)
            seen.append(line)
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=20)
        output = "".join(seen) + rest
        assert process.returncode == 0, output
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert PASSWORD not in output
    assert f"redis=redis://:***@127.0.0.1:{redis_with_password}/0" in output

    wrong = cli("node", "--region", "masked", "--port", "0", "--no-semantic", "--redis",
                f"redis://:wrong-{PASSWORD}@127.0.0.1:{redis_with_password}/0", home=tmp_path,
                env={"AGENT_REACH_SECRET": SECRET})
    assert_one_line_error(wrong, "Redis of region masked cannot be reached")
    assert PASSWORD not in wrong.stderr + wrong.stdout


# -- the secret file ---------------------------------------------------------------------------

def test_a_named_secret_file_must_exist_unless_asked_to_create_it(tmp_path: Path) -> None:
    typo = tmp_path / "secert"
    for args in (["token", "issue", "--admin", "--secret-file", str(typo)],
                 ["node", "--region", "typo", "--port", "0", "--ephemeral", "--secret-file", str(typo)],
                 ["up", "--ephemeral", "--any-port", "--secret-file", str(typo)]):
        out = cli(*args, home=tmp_path)
        assert_one_line_error(out, str(typo), "does not exist", "--create-secret")
        assert not typo.exists(), f"{args[0]} created the mistyped secret file"
    out = cli("token", "issue", "--admin", home=tmp_path, env={"AGENT_REACH_SECRET_FILE": str(typo)})
    assert_one_line_error(out, "$AGENT_REACH_SECRET_FILE")

    created = cli("token", "issue", "--admin", "--secret-file", str(typo), "--create-secret", home=tmp_path)
    assert created.returncode == 0, created.stderr
    assert oct(typo.stat().st_mode & 0o777) == "0o600"


def test_the_default_secret_file_is_created_once_with_mode_0600(tmp_path: Path) -> None:
    first = cli("token", "issue", "--admin", home=tmp_path)
    default = tmp_path / ".agent-reach" / "secret"
    assert first.returncode == 0, first.stderr
    assert oct(default.stat().st_mode & 0o777) == "0o600" and str(default) in first.stderr
    content = default.read_text()
    assert cli("token", "issue", "--admin", home=tmp_path).returncode == 0
    assert default.read_text() == content


def test_a_caller_token_is_never_named_admin(tmp_path: Path) -> None:
    refused = cli("token", "issue", "--caller", "admin", "--create-secret", home=tmp_path)
    assert_one_line_error(refused, "'admin' names the admin role", "--admin")
    assert refused.stdout == ""
    assert cli("token", "issue", "--caller", "app.billing", home=tmp_path).returncode == 0


@pytest.mark.unit
def test_load_secret_errors_are_typed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_REACH_SECRET", raising=False)
    monkeypatch.delenv("AGENT_REACH_SECRET_FILE", raising=False)
    with pytest.raises(SecretError, match="does not exist"):
        load_secret(secret_file=tmp_path / "missing")
    short = tmp_path / "short"
    short.write_text("tiny\n")
    with pytest.raises(SecretError, match="shorter than 16 bytes"):
        load_secret(secret_file=short)
    secret, source = load_secret(secret_file=tmp_path / "new", create=True)
    assert len(secret) >= 16 and source == str(tmp_path / "new")


# -- one line, no traceback --------------------------------------------------------------------

def _topology_file(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"name": "errors-test", "node": {"semantic_enabled": False},
                                "regions": [{"name": "solo", "node_urls": [f"http://127.0.0.1:{port}"]}]}))
    return path


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_setup_mistakes_are_one_line_errors(tmp_path: Path, busy_port: int) -> None:
    short = {"AGENT_REACH_SECRET": "too-short"}
    good = {"AGENT_REACH_SECRET": SECRET}
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    unwritable = str(not_a_dir / "data")
    broken = tmp_path / "broken.toml"
    broken.write_text("regions = 3\n")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\x80\x81\xfe\xff")
    in_use = tmp_path / "in-use"
    in_use.mkdir()
    topology = str(_topology_file(tmp_path, busy_port))
    node = ["node", "--region", "errs", "--no-semantic"]
    up = ["up", "--any-port"]
    cases = [
        ("node: short secret", [*node, "--port", "0", "--ephemeral"], short, ["shorter than 16 bytes"]),
        ("node: busy port", [*node, "--port", str(busy_port), "--ephemeral"], good, ["in use", str(busy_port)]),
        ("node: missing topology", [*node, "--topology", str(tmp_path / "nope.toml")], good,
         ["cannot read the topology file"]),
        ("node: invalid topology", [*node, "--topology", str(broken)], good, [str(broken)]),
        ("node: binary topology", [*node, "--topology", str(binary)], good, ["not a text file"]),
        ("node: unwritable data dir", [*node, "--port", "0", "--data-dir", unwritable], good,
         ["data dir", "--data-dir"]),
        ("node: data dir with an external Redis", [*node, "--redis", "redis://127.0.0.1:1/0", "--data-dir",
                                                   str(in_use)], good, ["--data-dir"]),
        ("up: short secret", [*up, "--ephemeral"], short, ["shorter than 16 bytes"]),
        ("up: busy port", ["up", "--ephemeral", topology], good, [f"port {busy_port}", "--any-port"]),
        ("up: invalid topology", [*up, "--ephemeral", str(broken)], good, [str(broken)]),
        ("up: unwritable data dir", [*up, "--data-dir", unwritable, topology], good, ["data dir"]),
        ("up: data dir in use", [*up, "--data-dir", str(in_use), topology], good, ["in use", str(in_use)]),
        ("token: short secret", ["token", "issue", "--admin"], short, ["shorter than 16 bytes"]),
    ]
    failures = []
    with DataDirLock(in_use):  # as a running `up` would hold it
        for name, args, env, fragments in cases:
            started = time.perf_counter()
            out = cli(*args, home=tmp_path, env=env)
            try:
                assert_one_line_error(out, *fragments)
            except AssertionError as exc:
                failures.append(f"{name}: {exc}")
            print(f"{name}: exit {out.returncode} in {time.perf_counter() - started:.2f} s: {out.stderr.strip()}")
    assert not failures, "\n".join(failures)
    assert not (tmp_path / ".agent-reach" / "data").exists(), "a failed start created the default data dir"
