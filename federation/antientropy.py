"""Anti-entropy: when a peer's replica may have diverged, pull the peer's snapshot and reconcile.

Triggers (all from the consumer): a beacon whose watermark this region has not reached, or
whose count/digest disagrees with the replica at that watermark; a gap in the peer's versions;
the broker losing data (a partition's end offset fell below the applied offset); and the very
first start of a region's consumer (bootstrap). The same path heals a new node, a broker that
lost its data and a long partition.

Reconciling with a snapshot at watermark ``W`` (``GET /v1/federation/snapshot`` of the peer's
node, authenticated with a peer token signed by the shared cluster secret): records newer in
the snapshot are written, replica records the snapshot lacks and that are not newer than ``W``
are dropped, and ``W`` becomes the replica's floor — events at or below it are covered and
refused from then on. Records the replica holds at a version above ``W`` (changes that arrived
after the snapshot was taken) are kept. A snapshot whose watermark is below what this region
already read means the peer's history restarted (its Redis lost its data): the replica is then
replaced wholesale. The reconcile is one Redis script (see ``federation.replica_store``).

Requests are coalesced per peer and rate-limited to one pull per ``anti_entropy_min_interval_ms``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import orjson
from pydantic import ValidationError

from node.core import StoreUnavailable, first_problem, now_ms
from node.core.models import Snapshot

from .config import FederationConfig
from .errors import SnapshotUnavailable
from .replica import PeerCatalog
from .replica_store import ReconcileResult, ReplicaStore
from .snapshot_reader import SnapshotTooLarge, read_snapshot

log = logging.getLogger(__name__)

SNAPSHOT_PATH = "/v1/federation/snapshot"


@dataclass(slots=True)
class AntiEntropyStats:
    runs: int = 0
    failures: int = 0
    last_reason: dict[str, str] = field(default_factory=dict)
    last_error: dict[str, str] = field(default_factory=dict)
    last_duration_ms: dict[str, float] = field(default_factory=dict)


class AntiEntropy:
    """Snapshot pulls and reconciles for one region's replica; an async context manager.

    ``token`` returns a bearer token the peers accept (a peer token of the cluster secret);
    ``renew_token``, called when a peer refuses it (401: revoked, or ended), mints the next one,
    which the pull is tried again with once.
    """

    def __init__(self, config: FederationConfig, *, catalog: PeerCatalog, replica_store: ReplicaStore,
                 token: Callable[[], str], ssl_context: ssl.SSLContext | bool = True,
                 renew_token: Callable[[], object] | None = None) -> None:
        self.config = config
        self.ssl_context = ssl_context  # what a peer's https node is checked against
        self.catalog = catalog
        self.replica_store = replica_store
        self.token = token
        self.renew_token = renew_token
        self.stats = AntiEntropyStats()
        self._pending: dict[str, str] = {}
        self._last_attempt: dict[str, float] = {}
        self._wakeup = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AntiEntropy:
        # A snapshot is read as it arrives: the peer must keep sending (a silence of
        # snapshot_timeout_ms ends it), and the whole read has a deadline and a size cap of its own.
        silence = self.config.snapshot_timeout_ms / 1000
        timeout = aiohttp.ClientTimeout(total=self.config.snapshot_deadline_ms / 1000, sock_connect=silence,
                                        sock_read=silence)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(ssl=self.ssl_context))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def request(self, peer: str, reason: str) -> None:
        """Ask for a reconcile of ``peer`` (coalesced with any pending request); a summary-only
        peer (beyond ``replicate_depth``) has no replica to reconcile and is skipped."""
        if not self.config.replicates(peer):
            return
        if peer not in self._pending:
            log.info("region %s: anti-entropy with %s requested: %s", self.config.region, peer, reason)
        self._pending.setdefault(peer, reason)
        self._wakeup.set()

    @property
    def pending(self) -> dict[str, str]:
        return dict(self._pending)

    async def run(self) -> None:
        """Serve requests until cancelled; a failed pull is retried after the minimum interval."""
        interval_s = self.config.anti_entropy_min_interval_ms / 1000
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            now = time.monotonic()
            due = [peer for peer in self._pending if now - self._last_attempt.get(peer, -interval_s) >= interval_s]
            if not due:
                wait_s = min(self._last_attempt[peer] + interval_s for peer in self._pending) - now
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), timeout=max(0.001, wait_s))
                except TimeoutError:
                    pass
                continue
            for peer in due:
                reason = self._pending.pop(peer)
                try:
                    await self.sync(peer, reason=reason)
                except asyncio.CancelledError:
                    raise
                except (SnapshotUnavailable, StoreUnavailable) as exc:
                    self._pending.setdefault(peer, reason)
                    log.warning("region %s: anti-entropy with %s failed (%s); retrying", self.config.region, peer, exc)

    async def sync(self, peer: str, *, reason: str, offset: tuple[str, int] | None = None) -> ReconcileResult:
        """Pull ``peer``'s snapshot and reconcile now; ``offset`` is stored in the same transaction.

        Raises :class:`SnapshotUnavailable` or :class:`StoreUnavailable`.
        """
        self._last_attempt[peer] = time.monotonic()
        self.stats.last_reason[peer] = reason
        started = time.perf_counter()
        try:
            snapshot = await self.fetch_snapshot(peer)
            replica = self.catalog.peer(peer)
            reset = snapshot.watermark < replica.seen_version
            if reset:
                log.warning("region %s: %s's snapshot is at version %d, below the %d already read: its history "
                            "restarted; replacing the replica", self.config.region, peer, snapshot.watermark,
                            replica.seen_version)
            at = now_ms()
            async with self.replica_store.committing(peer):  # in memory in Redis's order (the consumer too)
                result = await self.replica_store.reconcile(peer, snapshot, now_ms=at, reset=reset, offset=offset)
                if not reset:
                    # A reset is applied by the feed's reload entry, in order with what preceded it. The
                    # whole snapshot goes to memory: what Redis holds already but memory lacks heals too.
                    self.catalog.committed_reconcile(peer, records=snapshot.agents, evicted=result.evicted,
                                                     watermark=snapshot.watermark, floor=result.floor,
                                                     seen=result.seen, runs=result.runs, at_ms=at)
        except (SnapshotUnavailable, StoreUnavailable) as exc:
            self.stats.failures += 1
            self.stats.last_error[peer] = str(exc)
            raise
        self.stats.runs += 1
        self.stats.last_error.pop(peer, None)
        elapsed_ms = (time.perf_counter() - started) * 1000
        self.stats.last_duration_ms[peer] = round(elapsed_ms, 2)
        log.info("region %s: reconciled %s at version %d in %.1f ms (%s): %d written, %d dropped",
                 self.config.region, peer, snapshot.watermark, elapsed_ms, reason, len(result.put),
                 len(result.evicted))
        return result

    def _bad_record(self, peer: str) -> Callable[[int, str | None, str], None]:
        def quarantine(position: int, agent_id: str | None, problem: str) -> None:
            self.replica_store.quarantine.add("snapshot", f"{peer} snapshot agents[{position}]", problem,
                                              agent_id=agent_id)
        return quarantine

    def _own_records(self, peer: str, snapshot: Snapshot) -> Snapshot:
        """``snapshot`` without the records of another region (quarantined): a peer's snapshot
        lists its own agents, and the router addresses a record's region as it says."""
        kept = []
        for record in snapshot.agents:
            if record.region == peer:
                kept.append(record)
            else:
                self.replica_store.quarantine.add("snapshot", f"{peer} snapshot {record.agent_id}@{record.region}",
                                                  f"a record of region {record.region} in the snapshot of {peer}",
                                                  agent_id=record.agent_id)
        return snapshot if len(kept) == len(snapshot.agents) else snapshot.model_copy(update={"agents": kept})

    async def fetch_snapshot(self, peer: str) -> Snapshot:
        """The snapshot from the first node of ``peer`` that serves it; raises SnapshotUnavailable."""
        if self._session is None:
            raise SnapshotUnavailable("anti-entropy is not started: use it as an async context manager")
        problems = []
        urls = list(self.config.peer(peer).node_urls)
        renewed = self.renew_token is None
        while urls:
            url = urls.pop(0)
            try:
                async with self._session.get(url.rstrip("/") + SNAPSHOT_PATH,
                                             headers={"Authorization": f"Bearer {self.token()}"}) as response:
                    if response.status == 401 and not renewed:  # revoked or ended: once more with a new one
                        renewed = True
                        self.renew_token()  # type: ignore[misc]
                        urls.insert(0, url)
                        problems.append(f"{url}: HTTP 401 {(await response.read())[:200]!r} (token renewed)")
                        continue
                    if response.status != 200:
                        problems.append(f"{url}: HTTP {response.status} {(await response.read())[:200]!r}")
                        continue
                    # Parsed a record at a time as it arrives (federation.snapshot_reader).
                    snapshot = await read_snapshot(response.content.iter_any(), bad_record=self._bad_record(peer),
                                                   max_bytes=self.config.snapshot_max_bytes)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                problems.append(f"{url}: {exc!r}")
                continue
            except SnapshotTooLarge as exc:
                problems.append(f"{url}: {exc}")
                continue
            except (ValidationError, orjson.JSONDecodeError) as exc:
                detail = first_problem(exc).message if isinstance(exc, ValidationError) else str(exc)
                problems.append(f"{url}: the snapshot does not parse ({detail})")
                continue
            if snapshot.region != peer:
                problems.append(f"{url}: serves region {snapshot.region}, not {peer} (check the topology)")
                continue
            return self._own_records(peer, snapshot)
        raise SnapshotUnavailable(f"no node of region {peer} served its snapshot: {'; '.join(problems)}")
