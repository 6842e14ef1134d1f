"""Throw-away X.509 material for the devstack's TLS listeners and the tests.

One call makes a private CA, a server certificate for 127.0.0.1/localhost, a client
certificate, an expired server certificate and a second, unrelated CA (for the
"wrong CA" failure case), all as PEM files in one directory. Keys are RSA 2048:
Mosquitto, the JVM and Python's ssl accept them without extra configuration.
Never used outside the devstack and tests: real deployments bring their own PKI.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True, slots=True)
class DevCertificates:
    """Paths of the PEM files :func:`make_dev_certificates` wrote."""

    directory: Path
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    expired_server_cert: Path
    expired_server_key: Path
    other_ca_cert: Path


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _name(common_name: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mq-stream-gateway devstack"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _ca(common_name: str, now: dt.datetime) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True,
            crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    common_name: str, ca_key: rsa.RSAPrivateKey, ca_cert: x509.Certificate, *,
    server: bool, not_before: dt.datetime, not_after: dt.datetime,
) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    key = _key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False)
    )
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
        ]), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def make_dev_certificates(directory: Path) -> DevCertificates:
    """Write a fresh CA, server, client, expired-server and other-CA set to ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key, ca_cert = _ca("mqgw devstack CA", now)
    _, other_ca = _ca("mqgw unrelated CA", now)
    server_key, server_cert = _leaf("localhost", ca_key, ca_cert, server=True,
                                    not_before=now - dt.timedelta(days=1),
                                    not_after=now + dt.timedelta(days=30))
    client_key, client_cert = _leaf("mqgw-client", ca_key, ca_cert, server=False,
                                    not_before=now - dt.timedelta(days=1),
                                    not_after=now + dt.timedelta(days=30))
    old_key, old_cert = _leaf("localhost", ca_key, ca_cert, server=True,
                              not_before=now - dt.timedelta(days=10),
                              not_after=now - dt.timedelta(days=1))
    out = DevCertificates(
        directory=directory,
        ca_cert=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        expired_server_cert=directory / "expired-server.pem",
        expired_server_key=directory / "expired-server.key",
        other_ca_cert=directory / "other-ca.pem",
    )
    _write_cert(out.ca_cert, ca_cert)
    _write_cert(out.other_ca_cert, other_ca)
    _write_cert(out.server_cert, server_cert)
    _write_key(out.server_key, server_key)
    _write_cert(out.client_cert, client_cert)
    _write_key(out.client_key, client_key)
    _write_cert(out.expired_server_cert, old_cert)
    _write_key(out.expired_server_key, old_key)
    return out
