"""Keeping child processes alive: restart what dies on its own, with exponential backoff.

A :class:`Supervisor` owns one watcher task per child (a node process, an embedded Redis or
broker). When the child dies without being asked to, the watcher says so in one line, waits
(0.5 s, doubling per failure up to 10 s; back to 0.5 s once a child stayed up 30 s) and
starts it again on the same address; a start that fails is retried the same way, quoting the
child's log once per streak. A deliberate stop (``stop()``/``aclose()`` of a service, the
launcher's ``stop_node``) is never undone: the watcher only restarts what still *needs* it.

A watcher that fails with an unexpected error is not silent: :meth:`Supervisor.wait_failed`
returns its exception (``agent-reach up`` stops on it) and it is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..embedded import EmbeddedKafka, EmbeddedRedis, EmbeddedState
from ..errors import TopologyError
from ..process import ChildExit

__all__ = [
    "DEFAULT_INITIAL_BACKOFF_S",
    "DEFAULT_MAX_BACKOFF_S",
    "DEFAULT_STABLE_AFTER_S",
    "Child",
    "RestartPolicy",
    "ServiceChild",
    "Supervisor",
    "keep_alive",
]

log = logging.getLogger(__name__)

DEFAULT_INITIAL_BACKOFF_S = 0.5
DEFAULT_MAX_BACKOFF_S = 10.0
DEFAULT_STABLE_AFTER_S = 30.0
# How often an embedded server's process is polled: subprocess.Popen offers no async wait.
SERVICE_POLL_INTERVAL_S = 0.1

Say = Callable[[str], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class RestartPolicy:
    """How long to wait before restarting a child: ``initial_backoff_s`` doubling per failure up
    to ``max_backoff_s``; the count starts over once a child stayed up ``stable_after_s``."""

    initial_backoff_s: float = DEFAULT_INITIAL_BACKOFF_S
    max_backoff_s: float = DEFAULT_MAX_BACKOFF_S
    stable_after_s: float = DEFAULT_STABLE_AFTER_S

    def __post_init__(self) -> None:
        for name in ("initial_backoff_s", "max_backoff_s", "stable_after_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"RestartPolicy.{name} must be positive, got {value!r}")
        if self.initial_backoff_s > self.max_backoff_s:
            raise ValueError(f"RestartPolicy.initial_backoff_s ({self.initial_backoff_s}) must not exceed "
                             f"max_backoff_s ({self.max_backoff_s})")

    def backoff_s(self, failures: int) -> float:
        """The wait before the next start after ``failures`` consecutive failures (0: the first)."""
        return min(self.max_backoff_s, self.initial_backoff_s * 2 ** min(failures, 32))


class Child(Protocol):
    """What a watcher needs of a child."""

    @property
    def name(self) -> str:
        """Who it is, for the log line: ``"the node of region us-east"``."""
        ...

    async def wait_for_death(self) -> ChildExit | None:
        """Return how the child died on its own, or None once it was stopped for good."""
        ...

    def needs_restart(self) -> bool:
        """Whether it is still down and still wanted (no one stopped or started it meanwhile)."""
        ...

    async def restart(self) -> int:
        """Start it again (same address) and return its pid; raises TopologyError if it fails."""
        ...


async def keep_alive(child: Child, *, policy: RestartPolicy, say: Say) -> None:
    """Watch ``child`` until it is stopped for good, restarting it whenever it dies on its own."""
    failures = 0
    while True:
        up_since = time.monotonic()
        death = await child.wait_for_death()
        if death is None:
            return
        if time.monotonic() - up_since >= policy.stable_after_s:
            failures = 0
        delay_s = policy.backoff_s(failures)
        say(f"{child.name}: {death.describe()}; restarting it in {delay_s:.1f} s")
        quoted_log = False
        while True:
            await asyncio.sleep(delay_s)
            failures += 1
            if not child.needs_restart():
                break
            try:
                pid = await child.restart()
            except TopologyError as exc:
                delay_s = policy.backoff_s(failures)
                reason, _, details = str(exc).partition("\n")
                say(f"{child.name} did not start again: {reason}; next try in {delay_s:.1f} s")
                if details and not quoted_log:  # its log tail: once per streak, not every few seconds
                    say(f"{child.name}: {details}")
                    quoted_log = True
                continue
            say(f"{child.name} is back (pid {pid})")
            break


class Supervisor:
    """Owns the watcher tasks of a set of children; ``aclose()`` cancels them (idempotent)."""

    def __init__(self, *, policy: RestartPolicy | None = None, say: Say | None = None) -> None:
        self.policy = policy or RestartPolicy()
        self._say = say or log.warning
        self._tasks: set[asyncio.Task[None]] = set()
        self._failed: asyncio.Future[BaseException] | None = None
        self._closed = False

    def watch(self, child: Child) -> asyncio.Task[None]:
        """Start watching ``child``; cancel the returned task to stop (``stop_watching``)."""
        if self._closed:
            raise RuntimeError("the supervisor was closed")
        task = asyncio.create_task(keep_alive(child, policy=self.policy, say=self._say), name=f"keep {child.name}")
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    async def stop_watching(self, task: asyncio.Task[None] | None) -> None:
        """Cancel one watcher and wait for it (it may be restarting its child: that is undone)."""
        if task is None or task.done():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def wait_failed(self) -> BaseException:
        """Wait until a watcher fails with an unexpected error; returns that error."""
        return await self._failure_future()

    async def aclose(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _failure_future(self) -> asyncio.Future[BaseException]:
        if self._failed is None:
            self._failed = asyncio.get_running_loop().create_future()
        return self._failed

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is None:
            return
        log.error("%s failed; that child is no longer supervised", task.get_name(), exc_info=error)
        future = self._failure_future()
        if not future.done():
            future.set_result(error)


class ServiceChild:
    """An embedded Redis or broker as a :class:`Child`: polled for death, revived by ``start()``."""

    def __init__(self, service: EmbeddedRedis | EmbeddedKafka, name: str) -> None:
        self.service = service
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    async def wait_for_death(self) -> ChildExit | None:
        while True:
            if self.service.state is EmbeddedState.CLOSED:
                return None
            death = self.service.reap_if_exited()
            if death is not None:
                return death
            await asyncio.sleep(SERVICE_POLL_INTERVAL_S)

    def needs_restart(self) -> bool:
        return self.service.state is EmbeddedState.FAILED

    async def restart(self) -> int:
        await self.service.start()
        pid = self.service.pid
        if pid is None:  # start() returned, so it runs; a pid of None would be a bug in it
            raise TopologyError(f"{self._name} started without a process")
        return pid
