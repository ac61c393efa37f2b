"""TLS on every hop the node owns, built in one place: the node's server context
(:class:`ServerTlsSettings`) and what every client trusts and presents (:class:`ClientTlsSettings`)
— the SDK, the CLI, peers' forwarders, anti-entropy and key fetches, the node's probes and
deliveries.

Both sides refuse anything older than TLS 1.2. A client given ``ca_file`` trusts that bundle
alone (a private CA is not mixed with the system's store) and checks the server's name; without
one it keeps the system's store, as an ``aiohttp`` session does by default. The server asks for
a client certificate only when ``tls_client_ca_file`` is set, and then requires one signed by
that bundle (mutual TLS).

A file that is missing, unreadable, not PEM, or a key that does not match its certificate is a
:class:`TlsConfigError` naming the setting and the file, raised when the context is built: the
node builds its contexts before it starts serving, so such a file is a one-line start-up error.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from typing import Self

from pydantic import Field

from .settings import Settings

__all__ = ["CA_FILE_ENV", "CLIENT_CERT_FILE_ENV", "CLIENT_KEY_FILE_ENV", "MINIMUM_TLS_VERSION", "ClientTlsSettings",
           "ServerTlsSettings", "TlsConfigError"]

CA_FILE_ENV = "AGENT_REACH_CA_FILE"
CLIENT_CERT_FILE_ENV = "AGENT_REACH_CLIENT_CERT_FILE"
CLIENT_KEY_FILE_ENV = "AGENT_REACH_CLIENT_KEY_FILE"
MINIMUM_TLS_VERSION = ssl.TLSVersion.TLSv1_2


class TlsConfigError(ValueError):
    """A certificate, key or CA file cannot be used; the message names the setting, the file and the fix."""

    def __init__(self, message: str, *, setting: str) -> None:
        super().__init__(message)
        self.setting = setting  # the field at fault, e.g. "tls_key_file"


class ClientTlsSettings(Settings):
    """What a client trusts over https and presents when the server asks (``[client]``, ``[node]``)."""

    ca_file: str | None = Field(
        default=None, description="PEM bundle of the CAs this side trusts for https (the node: peers, probes, "
                                  "deliveries; the SDK and CLI: the node); None = the system's trust store. "
                                  f"Clients read ${CA_FILE_ENV} when it is not set.")
    client_cert_file: str | None = Field(
        default=None, description="PEM certificate presented to a server that requires one (mutual TLS), with "
                                  "client_key_file.")
    client_key_file: str | None = Field(default=None, description="Unencrypted PEM key of client_cert_file.")

    def with_environment(self, environ: Mapping[str, str] | None = None) -> Self:
        """These settings with each unset one taken from ``$AGENT_REACH_CA_FILE``,
        ``$AGENT_REACH_CLIENT_CERT_FILE`` and ``$AGENT_REACH_CLIENT_KEY_FILE`` (``os.environ``)."""
        environ = os.environ if environ is None else environ
        update = {}
        for name, variable in (("ca_file", CA_FILE_ENV), ("client_cert_file", CLIENT_CERT_FILE_ENV),
                               ("client_key_file", CLIENT_KEY_FILE_ENV)):
            value = environ.get(variable, "").strip()
            if getattr(self, name) is None and value:
                update[name] = value
        return self.model_copy(update=update) if update else self

    def client_ssl_context(self) -> ssl.SSLContext | bool:
        """The ``ssl=`` of an aiohttp connector: ``True`` (the system's store) when nothing is set.

        Raises :class:`TlsConfigError` for a file that cannot be used.
        """
        if self.ca_file is None and self.client_cert_file is None and self.client_key_file is None:
            return True
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(_unusable("ca_file", self.ca_file, exc, "a PEM file of CA certificates"),
                                 setting="ca_file") from None
        context.minimum_version = MINIMUM_TLS_VERSION
        _load_chain(context, self.client_cert_file, self.client_key_file, names=("client_cert_file", "client_key_file"))
        return context


class ServerTlsSettings(Settings):
    """Whether and how the node serves https (``--tls-cert``, ``--tls-key``, ``--tls-client-ca``)."""

    tls_cert_file: str | None = Field(
        default=None, description="PEM certificate (its chain after it) the node serves https with; None = plain "
                                  "http. Needs tls_key_file.")
    tls_key_file: str | None = Field(default=None, description="Unencrypted PEM private key of tls_cert_file.")
    tls_client_ca_file: str | None = Field(
        default=None, description="PEM bundle of CAs: with it every client must present a certificate one of "
                                  "them signed (mutual TLS); None = no client certificate asked for.")

    @property
    def serves_tls(self) -> bool:
        return self.tls_cert_file is not None

    def server_ssl_context(self) -> ssl.SSLContext | None:
        """The ``ssl_context`` of the node's listener; None for plain http.

        Raises :class:`TlsConfigError` for a file that cannot be used, or a key or client CA without
        a certificate.
        """
        if self.tls_cert_file is None:
            if self.tls_key_file is not None or self.tls_client_ca_file is not None:
                raise TlsConfigError("tls_key_file and tls_client_ca_file need tls_cert_file: give the node's "
                                     "certificate too (--tls-cert FILE)", setting="tls_cert_file")
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = MINIMUM_TLS_VERSION
        context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
        _load_chain(context, self.tls_cert_file, self.tls_key_file, names=("tls_cert_file", "tls_key_file"))
        if self.tls_client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=self.tls_client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise TlsConfigError(_unusable("tls_client_ca_file", self.tls_client_ca_file, exc,
                                               "a PEM file of the CAs that sign client certificates"),
                                     setting="tls_client_ca_file") from None
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def _load_chain(context: ssl.SSLContext, cert_file: str | None, key_file: str | None, *,
                names: tuple[str, str]) -> None:
    cert_name, key_name = names
    if cert_file is None and key_file is None:
        return
    if cert_file is None or key_file is None:
        given, missing = (cert_name, key_name) if key_file is None else (key_name, cert_name)
        raise TlsConfigError(f"{given} needs {missing}: give the certificate and its private key together",
                             setting=missing)
    for name, path in ((cert_name, cert_file), (key_name, key_file)):
        if not os.access(path, os.R_OK):
            reason = "no such file" if not os.path.exists(path) else "not readable by this user"
            raise TlsConfigError(f"{name} {path}: {reason}; give a PEM file this process can read", setting=name)
    asked_for_password = []

    def no_password() -> bytes:  # else OpenSSL prompts on the terminal for an encrypted key
        asked_for_password.append(True)
        return b""

    try:
        context.load_cert_chain(cert_file, key_file, password=no_password)
    except (OSError, ssl.SSLError) as exc:
        if asked_for_password:
            raise TlsConfigError(f"{key_name} {key_file} is encrypted; give an unencrypted key (keep it mode "
                                 "0600), e.g. 'openssl pkey -in KEY -out KEY.plain'", setting=key_name) from None
        raise TlsConfigError(f"{cert_name} {cert_file} with {key_name} {key_file}: cannot be loaded "
                             f"({_reason(exc)}); give a PEM certificate and the private key that matches it",
                             setting=cert_name) from None


def _unusable(name: str, path: str | None, exc: OSError | ssl.SSLError, what: str) -> str:
    return f"{name} {path}: cannot be loaded ({_reason(exc)}); give {what}"


def _reason(exc: OSError | ssl.SSLError) -> str:
    reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
    return re.sub(r"\s*\(_ssl\.c:\d+\)", "", str(reason))
