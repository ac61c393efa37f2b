"""Certificates made in the test: a CA, server certificates for 127.0.0.1 and localhost, and
client certificates, written as PEM files (``cryptography``, which the node already depends on)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateAuthority", "Issued"]

_LIFETIME = datetime.timedelta(days=1)


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its key, as files."""

    cert_file: Path
    key_file: Path


class CertificateAuthority:
    """A self-signed CA in ``directory`` (``ca_file``) that issues certificates into the same directory."""

    def __init__(self, directory: Path, name: str = "agent-reach test CA") -> None:
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self._cert = (
            x509.CertificateBuilder().subject_name(self._name).issuer_name(self._name)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_file = directory / f"{_slug(name)}.pem"
        self.ca_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, server: bool = True, client: bool = True) -> Issued:
        """A certificate for ``name`` (SAN 127.0.0.1 and localhost), good for a server and/or a client."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        usages = [*([ExtendedKeyUsageOID.SERVER_AUTH] if server else []),
                  *([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])]
        cert = (
            x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _LIFETIME)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        issued = Issued(self.directory / f"{_slug(name)}.crt", self.directory / f"{_slug(name)}.key")
        issued.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
        issued.key_file.chmod(0o600)
        return issued


def _slug(name: str) -> str:
    return "".join(char if char.isalnum() else "-" for char in name.lower())
