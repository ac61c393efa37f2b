"""HTTP hygiene of the node's server over raw sockets: slow heads, idle keep-alive, the connection
cap, malformed requests (JSON answers, throttled one-line logs) and a long /v1/watch stream."""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time

import orjson
import pytest

from node.http import bound_port

from ..conftest import NodeFactory
from ..helpers import RunningNode, registration, wait_for

pytestmark = pytest.mark.timeout(60)

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n"
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def connect(node: RunningNode) -> Connection:
    return await asyncio.open_connection("127.0.0.1", bound_port(node.runner))


async def close(connection: Connection) -> None:
    writer = connection[1]
    writer.close()
    try:
        await writer.wait_closed()
    except ConnectionError:
        pass  # the node closed first


async def read_response(reader: asyncio.StreamReader, *, timeout_s: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length body: status, lower-cased headers, body."""
    async with asyncio.timeout(timeout_s):
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        status_line, *lines = head.rstrip("\r\n").split("\r\n")
        headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(status_line.split()[1]), headers, body


async def request(connection: Connection, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = connection
    writer.write(raw)
    await writer.drain()
    return await read_response(reader)


async def wait_closed_by_node(reader: asyncio.StreamReader, *, timeout_s: float) -> bytes:
    """Everything the node sends until it closes the connection (fails after ``timeout_s``)."""
    received = b""
    async with asyncio.timeout(timeout_s):
        try:
            while chunk := await reader.read(65_536):
                received += chunk
        except ConnectionResetError:
            pass
    return received


def parse_raw_response(raw: bytes) -> tuple[int, dict[str, str], object]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    assert headers.get("content-type", "").startswith("application/json"), (status_line, headers, body)
    return int(status_line.split()[1]), headers, orjson.loads(body)


def metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def metrics_text(node: RunningNode) -> str:
    status, body = await node.call("GET", "/metrics")
    assert status == 200
    return body


async def test_a_slow_request_head_is_cut_at_the_header_timeout_while_others_are_served(
        node_factory: NodeFactory) -> None:
    node = await node_factory(header_read_timeout_ms=300, keepalive_timeout_ms=20_000)
    reader, writer = await connect(node)
    started = time.monotonic()

    async def dribble() -> None:
        # slowloris: a byte every 50 ms, so the head would take ~2 s to arrive
        for byte in b"GET /healthz HTTP/1.1\r\nHost: node\r\nX-Slow: 1\r\n\r\n":
            if reader.at_eof():
                return
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                return
            await asyncio.sleep(0.05)

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(dribble())
        status, body = await node.call("GET", "/healthz")  # another connection is served meanwhile
        assert status == 200 and body["status"] == "ok"
        received = await wait_closed_by_node(reader, timeout_s=5)
    elapsed_s = time.monotonic() - started
    await close((reader, writer))
    assert 0.25 <= elapsed_s < 1.5, elapsed_s  # dribbling bytes does not restart the clock
    status, headers, error = parse_raw_response(received)
    assert status == 408 and error["error"] == "request_timeout" and headers["connection"] == "close", error
    assert metric(await metrics_text(node), "agent_reach_http_header_timeouts_total") == 1


async def test_on_keep_alive_the_head_clock_starts_at_the_first_byte_of_the_next_request(
        node_factory: NodeFactory) -> None:
    node = await node_factory(header_read_timeout_ms=300, keepalive_timeout_ms=20_000)
    connection = await connect(node)
    status, _, _ = await request(connection, HEALTHZ)
    assert status == 200
    # Idle longer than the header timeout: keep-alive, not the head clock, governs this wait —
    # for twice the header timeout the node neither sends anything nor closes the connection.
    reader, writer = connection
    with pytest.raises(TimeoutError):
        unexpected = await asyncio.wait_for(reader.read(1), timeout=0.6)
        pytest.fail(f"the idle connection got {unexpected!r} (b'' = closed by the node)")
    status, _, _ = await request(connection, HEALTHZ)
    assert status == 200
    writer.write(b"GET /healthz HTTP/1.1\r\n")  # half a head, then nothing
    started = time.monotonic()
    received = await wait_closed_by_node(reader, timeout_s=5)
    elapsed_s = time.monotonic() - started
    await close(connection)
    assert 0.25 <= elapsed_s < 1.5, elapsed_s
    assert parse_raw_response(received)[0] == 408


async def test_an_idle_keep_alive_connection_is_closed_after_the_keepalive_timeout(
        node_factory: NodeFactory) -> None:
    node = await node_factory(keepalive_timeout_ms=300, header_read_timeout_ms=20_000)
    connection = await connect(node)
    status, headers, _ = await request(connection, HEALTHZ)
    assert status == 200 and headers.get("connection", "keep-alive").lower() != "close"
    answered = time.monotonic()
    received = await wait_closed_by_node(connection[0], timeout_s=5)
    elapsed_s = time.monotonic() - answered
    await close(connection)
    assert received == b""
    assert 0.25 <= elapsed_s < 2.0, elapsed_s


async def test_connections_beyond_max_connections_are_refused_and_existing_ones_unaffected(
        node_factory: NodeFactory) -> None:
    node = await node_factory(max_connections=3, header_read_timeout_ms=20_000)
    held = [await connect(node) for _ in range(3)]
    for _, writer in held:  # each in the middle of a request head: busy, none idle
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        await writer.drain()

    async def counted_open() -> bool:  # the node has taken all three (accepts are asynchronous)
        async with node.session.get("/metrics") as response:  # a 4th connection: it would be refused
            return response.status == 503
    await wait_for(counted_open, timeout_s=5, message="the node holding three connections")

    extra = await connect(node)
    started = time.monotonic()
    received = await wait_closed_by_node(extra[0], timeout_s=2)
    assert time.monotonic() - started < 1.0
    await close(extra)
    status, headers, error = parse_raw_response(received)
    assert status == 503 and error["error"] == "too_many_connections" and headers["retry-after"] == "1", error
    assert "none of them idle" in error["message"], error

    # The held connections still work (their heads completed), and the refusal was counted.
    for connection in held:
        connection[1].write(b"Host: node\r\n\r\n")
        assert (await read_response(connection[0]))[0] == 200
    status, _, body = await request(held[0], b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
    text = body.decode()
    assert status == 200 and metric(text, "agent_reach_http_connections_refused_total") >= 2, text
    assert metric(text, "agent_reach_http_open_connections") == 3

    # Now all three are idle on keep-alive: a new connection is served, and the one idle longest
    # (held[1]: held[0] answered /metrics since) is closed for it — its client reconnects at no
    # cost, where a refusal would have cost a request.
    newcomer = await connect(node)
    assert (await request(newcomer, HEALTHZ))[0] == 200
    assert await wait_closed_by_node(held[1][0], timeout_s=5) == b""
    status, _, body = await request(newcomer, b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
    assert status == 200 and metric(body.decode(), "agent_reach_http_connections_evicted_total") >= 1
    for connection in (*held, newcomer):
        await close(connection)


GARBAGE = random.Random(7).randbytes(300)
MALFORMED = {
    "bad_http": (b"GET /healthz HTTP/1.1\r\nHost: node\r\nX-Evil: a\x00b\r\n\r\n", 400, "bad_request"),  # NUL
    "request_line_too_long": (b"GET /" + b"a" * 9_000 + b" HTTP/1.1\r\nHost: node\r\n\r\n", 414,
                              "request_line_too_long"),
    "header_too_large": (b"GET /healthz HTTP/1.1\r\nHost: node\r\nX-Big: " + b"b" * 9_000 + b"\r\n\r\n", 431,
                         "header_fields_too_large"),
    "bad_method": (GARBAGE, 400, "bad_request"),
}


async def send_malformed(node: RunningNode, raw: bytes) -> bytes:
    connection = await connect(node)
    try:
        connection[1].write(raw)
        await connection[1].drain()
        return await wait_closed_by_node(connection[0], timeout_s=5)
    finally:
        await close(connection)


async def test_malformed_requests_get_json_errors_and_one_log_line_per_kind(
        node_factory: NodeFactory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    node = await node_factory(http_error_log_interval_ms=60_000)
    for kind, (raw, expected_status, expected_code) in MALFORMED.items():
        status, headers, error = parse_raw_response(await send_malformed(node, raw))
        assert status == expected_status and error["error"] == expected_code, (kind, status, error)
        assert set(error) >= {"error", "message", "field"} and error["field"] is None, error
        answers = await asyncio.gather(*(send_malformed(node, raw) for _ in range(50)))
        assert all(parse_raw_response(answer)[0] == expected_status for answer in answers), kind

    assert "Traceback" not in caplog.text
    assert not [record for record in caplog.records if record.exc_info or record.name.startswith("aiohttp")], \
        [(record.name, record.getMessage()) for record in caplog.records if record.exc_info]
    server_lines = [record for record in caplog.records if record.name == "node.http.server"]
    for kind in MALFORMED:
        lines = [record for record in server_lines if f"({kind}," in record.getMessage()]
        assert len(lines) == 1, (kind, [record.getMessage() for record in lines])
        assert lines[0].levelno == logging.WARNING and "\n" not in lines[0].getMessage()
    text = await metrics_text(node)
    for kind in MALFORMED:
        assert metric(text, "agent_reach_http_malformed_requests_total", f'{{kind="{kind}"}}') == 51, kind


async def test_the_throttled_log_reports_how_many_lines_it_left_out(
        node_factory: NodeFactory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="node.http.server")
    node = await node_factory(http_error_log_interval_ms=300)
    raw = MALFORMED["bad_http"][0]
    await asyncio.gather(*(send_malformed(node, raw) for _ in range(20)))

    def lines() -> list[str]:
        return [record.getMessage() for record in caplog.records
                if record.name == "node.http.server" and "(bad_http," in record.getMessage()]

    async def a_second_line() -> bool:
        await send_malformed(node, raw)
        return len(lines()) >= 2

    await wait_for(a_second_line, timeout_s=5, interval_s=0.05, message="a second throttled line")
    assert re.search(r"\((\d+) more like it since the last line\)$", lines()[1]), lines()


async def test_a_watch_stream_outlives_the_header_and_keepalive_timeouts(node_factory: NodeFactory) -> None:
    node = await node_factory(header_read_timeout_ms=200, keepalive_timeout_ms=200)
    lines: list[str] = []

    async def watch() -> None:
        async with node.session.get("/v1/watch", headers=node.headers()) as response:
            assert response.status == 200
            async for line in response.content:
                lines.append(line.decode())

    async with asyncio.TaskGroup() as tasks:
        watcher = tasks.create_task(watch())
        await wait_for(lambda: any("event: hello" in line for line in lines), message="watch hello")
        opened = time.monotonic()
        agent = 0
        while time.monotonic() - opened < 1.0:  # five header timeouts
            agent += 1
            agent_id = f"lang.translate.watch{agent}"
            await node.register(registration(agent_id))
            await wait_for(lambda: any(f'"agent_id":"{agent_id}"' in line for line in lines), timeout_s=5,
                           message=f"change event of {agent_id}")
            await asyncio.sleep(0.1)  # pacing: let the stream age, not synchronisation
        assert not watcher.done()
        watcher.cancel()
    assert agent >= 3


async def test_a_slow_body_gets_408_and_a_vanished_client_no_traceback(
        node_factory: NodeFactory, caplog: pytest.LogCaptureFixture) -> None:
    node = await node_factory(body_read_timeout_ms=300)
    head = (b"POST /v1/agents HTTP/1.1\r\nHost: node\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + node.admin_token.encode() + b"\r\nContent-Length: 500\r\n\r\n")
    connection = await connect(node)
    started = time.monotonic()
    connection[1].write(head + b'{"agent_id": ')  # and never the rest
    status, _, body = await read_response(connection[0], timeout_s=5)
    assert status == 408 and orjson.loads(body)["error"] == "request_timeout", body
    assert time.monotonic() - started < 3
    await close(connection)

    caplog.set_level(logging.DEBUG)
    for _ in range(5):  # the client sends half a body and goes away
        connection = await connect(node)
        connection[1].write(head + b'{"agent_id": "a.b.c"')
        await connection[1].drain()
        await close(connection)
    status, _ = await node.call("GET", "/healthz")
    assert status == 200
    assert not [record for record in caplog.records if record.exc_info or "Traceback" in record.getMessage()]
