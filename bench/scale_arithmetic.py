"""The federation's arithmetic: what each node applies, reads and holds, for 3–50 regions of 10k–1M agents.

Sizes come from the code: a typical record (the one ``bench/scale.py`` registers) is encoded as the
publisher encodes it — a ``FederationMessage`` of an upsert ``ChangeEvent``, of a delete, of a
``RegionBeacon`` and the parts of a ``RegionSummary`` (``federation.summary.summary_parts``) —
and each Kafka record is counted as key + value + headers (the record batch's own ~70 bytes per
batch are left out). Memory per record is the node RSS ``bench/scale.py`` measured (README
sizing: about 8 KiB per agent registered over HTTP, 5.7 KiB loaded at start; 1.7 KiB of that
is live objects), given by ``--rss-per-record-kib``.

What is assumed, not measured (each a flag): agents heartbeat every 10 s and nine in ten of
those heartbeats carry a new load (the issue measured 487 changes in 500); every agent causes one
registration, deregistration, expiry or status change per hour (``--churn-per-agent-hour``);
a capability has 100 agents per region (``--agents-per-capability``); beacons and summaries go
once a second (the defaults of ``beacon_interval_ms`` and ``summary_interval_ms``).

Modes: **before** (every load change is a full-record event to every peer), **after full**
(load stays home: only churn travels, plus beacons and summaries), **after depth D**
(``replicate_depth = D``: full records of D peers, summaries of the rest).

Run from the repository root: ``.venv/bin/python -m bench.scale_arithmetic`` (prints the table
``docs/SCALE.md`` quotes; ``--markdown`` prints it as Markdown).
"""

from __future__ import annotations

import argparse
import math
import tracemalloc
from dataclasses import asdict, dataclass

from federation.events import FederationMessage, RegionBeacon
from federation.summary import summary_parts
from node.core.models import AgentRecord, Capability, CapabilitySummary, ChangeEvent, ChangeKind, DeleteReason

REGIONS = (3, 20, 50)
AGENTS = (10_000, 100_000, 1_000_000)
GIB = 2**30
MEMORY_LIMIT_GB = 16  # the target: 16 GB per node (decimal, like a machine's size)


def kafka_bytes(message: FederationMessage) -> int:
    """One Kafka record of ``message``: key + value + headers, as the publisher sends it."""
    return len(message.key()) + len(message.encode()) + sum(len(k) + len(v) for k, v in message.headers())


def typical_record() -> AgentRecord:
    """The record ``bench/scale.py`` registers (its per-record memory is this record's)."""
    now = 1_780_000_000_000
    return AgentRecord(agent_id="scale.pool17.a123456", region="eu-west", display_name="agent 123456",
                       description="an agent of the scale benchmark",
                       capabilities=[Capability(name="cap.c17", version="1")],
                       endpoints={"primary": "http://10.20.30.40:10000/invoke"}, lease_ttl_ms=30_000, weight=100,
                       max_concurrency=10, version=123_456, registered_at_ms=now, updated_at_ms=now,
                       lease_expires_at_ms=now + 30_000)


@dataclass(frozen=True, slots=True)
class Sizes:
    record_json: int     # the record's JSON (what the Redis hash and a snapshot hold per agent)
    upsert: int          # a registration, a status change, before: a load change
    delete: int          # a deregistration or expiry (its tombstone follows: key + headers only)
    tombstone: int
    beacon: int
    summary_per_capability: float  # bytes of summary message per capability (parts included)
    summary_object: float          # bytes of memory per capability summary held by each peer


def measure_sizes() -> Sizes:
    record = typical_record()
    upsert = FederationMessage.of_change(ChangeEvent(kind=ChangeKind.UPSERT, region=record.region,
                                                     version=record.version, agent_id=record.agent_id,
                                                     at_ms=record.updated_at_ms, record=record))
    delete = FederationMessage.of_change(ChangeEvent(kind=ChangeKind.DELETE, region=record.region,
                                                     version=record.version + 1, agent_id=record.agent_id,
                                                     at_ms=record.updated_at_ms, reason=DeleteReason.EXPIRED))
    beacon = FederationMessage.of_beacon(RegionBeacon(region=record.region, watermark=10**9, live_count=10**6,
                                                      digest="0123456789abcdef", sent_at_ms=record.updated_at_ms))
    count = 10_000
    tracemalloc.start()
    capabilities = [CapabilitySummary(name=f"scale.capability{n}", total=100, healthy=97, weight=9_700.0,
                                      load=412, capacity=1_000, versions={"1": 60, "2": 37}) for n in range(count)]
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    parts = summary_parts(record.region, capabilities, watermark=10**9, agents=10**6, generation=10**6,
                          sent_at_ms=record.updated_at_ms)
    summary = sum(kafka_bytes(FederationMessage.of_summary(part)) for part in parts)
    return Sizes(record_json=len(record.model_dump_json()), upsert=kafka_bytes(upsert), delete=kafka_bytes(delete),
                 tombstone=len(record.agent_id) + len(upsert.headers()[0][0]) + len(upsert.headers()[0][1]),
                 beacon=kafka_bytes(beacon), summary_per_capability=summary / count, summary_object=held / count)


@dataclass(frozen=True, slots=True)
class Assumptions:
    heartbeat_s: float = 10.0
    load_change_fraction: float = 0.9
    churn_per_agent_hour: float = 1.0
    agents_per_capability: int = 100
    beacons_per_s: float = 1.0
    summaries_per_s: float = 1.0
    rss_per_record_kib: float = 8.0


@dataclass(frozen=True, slots=True)
class Row:
    mode: str
    regions: int
    agents: int
    events_per_s: float        # what one node applies: peers' changes, beacons, summary parts
    change_topic_bps: float    # bytes/s on one region's change topic
    summary_topic_bps: float   # bytes/s on one region's summary topic (0 before)
    read_bps: float            # bytes/s one node's consumer reads from every peer topic it follows
    records: int               # full records one node holds (its own region's and the replicated)
    memory_gib: float          # those records x RSS per record, plus the summaries held
    snapshot_mib: float        # one region's snapshot (anti-entropy, cold start): its records' JSON


def rows(sizes: Sizes, assume: Assumptions, *, depths: tuple[int, ...]) -> list[Row]:
    found: list[Row] = []
    for regions in REGIONS:
        for agents in AGENTS:
            peers = regions - 1
            churn = agents * assume.churn_per_agent_hour / 3600
            load_changes = agents / assume.heartbeat_s * assume.load_change_fraction
            # churn: half of it upserts (registrations, status changes), half deletes with their tombstones
            churn_bps = churn * (sizes.upsert + sizes.delete + sizes.tombstone) / 2
            capabilities = math.ceil(agents / assume.agents_per_capability)
            summary_bps = capabilities * sizes.summary_per_capability * assume.summaries_per_s
            summary_parts_per_s = max(1, math.ceil(summary_bps / assume.summaries_per_s / (256 * 1024))) \
                * assume.summaries_per_s
            beacon_bps = sizes.beacon * assume.beacons_per_s
            snapshot = agents * sizes.record_json / 2**20
            rss = assume.rss_per_record_kib * 1024
            before_topic = load_changes * sizes.upsert + churn_bps
            found.append(Row("before", regions, agents,
                             events_per_s=peers * (load_changes + churn * 1.5 + assume.beacons_per_s),
                             change_topic_bps=before_topic, summary_topic_bps=0.0,
                             read_bps=peers * (before_topic + beacon_bps), records=regions * agents,
                             memory_gib=regions * agents * rss / GIB, snapshot_mib=snapshot))
            summary_memory = peers * capabilities * sizes.summary_object
            for depth in (None, *depths):
                replicated = peers if depth is None else min(depth, peers)
                if depth is not None and depth >= peers:
                    continue  # the same as full replication
                found.append(Row(
                    "after full" if depth is None else f"after depth {depth}", regions, agents,
                    events_per_s=replicated * churn * 1.5 + peers * (assume.beacons_per_s + summary_parts_per_s),
                    change_topic_bps=churn_bps, summary_topic_bps=summary_bps,
                    read_bps=replicated * churn_bps + peers * (beacon_bps + summary_bps),
                    records=(1 + replicated) * agents,
                    memory_gib=((1 + replicated) * agents * rss + summary_memory) / GIB, snapshot_mib=snapshot))
    return found


def _rate(bps: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= size:
            return f"{bps / size:.1f} {unit}"
    return f"{bps:.0f} B/s"


def table(found: list[Row], *, markdown: bool) -> str:
    header = ["regions", "agents/region", "mode", "events/s applied per node", "change topic", "summary topic",
              "read per node", "records per node", "memory per node", "snapshot of a region"]
    lines = []
    for row in found:
        fits = " ✓" if row.memory_gib * GIB <= MEMORY_LIMIT_GB * 1e9 else ""
        lines.append([str(row.regions), f"{row.agents:,}", row.mode, f"{row.events_per_s:,.0f}",
                      _rate(row.change_topic_bps), _rate(row.summary_topic_bps) if row.summary_topic_bps else "-",
                      _rate(row.read_bps), f"{row.records:,}", f"{row.memory_gib:,.1f} GiB{fits}",
                      f"{row.snapshot_mib:,.0f} MiB"])
    if markdown:
        return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                         + ["| " + " | ".join(line) + " |" for line in lines])
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True))
                     for line in [header, *lines])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Assumptions()
    for name, value in asdict(defaults).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    parser.add_argument("--depths", type=int, nargs="*", default=[2, 1, 0], help="replicate_depth values shown")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    assume = Assumptions(**{name: getattr(args, name) for name in asdict(defaults)})
    sizes = measure_sizes()
    print(f"measured: record JSON {sizes.record_json} B; Kafka records (key + value + headers): upsert "
          f"{sizes.upsert} B, delete {sizes.delete} B + tombstone {sizes.tombstone} B, beacon {sizes.beacon} B, "
          f"summary {sizes.summary_per_capability:.0f} B per capability; a peer holds "
          f"{sizes.summary_object:.0f} B per capability summary")
    print(f"assumed: heartbeat every {assume.heartbeat_s:g} s, {assume.load_change_fraction:.0%} with a new load; "
          f"{assume.churn_per_agent_hour:g} registration/deregistration/expiry/status change per agent-hour; "
          f"{assume.agents_per_capability} agents per capability; beacons {assume.beacons_per_s:g}/s, summaries "
          f"{assume.summaries_per_s:g}/s; {assume.rss_per_record_kib:g} KiB node RSS per record held; "
          f"✓ = within {MEMORY_LIMIT_GB} GB\n")
    print(table(rows(sizes, assume, depths=tuple(args.depths)), markdown=args.markdown))


if __name__ == "__main__":
    main()
