"""How the federation's Kafka clients encrypt and authenticate: :class:`KafkaSecurity`.

One model, the topology's ``[kafka]`` keys and :class:`~federation.config.FederationConfig`'s
``security``, applied to every client the federation builds (producer, consumer, admin)::

    security_protocol = "SASL_SSL"              # PLAINTEXT (default), SSL, SASL_PLAINTEXT, SASL_SSL
    sasl_mechanism = "SCRAM-SHA-512"            # PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
    sasl_username = "agent-reach"
    sasl_password_file = "/run/secrets/kafka"   # or sasl_password_env = "KAFKA_PASSWORD"
    ssl_cafile = "/etc/kafka/ca.pem"            # unset: the system's trust store
    ssl_certfile = "/etc/kafka/client.pem"      # mutual TLS: this client's certificate ...
    ssl_keyfile = "/etc/kafka/client.key"       # ... and key (ssl_key_password_file / _env if encrypted)
    ssl_check_hostname = true

The model holds where secrets are, never a secret: a password is read from its file or variable
when a client is built (:meth:`KafkaSecurity.client_options`, so a rotated file is read at the
next connection) and lives only in the options handed to aiokafka, whose ``repr`` masks it.
Nothing here prints or logs a secret; :func:`mask_sasl_payloads` keeps aiokafka's own debug
log of the SASL exchange from printing a PLAIN password.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import KafkaSettingsInvalid

__all__ = ["KafkaClientOptions", "KafkaSecurity", "mask_sasl_payloads"]

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
MASK = "***"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
_SASL_KEYS = ("sasl_mechanism", "sasl_username", "sasl_password_file", "sasl_password_env")
_TLS_KEYS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_key_password_file", "ssl_key_password_env")


class KafkaSecurity(BaseModel):
    """TLS and SASL settings of the federation's Kafka clients; see the module docstring."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = Field(default=None, min_length=1)
    sasl_password_file: Path | None = Field(default=None, description="A file holding the SASL password "
                                                                      "(surrounding whitespace is dropped).")
    sasl_password_env: str | None = Field(default=None, pattern=ENV_NAME_PATTERN,
                                          description="The environment variable holding the SASL password.")
    ssl_cafile: Path | None = Field(default=None, description="PEM CA bundle the brokers' certificates are "
                                                              "checked against; unset: the system's.")
    ssl_certfile: Path | None = Field(default=None, description="PEM certificate (chain) of this client, "
                                                                "for brokers that require mutual TLS.")
    ssl_keyfile: Path | None = Field(default=None, description="PEM private key of ssl_certfile (unset: "
                                                               "the key is in ssl_certfile).")
    ssl_key_password_file: Path | None = None
    ssl_key_password_env: str | None = Field(default=None, pattern=ENV_NAME_PATTERN)
    ssl_check_hostname: bool = Field(default=True, description="Whether a broker's certificate must name the "
                                                               "host it is reached by (the chain is checked "
                                                               "either way).")

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurity:
        protocol = self.security_protocol
        if self.sasl:
            missing = [key for key in ("sasl_mechanism", "sasl_username") if getattr(self, key) is None]
            if self.sasl_password_file is None and self.sasl_password_env is None:
                missing.append("sasl_password_file or sasl_password_env")
            if missing:
                raise ValueError(f"security_protocol {protocol} needs {', '.join(missing)} (sasl_mechanism: PLAIN, "
                                 "SCRAM-SHA-256 or SCRAM-SHA-512)")
        else:
            stray = [key for key in _SASL_KEYS if getattr(self, key) is not None]
            if stray:
                raise ValueError(f"{', '.join(stray)}: set only with security_protocol SASL_PLAINTEXT or SASL_SSL "
                                 f"(it is {protocol})")
        if not self.tls:
            stray = [key for key in _TLS_KEYS if getattr(self, key) is not None]
            if not self.ssl_check_hostname:
                stray.append("ssl_check_hostname")
            if stray:
                raise ValueError(f"{', '.join(stray)}: set only with security_protocol SSL or SASL_SSL (it is "
                                 f"{protocol})")
        for secret in ("sasl_password", "ssl_key_password"):
            if getattr(self, f"{secret}_file") is not None and getattr(self, f"{secret}_env") is not None:
                raise ValueError(f"set {secret}_file or {secret}_env, not both")
        if self.ssl_certfile is None:
            stray = [key for key in _TLS_KEYS[2:] if getattr(self, key) is not None]
            if stray:
                raise ValueError(f"{', '.join(stray)}: belongs to a client certificate; set ssl_certfile too")
        return self

    def describe(self) -> dict[str, Any]:
        """What is configured, safe to show (paths and variable names; no secret is held to show)."""
        shown = self.model_dump(mode="json", exclude_none=True)
        if self.sasl:
            shown["sasl_password"] = MASK
        return shown

    def client_options(self, environ: Mapping[str, str] | None = None) -> KafkaClientOptions:
        """The aiokafka keyword arguments: secrets read, the TLS context built.

        Raises :class:`KafkaSettingsInvalid` naming the file or variable that cannot be used.
        """
        environ = os.environ if environ is None else environ
        password = None
        if self.sasl:
            password = _read_secret("sasl_password", self.sasl_password_file, self.sasl_password_env, environ)
        return KafkaClientOptions(security_protocol=self.security_protocol,
                                  ssl_context=self._ssl_context(environ) if self.tls else None,
                                  sasl_mechanism=self.sasl_mechanism, sasl_username=self.sasl_username,
                                  sasl_password=password)

    def _ssl_context(self, environ: Mapping[str, str]) -> ssl.SSLContext:
        cafile = _existing("ssl_cafile", self.ssl_cafile)
        try:
            context = ssl.create_default_context(cafile=cafile)
        except ssl.SSLError as exc:
            raise KafkaSettingsInvalid(f"kafka ssl_cafile {cafile}: not a PEM CA bundle ({exc.reason or exc}); "
                                       "give the CA certificate(s) the brokers' certificates are signed by") from None
        context.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile is not None:
            certfile = _existing("ssl_certfile", self.ssl_certfile)
            keyfile = _existing("ssl_keyfile", self.ssl_keyfile)
            key_password = None
            if self.ssl_key_password_file is not None or self.ssl_key_password_env is not None:
                key_password = _read_secret("ssl_key_password", self.ssl_key_password_file,
                                            self.ssl_key_password_env, environ)
            try:
                context.load_cert_chain(certfile, keyfile, password=key_password)
            except ssl.SSLError as exc:
                raise KafkaSettingsInvalid(
                    f"kafka ssl_certfile {certfile}{f' / ssl_keyfile {keyfile}' if keyfile else ''}: cannot load "
                    f"the client certificate ({exc.reason or exc}); give a PEM certificate and its own key "
                    "(and ssl_key_password_file or ssl_key_password_env if the key is encrypted)") from None
        return context


@dataclass(frozen=True, slots=True, kw_only=True)
class KafkaClientOptions:
    """What :meth:`KafkaSecurity.client_options` resolved; ``repr`` masks the password."""

    security_protocol: str
    ssl_context: ssl.SSLContext | None
    sasl_mechanism: str | None
    sasl_username: str | None
    sasl_password: str | None = field(repr=False)

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``AIOKafkaProducer``, ``AIOKafkaConsumer``, ``AIOKafkaAdminClient``."""
        options: dict[str, Any] = {"security_protocol": self.security_protocol, "ssl_context": self.ssl_context}
        if self.sasl_mechanism is not None:
            mask_sasl_payloads()
            options.update(sasl_mechanism=self.sasl_mechanism, sasl_plain_username=self.sasl_username,
                           sasl_plain_password=self.sasl_password)
        return options


def _existing(key: str, path: Path | None) -> str | None:
    if path is None:
        return None
    resolved = path.expanduser()
    if not resolved.is_file():
        reason = "is not a file" if resolved.exists() else "does not exist"
        raise KafkaSettingsInvalid(f"kafka {key} {resolved} {reason}; fix the path in the topology's [kafka] section")
    return str(resolved)


def _read_secret(name: str, file: Path | None, variable: str | None, environ: Mapping[str, str]) -> str:
    if variable is not None:
        value = environ.get(variable, "").strip()
        if not value:
            raise KafkaSettingsInvalid(f"kafka {name}_env: the environment variable {variable} is unset or empty; "
                                       f"export it with the password, or set {name}_file instead")
        return value
    path = _existing(f"{name}_file", file)
    try:
        value = Path(path or "").read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not text"
        raise KafkaSettingsInvalid(f"kafka {name}_file {path}: cannot read it ({reason})") from None
    if not value:
        raise KafkaSettingsInvalid(f"kafka {name}_file {path} is empty; write the password into it")
    return value


class _SaslPayloadMask(logging.Filter):
    """Replaces the SASL request aiokafka logs at DEBUG ("Request to host:port 3: SaslAuthenticateRequest_v1(
    sasl_auth_bytes=b'\\x00user\\x00password')") by its name: a PLAIN payload holds the password."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(type(arg).__name__.startswith("SaslAuthenticateRequest")
                                                  for arg in record.args):
            record.args = tuple(f"{type(arg).__name__}({MASK})" if type(arg).__name__.startswith(
                "SaslAuthenticateRequest") else arg for arg in record.args)
        return True


_MASK_FILTER = _SaslPayloadMask()


def mask_sasl_payloads() -> None:
    """Install the mask on aiokafka's connection logger (idempotent)."""
    logger = logging.getLogger("aiokafka.conn")
    if _MASK_FILTER not in logger.filters:
        logger.addFilter(_MASK_FILTER)
