"""Fixtures: a real redis-server for the whole session, nodes on it per test (unique regions).

Every test is ``unit`` (marked so: no server, socket, subprocess or model; ``make test-unit``) or
``integration`` (set here on every other test; ``pytest -m integration``).
"""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from typing import Any

import pytest

from node.config import NodeConfig
from node.core.tasks import awaiting
from node.service import RegistryNode
from topology.embedded import EmbeddedRedis

from .helpers import RunningNode, start_node

TEST_SECRET = b"test-secret-0123456789abcdef"
_regions = itertools.count()


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: it must see the marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that is not a ``unit`` test as an ``integration`` test."""
    for item in items:
        if item.get_closest_marker("unit") is None:
            item.add_marker(pytest.mark.integration)


HANG_REPORT_MARGIN_S = 20  # before pytest-timeout's limit: print what every asyncio task awaits


def _report_tasks(name: str) -> None:
    """Print the stack of every live asyncio task (pytest-timeout shows threads only: a hung test's
    main thread just sits in the selector, and what hangs is a task awaiting something)."""
    out = io.StringIO()
    out.write(f"\n+++ {name} still runs {HANG_REPORT_MARGIN_S} s before its timeout; its asyncio tasks:\n")
    for task in list(asyncio.tasks._all_tasks):  # read from another thread: a best-effort snapshot
        if task.done():
            continue
        try:
            out.write(awaiting(task) + "\n")
        except Exception as exc:  # the loop moved the coroutine on meanwhile
            out.write(f"{task!r}: stack unreadable: {exc!r}\n")
    sys.stderr.write(out.getvalue())
    sys.stderr.flush()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    limit = float(item.config.getini("timeout") or 0)
    timer = None
    if limit > HANG_REPORT_MARGIN_S:
        timer = threading.Timer(limit - HANG_REPORT_MARGIN_S, _report_tasks, args=(item.nodeid,))
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    server = EmbeddedRedis()
    server.start_sync()
    try:
        yield server.url
    finally:
        server.stop_sync()


@pytest.fixture
def region() -> str:
    """A region name no other test uses (so tests share one Redis without sharing keys)."""
    return f"t{os.getpid()}-{next(_regions)}"


NodeFactory = Callable[..., Awaitable[RunningNode]]


@pytest.fixture
async def node_factory(redis_url: str, region: str) -> AsyncIterator[NodeFactory]:
    started: list[RunningNode] = []

    async def start(*, region_name: str | None = None, **overrides: Any) -> RunningNode:
        settings: dict[str, Any] = {"region": region_name or region, "redis_url": redis_url, "port": 0,
                                    "sweep_interval_ms": 100, "lease_sync_interval_ms": 100, "leader_ttl_ms": 1_000,
                                    "egress": {"allow": ["loopback"]}}  # test agents listen on 127.0.0.1
        settings.update(overrides)
        running = await start_node(RegistryNode(NodeConfig(**settings), secret=TEST_SECRET))
        started.append(running)
        return running

    yield start
    for running in reversed(started):
        await running.aclose()


@pytest.fixture
async def node(node_factory: NodeFactory) -> RunningNode:
    return await node_factory()
