"""ONE Kafka broker with every TLS/SASL listener the security tests need, and the client
settings for each (the plugin's ``security:`` block and Kafka console tools' properties).

Listeners (``gateway.devstack.kafka.SecureListeners``): ``SSL`` (client certificate
required), ``SASL_SSL`` (PLAIN and SCRAM-SHA-256/512), ``EXPIRED`` (the expired server
certificate) and ``MISMATCH`` (a certificate naming only ``kafka.invalid``, signed by a
CA of its own, so the only thing wrong when connecting to 127.0.0.1 is the host name).
PLAINTEXT stays for the tests' own readers and writers. Passwords are made per session.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from gateway.devstack import DevstackError, KafkaBroker, KafkaOptions
from gateway.devstack.certs import DevCertificates, make_dev_certificates
from gateway.devstack.kafka import SecureListeners, pem_keystore

PLAIN_USER = "alice"
SCRAM_USER = "carol"
MISMATCH_NAME = "kafka.invalid"


def _mismatch_certificate(directory: Path) -> tuple[Path, Path, Path]:
    """(CA, server cert, server key) for a server certificate naming only MISMATCH_NAME."""
    now = dt.datetime.now(dt.UTC)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mqgw mismatch CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, MISMATCH_NAME)]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(MISMATCH_NAME)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = (directory / "mismatch-ca.pem", directory / "mismatch.pem", directory / "mismatch.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return paths


@dataclass
class SecureKafka:
    """The running broker, its certificates and per-session credentials."""

    broker: KafkaBroker
    certs: DevCertificates
    mismatch_ca: Path
    plain_password: str
    scram_password: str
    directory: Path

    @property
    def plaintext(self) -> str:
        return self.broker.bootstrap

    def address(self, listener: str) -> str:
        return self.broker.listener_address(listener)

    def security(self, kind: str) -> dict[str, Any]:
        """The plugin's ``security:`` block for ``kind``: ``ssl`` (client certificate),
        ``plain``, ``scram-256``, ``scram-512`` (SASL_SSL)."""
        tls = {"ca_file": str(self.certs.ca_cert)}
        if kind == "ssl":
            return {"protocol": "SSL", "tls": {
                **tls, "cert_file": str(self.certs.client_cert),
                "key_file": str(self.certs.client_key)}}
        mechanism, user, password = {
            "plain": ("PLAIN", PLAIN_USER, self.plain_password),
            "scram-256": ("SCRAM-SHA-256", SCRAM_USER, self.scram_password),
            "scram-512": ("SCRAM-SHA-512", SCRAM_USER, self.scram_password),
        }[kind]
        return {"protocol": "SASL_SSL", "tls": tls,
                "sasl": {"mechanism": mechanism, "username": user, "password": password}}

    def listener_of(self, kind: str) -> str:
        return "SSL" if kind == "ssl" else "SASL_SSL"

    def client_properties(self, kind: str) -> Path:
        """A ``client.properties`` for Kafka's console tools (``--consumer.config``)."""
        lines = ["ssl.truststore.type=PEM", f"ssl.truststore.location={self.certs.ca_cert}"]
        if kind == "ssl":
            store = pem_keystore(self.certs.client_cert, self.certs.client_key,
                                 self.directory / "client-keystore.pem")
            lines += ["security.protocol=SSL", "ssl.keystore.type=PEM",
                      f"ssl.keystore.location={store}"]
        else:
            block = self.security(kind)["sasl"]
            module = ("org.apache.kafka.common.security.plain.PlainLoginModule"
                      if block["mechanism"] == "PLAIN"
                      else "org.apache.kafka.common.security.scram.ScramLoginModule")
            lines += [
                "security.protocol=SASL_SSL",
                f"sasl.mechanism={block['mechanism']}",
                f'sasl.jaas.config={module} required username="{block["username"]}" '
                f'password="{block["password"]}";',
            ]
        path = self.directory / f"{kind}.properties"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path


def prepare_secure_kafka(directory: Path) -> SecureKafka:
    """Make the certificates and the (not yet started) broker."""
    certs = make_dev_certificates(directory / "certs")
    mismatch_ca, mismatch_cert, mismatch_key = _mismatch_certificate(certs.directory)
    plain_password, scram_password = secrets.token_hex(12), secrets.token_hex(12)
    listeners = SecureListeners(
        certs,
        plain_users={PLAIN_USER: plain_password},
        scram_users={SCRAM_USER: scram_password},
        tls_listeners={"MISMATCH": (mismatch_cert, mismatch_key)},
    )
    broker = KafkaBroker(directory / "kafka", KafkaOptions(secure=listeners))
    return SecureKafka(broker, certs, mismatch_ca, plain_password, scram_password, directory)


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    """One secure broker per test module; the test FAILS if it cannot start."""
    secure = prepare_secure_kafka(tmp_path_factory.mktemp("secure-kafka"))
    try:
        secure.broker.start()
    except DevstackError as exc:
        secure.broker.stop()
        pytest.fail(f"the secure Kafka broker could not start:\n{exc}", pytrace=False)
    try:
        yield secure
    finally:
        secure.broker.stop()
