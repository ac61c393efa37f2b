"""Embedded Redis and Kafka broker: real processes, real clients, nothing left behind."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from topology.embedded import (
    DataDirError,
    EmbeddedKafka,
    EmbeddedRedis,
    EmbeddedServiceError,
    EmbeddedState,
)

CLIENT_DEADLINE_S = 5.0


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def occupied_port() -> Iterator[int]:
    """A loopback port held by a listening socket that is not Redis or Kafka."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture
async def kafka() -> AsyncIterator[EmbeddedKafka]:
    async with EmbeddedKafka() as broker:
        yield broker


async def create_topic(bootstrap_servers: str, name: str, *, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()
    assert [(topic, code) for topic, code, _ in response.topic_errors] == [(name, 0)]


async def list_topics(bootstrap_servers: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
    await admin.start()
    try:
        return sorted(await admin.list_topics())
    finally:
        await admin.close()


# -- Redis ------------------------------------------------------------------------------------


async def test_redis_answers_set_get_and_stop_leaves_no_process() -> None:
    server = EmbeddedRedis()
    async with server:
        pid = server.pid
        assert pid is not None and process_exists(pid)
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = aioredis.from_url(server.url)
        try:
            assert await client.set("greeting", "hello")
            assert await client.get("greeting") == b"hello"
            assert await client.config_get("save") == {"save": ""}
            assert await client.config_get("appendonly") == {"appendonly": "no"}
        finally:
            await client.aclose()
    assert server.state is EmbeddedState.CLOSED
    assert server.pid is None
    assert not process_exists(pid)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()


async def test_redis_restart_keeps_port_and_forgets_data() -> None:
    async with EmbeddedRedis() as server:
        port, first_pid = server.port, server.pid
        before = aioredis.from_url(server.url)
        try:
            await before.set("survives", "no")
        finally:
            await before.aclose()

        await server.restart()

        assert server.port == port
        assert server.pid != first_pid
        after = aioredis.from_url(server.url)
        try:
            assert await after.get("survives") is None
        finally:
            await after.aclose()


def test_redis_sync_start_and_stop() -> None:
    server = EmbeddedRedis()
    server.start_sync()
    try:
        pid = server.pid
        assert pid is not None
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        client.close()
    finally:
        server.stop_sync()
    assert server.state is EmbeddedState.STOPPED
    assert not process_exists(pid)


async def test_redis_on_an_occupied_port_fails_naming_the_port(occupied_port: int) -> None:
    server = EmbeddedRedis(port=occupied_port, startup_timeout_s=5.0)
    with pytest.raises(EmbeddedServiceError, match=rf"Redis .*127\.0\.0\.1:{occupied_port}") as failure:
        await server.start()
    assert "Address already in use" in str(failure.value)  # the server's own output is quoted
    assert server.pid is None


async def test_lifecycle_rules() -> None:
    server = EmbeddedRedis()
    with pytest.raises(EmbeddedServiceError, match="start"):
        server.port
    await server.start()
    try:
        with pytest.raises(EmbeddedServiceError, match="already running"):
            await server.start()
    finally:
        await server.aclose()
    await server.aclose()  # idempotent
    with pytest.raises(EmbeddedServiceError, match="closed"):
        await server.start()


@pytest.mark.unit
def test_config_is_keyword_only_and_validated() -> None:
    with pytest.raises(TypeError):
        EmbeddedRedis(6379)  # type: ignore[misc]
    with pytest.raises(ValueError, match="port"):
        EmbeddedKafka(port=70_000)
    with pytest.raises(ValueError, match="startup_timeout_s"):
        EmbeddedRedis(startup_timeout_s=0)


# -- Kafka ------------------------------------------------------------------------------------


async def test_kafka_produces_and_consumes_with_manual_assignment() -> None:
    broker = EmbeddedKafka()
    async with broker:
        pid = broker.pid
        assert pid is not None and process_exists(pid)
        assert broker.bootstrap_servers == f"127.0.0.1:{broker.port}"
        await create_topic(broker.bootstrap_servers, "reach.changes.eu", partitions=2)

        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap_servers, acks="all", enable_idempotence=False
        )
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False, fetch_max_wait_ms=20
        )
        await producer.start()
        await consumer.start()
        try:
            sent = await producer.send_and_wait("reach.changes.eu", b"upsert", key=b"a.b.c", partition=1)
            partition = TopicPartition("reach.changes.eu", 1)
            consumer.assign([partition])
            consumer.seek(partition, 0)
            async with asyncio.timeout(CLIENT_DEADLINE_S):
                message = await consumer.getone()
            received = (message.partition, message.offset, message.key, message.value)
            assert received == (1, sent.offset, b"a.b.c", b"upsert")
            assert await consumer.end_offsets([partition]) == {partition: 1}
        finally:
            await producer.stop()
            await consumer.stop()
    assert broker.state is EmbeddedState.CLOSED
    assert not process_exists(pid)


async def test_kafka_restart_on_same_port_forgets_topics(kafka: EmbeddedKafka) -> None:
    bootstrap_servers, first_pid = kafka.bootstrap_servers, kafka.pid
    await create_topic(bootstrap_servers, "reach.changes.us", partitions=1)
    assert await list_topics(bootstrap_servers) == ["reach.changes.us"]

    await kafka.restart()

    assert kafka.bootstrap_servers == bootstrap_servers
    assert kafka.pid != first_pid and first_pid is not None and not process_exists(first_pid)
    assert await list_topics(bootstrap_servers) == []


async def test_kafka_on_an_occupied_port_fails_naming_the_port(occupied_port: int) -> None:
    broker = EmbeddedKafka(port=occupied_port, startup_timeout_s=5.0)
    with pytest.raises(EmbeddedServiceError, match=rf"Kafka broker .*127\.0\.0\.1:{occupied_port}"):
        await broker.start()
    assert broker.pid is None


async def test_missing_broker_binary_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALF_TANSU_BIN", "/nonexistent/tansu")
    with pytest.raises(EmbeddedServiceError, match=r"agent-reach\[embedded\]"):
        await EmbeddedKafka().start()


async def test_broker_that_never_answers_times_out_and_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    silent_broker = tmp_path / "silent-broker"
    silent_broker.write_text('#!/bin/sh\necho "silent broker pid $$" >&2\nexec sleep 30\n')
    silent_broker.chmod(0o755)
    monkeypatch.setenv("CALF_TANSU_BIN", str(silent_broker))
    broker = EmbeddedKafka(startup_timeout_s=0.3)

    expected = r"Kafka broker did not answer on 127\.0\.0\.1:\d+ within 0\.3 s"
    with pytest.raises(EmbeddedServiceError, match=expected) as failure:
        await broker.start()

    quoted_output = re.search(r"silent broker pid (\d+)", str(failure.value))
    assert quoted_output is not None
    assert not process_exists(int(quoted_output.group(1)))
    assert broker.pid is None and broker.state is EmbeddedState.NEW


async def test_cancelled_start_kills_the_half_started_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    silent_broker = tmp_path / "silent-broker"
    silent_broker.write_text("#!/bin/sh\nexec sleep 30\n")
    silent_broker.chmod(0o755)
    monkeypatch.setenv("CALF_TANSU_BIN", str(silent_broker))
    broker = EmbeddedKafka()
    starting = asyncio.create_task(broker.start())
    async with asyncio.timeout(CLIENT_DEADLINE_S):
        while broker.pid is None:
            await asyncio.sleep(0.005)
    pid = broker.pid

    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting

    assert not process_exists(pid)
    assert broker.pid is None


def test_kafka_sync_start_and_stop() -> None:
    broker = EmbeddedKafka()
    broker.start_sync()
    try:
        pid = broker.pid
        assert pid is not None
        assert asyncio.run(list_topics(broker.bootstrap_servers)) == []
    finally:
        broker.stop_sync()
    assert broker.state is EmbeddedState.STOPPED
    assert not process_exists(pid)


# -- Redis with a data dir --------------------------------------------------------------------


async def test_redis_with_a_data_dir_keeps_its_data_across_restart_and_kill(tmp_path: Path) -> None:
    data_dir = tmp_path / "redis-data"
    async with EmbeddedRedis(data_dir=data_dir) as server:
        client = aioredis.from_url(server.url)
        try:
            await client.set("kept", "across restarts")
            assert await client.config_get("appendonly") == {"appendonly": "yes"}
            assert await client.config_get("appendfsync") == {"appendfsync": "everysec"}
        finally:
            await client.aclose()
        port = server.port

        await server.restart()  # SIGTERM: the append-only file is flushed
        assert server.port == port

        killed_pid = server.pid
        assert killed_pid is not None
        assert server.reap_if_exited() is None  # running
        os.kill(killed_pid, signal.SIGKILL)
        async with asyncio.timeout(CLIENT_DEADLINE_S):
            while (death := server.reap_if_exited()) is None:
                await asyncio.sleep(0.01)
        assert death.pid == killed_pid and death.describe() == f"pid {killed_pid} was killed by SIGKILL"
        assert server.state is EmbeddedState.FAILED and not process_exists(killed_pid)

        await server.start()  # revived, on the same port, with its data
        assert server.state is EmbeddedState.RUNNING and server.port == port
        client = aioredis.from_url(server.url)
        try:
            assert await client.get("kept") == b"across restarts"
        finally:
            await client.aclose()
    assert (data_dir / "appendonly.aof").exists()


async def test_a_redis_data_dir_admits_one_server(tmp_path: Path) -> None:
    data_dir = tmp_path / "shared"
    async with EmbeddedRedis(data_dir=data_dir):
        second = EmbeddedRedis(data_dir=data_dir)
        with pytest.raises(DataDirError, match="in use by another agent-reach process"):
            await second.start()
        assert second.pid is None and second.state is EmbeddedState.NEW
    # Released at stop: the directory is free again.
    async with EmbeddedRedis(data_dir=data_dir) as again:
        assert again.state is EmbeddedState.RUNNING
