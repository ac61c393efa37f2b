"""Logs: JSON or text lines, the access log, and the decision log (route decisions and outcomes
as JSON lines keyed by trace_id); every line written is read back and parsed."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from yarl import URL

from node.core.models import TokenRole
from node.ops import ACCESS_LOGGER, FIELDS
from node.ops.logs import JsonFormatter, TextFormatter
from node.trust import CredentialFilter

from ..helpers import registration, wait_for

AGENT_REACH = str(Path(sys.executable).with_name("agent-reach"))


class _Capture:
    """The lines one logger writes through ``formatter`` while the block runs."""

    def __init__(self, name: str, formatter: logging.Formatter) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(formatter)
        self.handler.addFilter(CredentialFilter())
        self.logger = logging.getLogger(name)

    def __enter__(self) -> _Capture:
        self.level = self.logger.level
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)

    def lines(self) -> list[str]:
        return [line for line in self.stream.getvalue().splitlines() if line]


async def test_access_log_lines_are_json_objects(node_factory) -> None:
    running = await node_factory(access_log=True)
    agent = running.token("alpha.one.v1")
    with _Capture(ACCESS_LOGGER, JsonFormatter()) as capture:
        await running.register(registration("alpha.one.v1"), token=agent)
        status, _ = await running.call("GET", "/v1/agents/nobody.here.v1")
        assert status == 404
        await wait_for(lambda: len(capture.lines()) >= 2, timeout_s=5, message="two access lines")
    first, second = (json.loads(line) for line in capture.lines()[:2])
    assert first["logger"] == ACCESS_LOGGER and first["level"] == "INFO" and first["ts"].endswith("Z")
    assert (first["method"], first["route"], first["status"], first["caller"]) == ("POST", "/v1/agents", 201,
                                                                                 "alpha.one.v1")
    assert first["message"] == "POST /v1/agents 201" and first["duration_ms"] >= 0
    assert (second["path"], second["route"], second["status"]) == ("/v1/agents/nobody.here.v1",
                                                                    "/v1/agents/{agent_id}", 404)


async def test_no_access_log_unless_asked(node) -> None:
    with _Capture(ACCESS_LOGGER, JsonFormatter()) as capture:
        await node.call("GET", "/v1/agents")
    assert capture.lines() == []


async def test_a_request_cannot_write_lines_of_its_own_into_the_text_log(node_factory) -> None:
    # The access line is "{method} {path} {status}" with the path percent-decoded: a request for
    # /v1/x%0a<a line of its own> (no token needed: refusals are logged too) wrote that line into
    # the text log as if the node had, e.g. an admin's key rotation answered 200.
    running = await node_factory(access_log=True)
    forged = "2026-12-01 10:00:00,000 INFO agent_reach.access: POST /v1/admin/keys/rotate 200"
    path = "/v1/agents/x%0a" + forged.replace(" ", "%20") + "%0d%E2%80%A8%1b[31m"
    with _Capture(ACCESS_LOGGER, TextFormatter()) as capture:
        async with running.session.get(URL(path, encoded=True)) as response:
            assert response.status == 401
        await wait_for(lambda: capture.lines(), timeout_s=5, message="the access line")
    (line,) = capture.lines()
    assert "GET /v1/agents/x\\n2026-12-01 10:00:00,000 INFO" in line and " status=401 " in line
    assert "\\r\\u2028\\x1b[31m" in line, line
    record = logging.LogRecord("agent_reach.x", logging.ERROR, __file__, 1, "said %s", ("a\nb",), None)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    head, *traceback = TextFormatter().format(record).splitlines()
    assert head.endswith("agent_reach.x: said a\\nb") and traceback[0] == "Traceback (most recent call last):"


def test_text_format_shows_fields_and_json_masks_credentials() -> None:
    record = logging.LogRecord("agent_reach.access", logging.INFO, __file__, 1, "GET /x 200", None, None)
    setattr(record, FIELDS, {"status": 200, "route": "/x"})
    assert TextFormatter().format(record).endswith("agent_reach.access: GET /x 200 status=200 route=/x")
    with _Capture("agent_reach.test", JsonFormatter()) as capture:
        capture.logger.warning("cannot reach %s", "redis://user:hunter2@10.0.0.5:6379/0")
        try:
            raise RuntimeError("boom at redis://user:hunter2@10.0.0.5:6379/0")
        except RuntimeError:
            capture.logger.exception("failed")
    warning, failure = (json.loads(line) for line in capture.lines())
    assert "hunter2" not in warning["message"] and warning["level"] == "WARNING"
    assert "RuntimeError" in failure["exception"] and "hunter2" not in failure["exception"]


async def test_decision_log_joins_decisions_and_outcomes_by_trace_id(node_factory, tmp_path: Path) -> None:
    sink = tmp_path / "logs" / "decisions.jsonl"
    running = await node_factory(decision_log=str(sink))
    await running.register(registration("ocr.reader.v1", capability="ocr.image"))
    caller = running.token("report.writer.v1", TokenRole.CALLER)
    status, ticket = await running.resolve(token=caller, capability="ocr.image", trace_id="trace-log-0001")
    assert status == 200
    status, _ = await running.call("POST", "/v1/reports", token=caller, json={
        "signature": ticket["signature"], "agent_id": "ocr.reader.v1", "outcome": "success", "latency_ms": 12.5})
    assert status == 200
    status, _ = await running.resolve(token=caller, capability="nobody.offers", trace_id="trace-log-0002")
    assert status == 404
    lines = [json.loads(line) for line in sink.read_text().splitlines()]
    decision, outcome, refusal = lines
    assert decision == {**decision, "kind": "decision", "trace_id": "trace-log-0001", "result": "ok",
                        "agent_id": "ocr.reader.v1", "caller": "report.writer.v1", "match": "exact",
                        "capability": "ocr.image", "ticket_id": ticket["ticket_id"], "locality": "local"}
    assert outcome == {**outcome, "kind": "outcome", "trace_id": "trace-log-0001", "outcome": "success",
                       "ticket_id": ticket["ticket_id"], "latency_ms": 12.5, "agent_id": "ocr.reader.v1"}
    assert refusal == {**refusal, "kind": "decision", "trace_id": "trace-log-0002",
                       "result": "no_agent_available", "capability": "nobody.offers"}
    status, body = await running.call("GET", "/v1/agents/ocr.reader.v1/decisions")
    assert status == 200 and [entry["kind"] for entry in body["decisions"]] == ["outcome", "decision"]


def test_node_command_logs_json_with_the_access_log_from_the_environment(tmp_path: Path) -> None:
    """``agent-reach node --log-format json`` with AGENT_REACH_ACCESS_LOG=true: every stderr line is a
    JSON object, the request made shows as an access line."""
    env = {**os.environ, "AGENT_REACH_SECRET": "logs-test-secret-0123456789", "AGENT_REACH_ACCESS_LOG": "true",
           "AGENT_REACH_DECISION_LOG": str(tmp_path / "decisions.jsonl")}
    stderr = tmp_path / "stderr.log"
    with stderr.open("w") as err:
        process = subprocess.Popen([AGENT_REACH, "node", "--log-format", "json", "--region", "logs", "--port", "0",
                                    "--no-semantic", "--ephemeral"], env=env, stdout=subprocess.PIPE, stderr=err,
                                   text=True, start_new_session=True)
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        assert "url=http://127.0.0.1:" in line, line
        url = line.split("url=")[1].split()[0]
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
            assert response.status == 200
        deadline = time.monotonic() + 10
        while '"/healthz"' not in stderr.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        process.terminate()
        process.wait(timeout=20)
    records = [json.loads(text) for text in stderr.read_text().splitlines() if text.strip()]
    assert records, "the node logged nothing"
    access = [record for record in records if record["logger"] == ACCESS_LOGGER]
    assert [(record["path"], record["status"]) for record in access] == [("/healthz", 200)]
    assert any("serving" in record["message"] for record in records if record["logger"] == "node.service")
