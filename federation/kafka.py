"""Kafka clients as the federation uses them, and the translation of their errors.

Every client carries the config's :class:`~federation.security.KafkaSecurity` (TLS, SASL).
:func:`check_access` is what ``Federation.start()`` runs once: a wrong CA, client certificate,
password or right is one :class:`~federation.errors.KafkaAccessDenied` line naming the cause,
where the clients themselves would only log "Unable to bootstrap" and retry for ever.

Only produce, fetch, metadata and admin create-topics are used, so the same code runs against
real Kafka and the embedded Tansu broker (see ``topology.embedded`` for how it behaves).
Region topics are created explicitly with ONE partition before anyone touches them: a client
that asks for metadata of a missing topic makes the broker auto-create it with its default
partition count. An existing topic is not an error (code 36 in the response).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import create_conn
from aiokafka.errors import (
    IllegalSaslStateError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from .config import FederationConfig
from .errors import BrokerUnavailable, KafkaAuthenticationFailed, KafkaHandshakeFailed, KafkaNotAuthorized
from .security import KafkaSecurity

log = logging.getLogger(__name__)

TOPIC_PARTITIONS = 1
PRODUCER_MAX_BATCH_BYTES = 1024 * 1024
PARTITION = 0
_TOPIC_ALREADY_EXISTS = 36
_NOT_AUTHORIZED = {29: "TOPIC_AUTHORIZATION_FAILED", 31: "CLUSTER_AUTHORIZATION_FAILED"}


def make_producer(config: FederationConfig) -> AIOKafkaProducer:
    """A producer that waits for every replica (``acks="all"``) and sends at once (no linger)."""
    return AIOKafkaProducer(
        **config.security.client_options().kwargs(),
        bootstrap_servers=config.bootstrap_servers,
        client_id=f"agent-reach-publisher-{config.region}",
        acks="all",
        enable_idempotence=config.enable_idempotence,
        linger_ms=0,
        # One request per broker is in flight, carrying one batch per partition: with the
        # default 16 KiB batches a region topic moves ~13 changes per round trip, which caps it
        # near 1,000 changes/s under load. Batches up to 1 MiB keep the single partition fed.
        max_batch_size=PRODUCER_MAX_BATCH_BYTES,
        request_timeout_ms=config.request_timeout_ms,
        retry_backoff_ms=config.retry_backoff_ms,
    )


def make_consumer(config: FederationConfig, *, fetch_max_wait_ms: int | None = None) -> AIOKafkaConsumer:
    """A group-less consumer for manual assignment; offsets live in Redis, never in Kafka.
    ``fetch_max_wait_ms`` defaults to the config's (what change propagation needs)."""
    return AIOKafkaConsumer(
        **config.security.client_options().kwargs(),
        bootstrap_servers=config.bootstrap_servers,
        client_id=f"agent-reach-consumer-{config.region}",
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=fetch_max_wait_ms or config.fetch_max_wait_ms,
        request_timeout_ms=config.request_timeout_ms,
        retry_backoff_ms=config.retry_backoff_ms,
    )


async def ensure_topics(config: FederationConfig, topics: Sequence[str]) -> list[str]:
    """Create the topics that do not exist (one partition each); returns those it created.

    Raises :class:`BrokerUnavailable` when the broker cannot be reached or refuses,
    :class:`KafkaNotAuthorized` when this client may not create them.
    """
    admin = AIOKafkaAdminClient(**config.security.client_options().kwargs(),
                                bootstrap_servers=config.bootstrap_servers,
                                client_id=f"agent-reach-admin-{config.region}",
                                request_timeout_ms=config.request_timeout_ms)
    try:
        await admin.start()
        response = await admin.create_topics(
            [NewTopic(topic, num_partitions=TOPIC_PARTITIONS, replication_factor=1) for topic in topics])
    except KafkaError as exc:
        raise BrokerUnavailable(f"cannot create topics {', '.join(topics)} on {config.bootstrap_servers}: "
                                f"{exc!r}") from exc
    finally:
        try:
            await admin.close()
        except KafkaError:
            pass
    created = []
    for topic, code, *_ in response.topic_errors:
        if code == 0:
            created.append(topic)
        elif code in _NOT_AUTHORIZED:
            raise KafkaNotAuthorized(f"Kafka at {config.bootstrap_servers} does not let {_principal(config.security)} "
                                     f"create topic {topic} ({_NOT_AUTHORIZED[code]}): grant it Create, Describe, "
                                     f"Read and Write on the topics '{config.topic_prefix}.*', or create them "
                                     "beforehand with one partition each")
        elif code != _TOPIC_ALREADY_EXISTS:
            raise BrokerUnavailable(f"the broker refused to create topic {topic} (Kafka error code {code}); "
                                    "check that the topic prefix is a legal topic name and that this client may "
                                    "create topics")
    return created


async def check_access(config: FederationConfig) -> None:
    """Connect to the first bootstrap server that answers, with the configured TLS and SASL, then create
    this region's own topics: what a wrong setting breaks, it breaks here, once, by name.

    Raises :class:`KafkaHandshakeFailed`, :class:`KafkaAuthenticationFailed`, :class:`KafkaNotAuthorized`
    (all :class:`~federation.errors.KafkaAccessDenied`) and ``KafkaSettingsInvalid``. A broker that
    cannot be reached is not an error here: it is logged, and the duties retry until it answers.
    """
    options = config.security.client_options()
    unreachable: list[str] = []
    for host, port in bootstrap_addresses(config.bootstrap_servers):
        try:
            connection = await create_conn(
                host, port, client_id=f"agent-reach-check-{config.region}",
                request_timeout_ms=config.request_timeout_ms, ssl_context=options.ssl_context,
                security_protocol=options.security_protocol, sasl_mechanism=options.sasl_mechanism,
                sasl_plain_username=options.sasl_username, sasl_plain_password=options.sasl_password)
        except (OSError, KafkaError, asyncio.TimeoutError, KeyError, ValueError) as exc:
            denied = access_denied(exc, host=host, port=port, security=config.security)
            if denied is not None:
                raise denied from exc
            unreachable.append(f"{host}:{port} ({exc or type(exc).__name__})")
            continue
        connection.close()
        region = config.region
        await ensure_topics(config, [config.topic(region), config.beacon_topic(region), config.summary_topic(region)])
        return
    log.warning("region %s: no Kafka broker answered at start (%s); the federation keeps trying", config.region,
                "; ".join(unreachable))


def bootstrap_addresses(servers: str) -> list[tuple[str, int]]:
    """``host:port[,host:port]`` as pairs (``[v6]:port`` too; 9092 when no port is given)."""
    addresses = []
    for server in filter(None, (part.strip() for part in servers.split(","))):
        host, _, port = server.rpartition(":") if server.rpartition(":")[2].isdigit() else (server, "", "9092")
        addresses.append((host.strip("[]"), int(port)))
    return addresses


def access_denied(exc: BaseException, *, host: str, port: int,
                  security: KafkaSecurity) -> KafkaHandshakeFailed | KafkaAuthenticationFailed | None:
    """What ``exc`` (raised while connecting to ``host:port``) says about the settings, or None if it is an
    outage (refused, timed out, closed): a failed TLS handshake or a refused SASL authentication."""
    where = f"Kafka broker {host}:{port}"
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ssl.SSLError) and security.tls:
        return KafkaHandshakeFailed(f"TLS handshake with {where} failed: {_tls_problem(cause, security)}")
    mechanism, user = security.sasl_mechanism, security.sasl_username
    source = (f"file {security.sasl_password_file}" if security.sasl_password_file is not None
              else f"variable {security.sasl_password_env}")
    if isinstance(exc, UnsupportedSaslMechanismError):
        return KafkaAuthenticationFailed(f"SASL authentication with {where} failed: it does not offer {mechanism} "
                                         f"({exc}); set kafka sasl_mechanism to one it offers")
    if isinstance(exc, SaslAuthenticationFailed | IllegalSaslStateError) or (
            security.sasl and isinstance(exc, KeyError | ValueError)):  # aiokafka's SCRAM step, on a refusal
        detail = exc.args[0] if isinstance(exc, KafkaError) and exc.args else type(exc).__name__
        return KafkaAuthenticationFailed(f"SASL authentication as {user!r} ({mechanism}) with {where} failed "
                                         f"({detail}); check kafka sasl_username and the password in {source}")
    return None


def _tls_problem(error: ssl.SSLError, security: KafkaSecurity) -> str:
    if isinstance(error, ssl.SSLCertVerificationError):
        message = error.verify_message or error.reason or str(error)
        if "hostname" in message.lower() or "ip address mismatch" in message.lower():
            return (f"the broker's certificate does not name the address it was reached by ({message}); connect "
                    "by a name the certificate holds, or set kafka ssl_check_hostname = false")
        trusted = f"kafka ssl_cafile {security.ssl_cafile}" if security.ssl_cafile else "the system's CA bundle"
        return (f"certificate verify failed ({message}): the broker's certificate is not signed by a CA in "
                f"{trusted}; set ssl_cafile to the CA that signed it")
    reason = (error.reason or str(error)).upper()
    if "CERTIFICATE_REQUIRED" in reason or (security.ssl_certfile is None and "HANDSHAKE_FAILURE" in reason):
        return (f"the broker requires a client certificate ({error.reason}); set kafka ssl_certfile and "
                "ssl_keyfile (mutual TLS)")
    if any(alert in reason for alert in ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "DECRYPT_ERROR")):
        return (f"the broker refused this client's certificate ({error.reason}); give an ssl_certfile signed by a CA "
                "the broker trusts")
    if "WRONG_VERSION_NUMBER" in reason or "UNEXPECTED_EOF" in reason or "EOF" in reason:
        return (f"the listener does not speak TLS ({error.reason or error}); check kafka security_protocol and the "
                "port of bootstrap_servers")
    return f"{error.reason or error}; check kafka security_protocol and the ssl_* settings"


def _principal(security: KafkaSecurity) -> str:
    if security.sasl:
        return f"user {security.sasl_username!r}"
    return "this client's certificate" if security.ssl_certfile is not None else "this client"
