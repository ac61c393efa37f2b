"""How long the event loop stalls, and how much of it is the garbage collector.

Every request of a node shares one event loop: anything that holds it (a long synchronous
step, a full garbage collection over millions of objects) is latency for every request in
flight. :class:`LoopWatch` measures it from the inside:

- a task that asks to wake every ``interval_ms`` and records how late it woke (the loop's lag:
  0 when idle, the length of the stall when something held the loop);
- ``gc.callbacks``: the duration of every collection, by generation.

Both feed histograms on the node's metrics (``agent_reach_event_loop_lag_seconds``,
``agent_reach_gc_pause_seconds``) and the gauge of the longest stall over the last
``window_s`` (``agent_reach_event_loop_max_stall_seconds``), and :meth:`LoopWatch.snapshot`
for benchmarks. The cost is one wake-up per interval (20 per second by default).

:func:`tune_gc` is what the node does about the collector: records live as long as the
process, so after the start-up load they are frozen out of collections (``gc.freeze``) and the
thresholds are raised, so full collections, which walk every tracked object, come about a tenth
as often.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Gauge, Histogram

from ..core import cancel_and_wait

__all__ = ["DEFAULT_INTERVAL_MS", "FreezeOnGrowth", "LoopWatch", "collector_paused", "release_free_memory", "tune_gc"]

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_MS = 50
_STALL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# The standard thresholds are (700, 10, 10). Measured on registrations at ~3k/s into a
# 10,000-agent region (bench.peers' register, p99; loop watch's pauses): the standard ones ran
# nine full collections of ~230 ms in 8 s (p99 277 ms); (20000, 20, 20) one full and one
# 180 ms middle collection (p99 47-190 ms); (5000, 10, 100) makes full collections about ten
# times rarer while keeping the middle ones at ~30 ms (p99 22-44 ms).
GC_THRESHOLDS = (5_000, 10, 100)
DEFAULT_FREEZE_STEP = 200  # records registered between two freezes (FreezeOnGrowth)
# Records registered between two returns of the C allocator's free pages (FreezeOnGrowth). Measured
# (bench.scale's 100,000 registrations over HTTP, one sitting): RSS 1,924 B per agent without,
# 1,861 with a step of 10,000 and 1,825 with 2,000 — 47 trims of 0.9-7.2 ms, 57 ms in all.
DEFAULT_TRIM_STEP = 2_000


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection inside, and what is alive at the end frozen out of collections
    (``gc.freeze``; the collector's previous state after). For a region's load at start: every
    full collection walks all the records parsed so far — half of the load time of 50,000
    records went to it — and so did the first collection after the pause, over everything made
    in it (0.4 s after 300,000 records, and :func:`tune_gc`'s walk, 0.5 s, after that). The
    records live as long as the process; what was garbage before the pause is collected when it
    starts (a walk over the few objects of a process starting), and the cyclic garbage the load
    made, if any, is kept."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def tune_gc() -> None:
    """Freeze what is alive now out of future collections and collect less often (see module doc);
    what the start-up load freed goes back to the system (:func:`release_free_memory`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    release_free_memory()


def release_free_memory() -> bool:
    """Hand the C allocator's free pages back to the system (glibc's ``malloc_trim(0)``).

    Python returns freed small-object arenas itself, but the larger blocks (dicts, lists, long
    strings) come from malloc, whose free pages inside the heap stay resident until trimmed: after
    registering 100,000 agents ~160 B per agent of RSS was such slack. The call walks the free
    lists (1-7 ms at that size) and frees nothing that is in use. False where there is no glibc.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim with
        return None


def freeze_long_lived() -> None:
    """Move everything alive now out of the collector's reach, without a collection first.

    For a bulk of objects made after start-up that live as long as the process — the embedding
    model, loaded when the first text is indexed. Left in the young generations, the next full
    collection (:class:`FreezeOnGrowth`'s, 200 registrations later) walked torch's and the
    model's objects and held the loop ~300 ms: bench.federation's propagation p99 at 100
    changes/s was 264–318 ms in the first run after start, 15 ms with this. Collecting first, as
    :func:`tune_gc` does, would be that same walk; the cyclic garbage the load left is kept.
    """
    gc.freeze()


class FreezeOnGrowth:
    """Freeze again once the records held have grown by ``step`` since the last freeze.

    Records registered after start-up land in the oldest generation, which every full collection
    walks: at 100,000 agents registered over HTTP a full collection holds the loop for tens of
    milliseconds. When ``count()`` has grown by ``step`` since the last freeze, :meth:`check` runs
    one full collection (so what is frozen is live: cyclic garbage is collected first, not kept)
    and ``gc.freeze()``: the collector never walks those objects again, and they are still freed
    by reference counting when their records go (records hold no cycles).

    That collection walks what was allocated since the last freeze, so its pause is proportional
    to the step, whatever the region's size: the step is small and fixed, and the loop watch
    checks on every sample (20 times a second). Measured (bench.peers' register, 10,000 agents,
    ~2,400 registrations/s): checked once a second with a step of a tenth of the records, each
    freeze held the loop 60–85 ms — and a tenth of 1,000,000 records would have held it seconds.
    Every ``trim_step`` records, a freeze also hands the allocator's free pages back to the system
    (:func:`release_free_memory`). Process-wide: the command line turns it on (``agent-reach
    node``), not a library.
    """

    def __init__(self, count: Callable[[], int], *, step: int = DEFAULT_FREEZE_STEP,
                 trim_step: int = DEFAULT_TRIM_STEP) -> None:
        self.count = count
        self.step = step
        self.trim_step = trim_step
        self.frozen_at = self.trimmed_at = count()
        self.freezes = 0
        self.trims = 0

    def check(self) -> bool:
        held = self.count()
        if held - self.frozen_at < self.step:
            if held < self.frozen_at:
                self.frozen_at = held  # records went: grow from here
                self.trimmed_at = min(self.trimmed_at, held)
            return False
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        self.frozen_at = held
        self.freezes += 1
        if held - self.trimmed_at >= self.trim_step and release_free_memory():
            self.trimmed_at = held
            self.trims += 1
        log.debug("%d records held: froze the collector's view after %.1f ms", held,
                  (time.perf_counter() - started) * 1000)
        return True


class LoopWatch:
    """Samples the running loop's lag and the collector's pauses; ``start()`` / ``aclose()``.

    With :attr:`freezer` set (a :class:`FreezeOnGrowth`), it is checked on every sample.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, interval_ms: int = DEFAULT_INTERVAL_MS,
                 window_s: float = 60.0) -> None:
        self.interval_s = interval_ms / 1000
        self.window_s = window_s
        self.max_lag_s = 0.0
        self.gc_pauses = {0: 0, 1: 0, 2: 0}
        self.max_gc_pause_s = 0.0
        self._recent: deque[tuple[float, float]] = deque()  # (when, lag) of the stalls in the window
        self._gc_started = 0.0
        self._task: asyncio.Task[None] | None = None
        self.freezer: FreezeOnGrowth | None = None
        self._lag = self._pauses = None
        if registry is not None:
            self._lag = Histogram("agent_reach_event_loop_lag_seconds",
                                  "How late the event loop ran a timer due now (a stall holds every request)",
                                  buckets=_STALL_BUCKETS_S, registry=registry)
            self._pauses = Histogram("agent_reach_gc_pause_seconds", "Garbage collector pauses, by generation",
                                     ["generation"], buckets=_STALL_BUCKETS_S, registry=registry)
            Gauge("agent_reach_event_loop_max_stall_seconds", f"The longest event-loop stall in the last {window_s:g} s",
                  registry=registry).set_function(self.recent_max_stall_s)

    def start(self) -> None:
        if self._task is None:
            gc.callbacks.append(self._on_gc)
            self._task = asyncio.create_task(self._sample(), name="loop-watch")

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
            gc.callbacks.remove(self._on_gc)

    def recent_max_stall_s(self) -> float:
        horizon = time.monotonic() - self.window_s
        return max((lag for when, lag in self._recent if when >= horizon), default=0.0)

    def snapshot(self) -> dict[str, float]:
        return {"max_lag_ms": self.max_lag_s * 1000, "recent_max_stall_ms": self.recent_max_stall_s() * 1000,
                "max_gc_pause_ms": self.max_gc_pause_s * 1000,
                **{f"gc{generation}": float(count) for generation, count in self.gc_pauses.items()}}

    async def _sample(self) -> None:
        while True:
            if self.freezer is not None:
                self.freezer.check()
            due = time.monotonic() + self.interval_s
            await asyncio.sleep(self.interval_s)
            now = time.monotonic()
            lag = max(0.0, now - due)
            self.max_lag_s = max(self.max_lag_s, lag)
            if self._lag is not None:
                self._lag.observe(lag)
            if lag >= 0.001:
                self._recent.append((now, lag))
            while self._recent and self._recent[0][0] < now - self.window_s:
                self._recent.popleft()

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        pause = time.perf_counter() - self._gc_started
        generation = info.get("generation", 0)
        self.gc_pauses[generation] = self.gc_pauses.get(generation, 0) + 1
        self.max_gc_pause_s = max(self.max_gc_pause_s, pause)
        if self._pauses is not None:
            self._pauses.labels(str(generation)).observe(pause)
