"""The `agent-reach` command: a node with embedded Redis starts, serves and stops cleanly; tokens."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from node.core.models import TokenRole
from node.trust import Signer

AGENT_REACH = str(Path(sys.executable).with_name("agent-reach"))
SECRET = "cli-test-secret-0123456789"


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _read_until(process: subprocess.Popen[str], pattern: str, timeout_s: float = 30.0) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            if process.poll() is not None:
                break
            continue
        seen.append(line)
        found = re.search(pattern, line)
        if found:
            return found
    raise AssertionError(f"no line matching {pattern!r} within {timeout_s}s; output: {''.join(seen)}")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_node_with_embedded_redis_starts_serves_and_stops_cleanly(signum: int, tmp_path: Path) -> None:
    env = {**os.environ, "AGENT_REACH_SECRET": SECRET}
    process = subprocess.Popen([AGENT_REACH, "node", "--region", "cli", "--port", "0", "--no-semantic", "--ephemeral"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        found = _read_until(process, r"url=http://127\.0\.0\.1:(\d+) redis=redis://127\.0\.0\.1:(\d+)")
        http_port, redis_port = int(found.group(1)), int(found.group(2))
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=5) as response:
            assert response.status == 200
        assert _port_open(redis_port)
        process.send_signal(signum)
        assert process.wait(timeout=20) == 0
        # No orphan: the embedded redis-server is gone with the node.
        deadline = time.monotonic() + 5
        while _port_open(redis_port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _port_open(redis_port), "the embedded redis-server outlived the node"
        assert not _port_open(http_port)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_token_issue_prints_a_verifiable_token(tmp_path: Path) -> None:
    env = {**os.environ, "AGENT_REACH_SECRET": SECRET}
    out = subprocess.run([AGENT_REACH, "token", "issue", "--agent", "payment.risk_check.prod_01", "--ttl-s", "60"],
                         env=env, capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    claims = Signer(SECRET.encode()).verify(out)
    assert claims.sub == "payment.risk_check.prod_01" and claims.role is TokenRole.AGENT
    assert claims.exp - claims.iat == 60

    bad = subprocess.run([AGENT_REACH, "token", "issue", "--agent", "Not Valid"], env=env, capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode == 2 and "namespace.group.name" in bad.stderr


def test_secret_file_is_created_once_and_reused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_REACH_SECRET")}
    secret_file = tmp_path / "secret"
    env["AGENT_REACH_SECRET_FILE"] = str(secret_file)
    first = subprocess.run([AGENT_REACH, "token", "issue", "--admin", "--create-secret"], env=env,
                           capture_output=True, text=True, check=True, timeout=30)
    assert secret_file.exists() and oct(secret_file.stat().st_mode & 0o777) == "0o600"
    assert str(secret_file) in first.stderr
    second = subprocess.run([AGENT_REACH, "token", "issue", "--admin"], env=env, capture_output=True, text=True,
                            check=True, timeout=30)
    signer = Signer(secret_file.read_text().strip().encode())
    assert signer.verify(first.stdout.strip()).role is TokenRole.ADMIN
    assert signer.verify(second.stdout.strip()).role is TokenRole.ADMIN


def test_register_from_an_a2a_card_with_keep_alive(tmp_path: Path) -> None:
    import json

    from tests.semantic.test_discovery import CARD_V03

    env = {**os.environ, "AGENT_REACH_SECRET": SECRET}
    node = subprocess.Popen([AGENT_REACH, "node", "--region", "cli", "--port", "0", "--no-semantic", "--ephemeral",
                             "--egress-allow", "loopback"],  # the card's agent listens on 127.0.0.1
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        url = "http://127.0.0.1:" + _read_until(node, r"url=http://127\.0\.0\.1:(\d+)").group(1)
        card = tmp_path / "card.json"
        card.write_text(json.dumps(CARD_V03))
        token = Signer(SECRET.encode()).issue("finance.invoice.cli", TokenRole.AGENT, ttl_s=600)
        bad = subprocess.run([AGENT_REACH, "register", "--a2a-card", str(card), "--agent-id", "finance.invoice.cli",
                              "--node", url, "--token", token + "x"], capture_output=True, text=True, timeout=30)
        assert bad.returncode == 2 and "refused" in bad.stderr
        broken = tmp_path / "broken.json"
        broken.write_text(json.dumps({**CARD_V03, "skills": "not a list"}))
        invalid = subprocess.run([AGENT_REACH, "register", "--a2a-card", str(broken), "--agent-id",
                                  "finance.invoice.cli", "--node", url, "--token", token],
                                 capture_output=True, text=True, timeout=30)
        assert invalid.returncode == 2 and "invalid (card.skills)" in invalid.stderr, invalid.stderr
        once = subprocess.run([AGENT_REACH, "register", "--a2a-card", str(card), "--agent-id", "finance.invoice.cli",
                               "--node", url, "--token", token], capture_output=True, text=True, timeout=30)
        assert once.returncode == 0 and "registered finance.invoice.cli" in once.stdout, once.stderr
        keeper = subprocess.Popen([AGENT_REACH, "register", "--a2a-card", str(card), "--agent-id",
                                   "finance.invoice.cli", "--node", url, "--token", token, "--lease-ttl-ms", "1500",
                                   "--keep-alive"], stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert "registered finance.invoice.cli" in _read_until(keeper, r"registered").string
            admin = Signer(SECRET.encode()).issue("admin", TokenRole.ADMIN, ttl_s=600)

            def get() -> int:
                request = urllib.request.Request(f"{url}/v1/agents/finance.invoice.cli",
                                                 headers={"Authorization": f"Bearer {admin}"})
                try:
                    with urllib.request.urlopen(request, timeout=5) as response:
                        return response.status
                except urllib.error.HTTPError as exc:
                    return exc.code

            assert get() == 200  # the one-shot registration was not deregistered when it exited
            # Kept alive past several leases by its heartbeats.
            deadline = time.monotonic() + 3.5
            while time.monotonic() < deadline:
                assert get() == 200
                time.sleep(0.25)
            keeper.send_signal(signal.SIGTERM)
            assert keeper.wait(timeout=10) == 0
            assert get() == 404, "deregistered on exit"
        finally:
            if keeper.poll() is None:
                keeper.kill()
                keeper.wait()
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(timeout=20)


def test_node_says_clearly_when_redis_is_unreachable() -> None:
    env = {**os.environ, "AGENT_REACH_SECRET": SECRET}
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = subprocess.run([AGENT_REACH, "node", "--region", "cli", "--port", "0", "--no-semantic", "--ephemeral", "--redis",
                          f"redis://127.0.0.1:{port}/0"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.startswith("error: Redis of region cli cannot be reached"), out.stderr
    assert "Traceback" not in out.stderr


def test_a_standalone_node_contacts_public_addresses_only_unless_told() -> None:
    import json

    env = {**os.environ, "AGENT_REACH_SECRET": SECRET}
    node = subprocess.Popen([AGENT_REACH, "node", "--region", "cli", "--port", "0", "--no-semantic", "--ephemeral"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        url = "http://127.0.0.1:" + _read_until(node, r"url=http://127\.0\.0\.1:(\d+)").group(1)
        admin = Signer(SECRET.encode()).issue("admin", TokenRole.ADMIN, ttl_s=600)
        body = json.dumps({"agent_id": "lang.translate.local", "endpoints": {"primary": "http://127.0.0.1:9001"}})
        request = urllib.request.Request(f"{url}/v1/agents", data=body.encode(), method="POST",
                                         headers={"Authorization": f"Bearer {admin}",
                                                  "Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        reply = json.loads(refused.value.read())
        assert refused.value.code == 422 and reply["field"] == "endpoints.primary", reply
        assert "--egress-allow loopback" in reply["message"], reply  # the message says how to allow it
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(timeout=30)
