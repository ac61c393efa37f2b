"""A TLS- and SASL-terminating proxy in front of the embedded broker, and certificates made for it.

The embedded Tansu serves neither TLS nor a SASL exchange a test can use (see the notes in
``topology.embedded.kafka_broker``), so :class:`KafkaGateway` stands in for a hardened broker's
listener: it terminates TLS with the ``ssl`` module (``CERT_REQUIRED`` for mutual TLS), performs
the SASL exchange server-side as a Kafka broker does (SaslHandshake v1 then SaslAuthenticate
v0/v1; PLAIN, and SCRAM-SHA-256/512 per RFC 5802 with a fresh salt per exchange), answers a
failed one with SASL_AUTHENTICATION_FAILED (58) and closes, and then relays bytes to the broker.
With ``refuse_create_topics`` it answers CreateTopics with TOPIC_AUTHORIZATION_FAILED (29), as
an ACL-protected broker does for a principal without the Create right.

The broker is started with ``advertised_port`` = the gateway's port, so a client that reads the
metadata comes back through the gateway rather than around it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import hashlib
import hmac
import ipaddress
import os
import ssl
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
API_VERSIONS = 18
CREATE_TOPICS = 19
SASL_AUTHENTICATION_FAILED = 58
UNSUPPORTED_SASL_MECHANISM = 33
TOPIC_AUTHORIZATION_FAILED = 29
SCRAM_ITERATIONS = 4096
_SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


# -- certificates ------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Certificates:
    """PEM files: a CA, the broker's certificate (for 127.0.0.1 and localhost) and a client's, both
    signed by it, and a second CA that signed neither (a "wrong CA")."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(path: Path, certificate: x509.Certificate, key: ec.EllipticCurvePrivateKey | None = None,
           key_path: Path | None = None) -> None:
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    if key is not None and key_path is not None:
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, *, issuer: str, issuer_key: ec.EllipticCurvePrivateKey,
                 ca: bool = False, usage: x509.ObjectIdentifier | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if usage == ExtendedKeyUsageOID.SERVER_AUTH:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_certificates(directory: Path) -> Certificates:
    """Write a CA, a broker and a client certificate (and a CA that signed neither) into ``directory``."""
    ca_key, other_key, server_key, client_key = _key(), _key(), _key(), _key()
    files = Certificates(ca=directory / "ca.pem", server_cert=directory / "broker.pem",
                         server_key=directory / "broker.key", client_cert=directory / "client.pem",
                         client_key=directory / "client.key", other_ca=directory / "other-ca.pem")
    _write(files.ca, _certificate("test kafka ca", ca_key, issuer="test kafka ca", issuer_key=ca_key, ca=True))
    _write(files.other_ca, _certificate("other ca", other_key, issuer="other ca", issuer_key=other_key, ca=True))
    _write(files.server_cert, _certificate("kafka broker", server_key, issuer="test kafka ca", issuer_key=ca_key,
                                           usage=ExtendedKeyUsageOID.SERVER_AUTH), server_key, files.server_key)
    _write(files.client_cert, _certificate("agent-reach", client_key, issuer="test kafka ca", issuer_key=ca_key,
                                           usage=ExtendedKeyUsageOID.CLIENT_AUTH), client_key, files.client_key)
    return files


def server_context(certificates: Certificates, *, require_client_certificate: bool = False) -> ssl.SSLContext:
    """The gateway's TLS context: the broker certificate; with mutual TLS, clients' certificates are
    required and checked against the CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificates.server_cert, certificates.server_key)
    if require_client_certificate:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(certificates.ca)
    return context


# -- the Kafka wire, as much as the gateway speaks -------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Request:
    api_key: int
    api_version: int
    correlation_id: int
    body: bytes  # after the request header (v1: key, version, correlation id, client id)


def _request(frame: bytes) -> _Request:
    api_key, api_version, correlation_id, client_id_length = struct.unpack_from(">hhih", frame, 0)
    return _Request(api_key, api_version, correlation_id, frame[10 + max(client_id_length, 0):])


def _string(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def _read_string(body: bytes, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from(">h", body, offset)
    offset += 2
    return body[offset:offset + length].decode(), offset + length


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


def _framed(correlation_id: int, body: bytes) -> bytes:
    message = struct.pack(">i", correlation_id) + body
    return struct.pack(">i", len(message)) + message


def _authenticate_response(version: int, *, error: int = 0, message: str | None = None, data: bytes = b"") -> bytes:
    body = struct.pack(">h", error) + _string(message) + struct.pack(">i", len(data)) + data
    return body + (struct.pack(">q", 0) if version >= 1 else b"")


def _create_topics_refused(request: _Request) -> bytes:
    body, offset = request.body, 4
    (count,) = struct.unpack_from(">i", body, 0)
    names = []
    for _ in range(count):  # name, partitions, replication, assignments[(partition, [broker])], configs[(k, v)]
        name, offset = _read_string(body, offset)
        names.append(name)
        offset += 6
        (assignments,) = struct.unpack_from(">i", body, offset)
        offset += 4
        for _ in range(max(assignments, 0)):
            (brokers,) = struct.unpack_from(">i", body, offset + 4)
            offset += 8 + 4 * max(brokers, 0)
        (configs,) = struct.unpack_from(">i", body, offset)
        offset += 4
        for _ in range(max(configs, 0)):
            _, offset = _read_string(body, offset)
            (length,) = struct.unpack_from(">h", body, offset)
            offset += 2 + max(length, 0)
    version = request.api_version
    out = struct.pack(">i", 0) if version >= 2 else b""  # throttle_time_ms
    out += struct.pack(">i", len(names))
    for name in names:
        out += _string(name) + struct.pack(">h", TOPIC_AUTHORIZATION_FAILED)
        if version >= 1:
            out += _string("Authorization failed.")
    return out


# -- SCRAM, the server's side (RFC 5802) -----------------------------------------------------------

def _scram_attributes(message: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in message.split(",") if "=" in part)


@dataclass
class _ScramExchange:
    mechanism: str
    users: dict[str, str]
    user: str = ""
    client_first_bare: str = ""
    server_first: str = ""
    salt: bytes = field(default_factory=lambda: os.urandom(16))

    def first(self, client_first: str) -> str:
        self.client_first_bare = client_first.split(",", 2)[2]  # after the GS2 header "n,,"
        attributes = _scram_attributes(self.client_first_bare)
        self.user = attributes["n"].replace("=2C", ",").replace("=3D", "=")
        nonce = attributes["r"] + base64.b64encode(os.urandom(18)).decode()
        self.server_first = f"r={nonce},s={base64.b64encode(self.salt).decode()},i={SCRAM_ITERATIONS}"
        return self.server_first

    def final(self, client_final: str) -> str | None:
        """The server-final message, or None when the proof does not match the user's password."""
        password = self.users.get(self.user)
        without_proof, _, proof = client_final.rpartition(",p=")
        if password is None or not proof:
            return None
        name = _SCRAM_HASHES[self.mechanism]
        salted = hashlib.pbkdf2_hmac(name, password.encode(), self.salt, SCRAM_ITERATIONS)
        client_key = hmac.new(salted, b"Client Key", name).digest()
        stored_key = hashlib.new(name, client_key).digest()
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        signature = hmac.new(stored_key, auth_message, name).digest()
        recovered = bytes(a ^ b for a, b in zip(base64.b64decode(proof), signature, strict=False))
        if not hmac.compare_digest(hashlib.new(name, recovered).digest(), stored_key):
            return None
        server_key = hmac.new(salted, b"Server Key", name).digest()
        return "v=" + base64.b64encode(hmac.new(server_key, auth_message, name).digest()).decode()


# -- TLS, the server's side -------------------------------------------------------------------------

class _TlsConnection:
    """A TLS server connection over a plain stream (``ssl.MemoryBIO``), reading and writing as a stream does.

    Not asyncio's ``ssl=``: on a failed handshake it drops the connection without sending the alert
    (say, "certificate required"), where a broker sends it, and the client then sees only an EOF.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: ssl.SSLContext) -> None:
        self._reader, self._writer = reader, writer
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._buffer = bytearray()

    async def handshake(self) -> None:
        """Raises ``ssl.SSLError`` (after sending the alert) when the client's hello or certificate is refused."""
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self.drain()
                if not await self._receive():
                    raise ConnectionResetError("the client hung up during the TLS handshake") from None
            except ssl.SSLError:
                await self.drain()  # the alert, for the client to read
                raise
        await self.drain()

    async def _receive(self) -> bool:
        data = await self._reader.read(65_536)
        if data:
            self._incoming.write(data)
        else:
            self._incoming.write_eof()
        return bool(data)

    async def read(self, size: int = 65_536) -> bytes:
        if self._buffer:
            data = bytes(self._buffer[:size])
            del self._buffer[:size]
            return data
        while True:
            try:
                return self._tls.read(size)
            except ssl.SSLWantReadError:
                await self.drain()
                if not await self._receive():
                    return b""
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    async def readexactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            data = await self.read()
            if not data:
                raise asyncio.IncompleteReadError(bytes(self._buffer), size)
            self._buffer += data
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def write(self, data: bytes) -> None:
        self._tls.write(data)

    async def drain(self) -> None:
        pending = self._outgoing.read()
        if pending:
            self._writer.write(pending)
            await self._writer.drain()

    def close(self) -> None:
        self._writer.close()


# -- the gateway -----------------------------------------------------------------------------------

class KafkaGateway:
    """Listens on ``127.0.0.1:port``, terminates TLS (``tls``) and SASL (``users``: name → password), and
    relays to the broker at ``127.0.0.1:broker_port`` (which may be set after it listens). Records who
    authenticated (``authenticated``) and how many exchanges it refused (``refused``)."""

    def __init__(self, *, port: int, broker_port: int, tls: ssl.SSLContext | None = None,
                 users: dict[str, str] | None = None,
                 mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
                 refuse_create_topics: bool = False) -> None:
        self.port, self.broker_port, self.tls, self.users = port, broker_port, tls, users
        self.mechanisms, self.refuse_create_topics = mechanisms, refuse_create_topics
        self.authenticated: list[str] = []
        self.refused = 0
        self.relayed = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> KafkaGateway:
        """Listen; with ``port`` 0 on a port the kernel picks (``port`` then says which). Bound before
        the broker starts, so a port chosen free and bound later cannot be taken in between."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _handle(self, plain_reader: asyncio.StreamReader, plain_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        upstream: asyncio.StreamWriter | None = None
        reader: Any = plain_reader
        writer: Any = plain_writer
        try:
            if self.tls is not None:
                reader = writer = _TlsConnection(plain_reader, plain_writer, self.tls)
                try:
                    await writer.handshake()
                except ssl.SSLError:
                    self.refused += 1
                    return
            upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self.broker_port)
            if self.users is not None and not await self._authenticate(reader, writer, upstream_reader, upstream):
                return
            self.relayed += 1
            if self.refuse_create_topics:
                await self._relay_frames(reader, writer, upstream_reader, upstream)
            else:
                async with asyncio.TaskGroup() as group:
                    group.create_task(_pipe(reader, upstream))
                    group.create_task(_pipe(upstream_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ExceptionGroup, struct.error):
            pass  # a client or the broker hung up; so does the gateway
        finally:
            self._handlers.discard(task)
            for stream in (plain_writer, upstream):
                if stream is not None:
                    stream.close()

    async def _forward(self, frame: bytes, upstream_reader: asyncio.StreamReader,
                       upstream: asyncio.StreamWriter, writer: asyncio.StreamWriter) -> None:
        upstream.write(struct.pack(">i", len(frame)) + frame)
        answer = await _read_frame(upstream_reader)
        writer.write(struct.pack(">i", len(answer)) + answer)
        await writer.drain()

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            upstream_reader: asyncio.StreamReader, upstream: asyncio.StreamWriter) -> bool:
        """The SASL exchange before anything reaches the broker; False (connection to close) on refusal."""
        users = self.users or {}
        mechanism: str | None = None
        scram: _ScramExchange | None = None
        while True:
            frame = await _read_frame(reader)
            request = _request(frame)
            if request.api_key == API_VERSIONS:
                await self._forward(frame, upstream_reader, upstream, writer)
            elif request.api_key == SASL_HANDSHAKE:
                asked, _ = _read_string(request.body, 0)
                error = 0 if asked in self.mechanisms else UNSUPPORTED_SASL_MECHANISM
                offered = struct.pack(">i", len(self.mechanisms)) + b"".join(map(_string, self.mechanisms))
                writer.write(_framed(request.correlation_id, struct.pack(">h", error) + offered))
                await writer.drain()
                if error:
                    self.refused += 1
                    return False
                mechanism = asked
                scram = _ScramExchange(asked, users) if asked in _SCRAM_HASHES else None
            elif request.api_key == SASL_AUTHENTICATE and mechanism is not None:
                (length,) = struct.unpack_from(">i", request.body, 0)
                token = request.body[4:4 + length].decode()
                if scram is not None and not scram.server_first:
                    answer: str | None = scram.first(token)
                    user = None
                elif scram is not None:
                    answer, user = scram.final(token), scram.user
                else:
                    _, user, password = token.split("\0", 2)
                    answer = "" if users.get(user) == password else None
                if answer is None:
                    self.refused += 1
                    writer.write(_framed(request.correlation_id, _authenticate_response(
                        request.api_version, error=SASL_AUTHENTICATION_FAILED,
                        message=f"Authentication failed during authentication due to invalid credentials with "
                                f"SASL mechanism {mechanism}")))
                    await writer.drain()
                    return False
                writer.write(_framed(request.correlation_id,
                                     _authenticate_response(request.api_version, data=answer.encode())))
                await writer.drain()
                if user is not None:
                    self.authenticated.append(user)
                    return True
            else:  # anything else before authentication: a broker closes the connection
                self.refused += 1
                return False

    async def _relay_frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            upstream_reader: asyncio.StreamReader, upstream: asyncio.StreamWriter) -> None:
        """One request, then its response (no pipelining), refusing CreateTopics."""
        while True:
            frame = await _read_frame(reader)
            request = _request(frame)
            if request.api_key == CREATE_TOPICS:
                writer.write(_framed(request.correlation_id, _create_topics_refused(request)))
                await writer.drain()
            else:
                await self._forward(frame, upstream_reader, upstream, writer)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65_536):
            writer.write(data)
            await writer.drain()
    writer.close()
