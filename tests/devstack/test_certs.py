"""gateway/devstack/certs.py: the throw-away PKI verifies (and fails) as TLS clients expect."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509

from gateway.devstack.certs import DevCertificates, make_dev_certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return make_dev_certificates(tmp_path_factory.mktemp("certs"))


def _handshake(certs: DevCertificates, server_cert: Path, server_key: Path,
               cafile: Path, host: str = "127.0.0.1") -> None:
    """A real TLS handshake over loopback with mutual authentication."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(server_cert, server_key)
    server_ctx.load_verify_locations(certs.ca_cert)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError):
            pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        client_ctx = ssl.create_default_context(cafile=str(cafile))
        client_ctx.load_cert_chain(certs.client_cert, certs.client_key)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                client_ctx.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(b"x")
    finally:
        t.join(10)
        listener.close()


def test_server_and_client_certificates_verify(certs: DevCertificates) -> None:
    _handshake(certs, certs.server_cert, certs.server_key, certs.ca_cert)
    _handshake(certs, certs.server_cert, certs.server_key, certs.ca_cert, host="localhost")


def test_wrong_ca_expired_and_hostname_mismatch_fail(certs: DevCertificates) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match=r"self-signed|local issuer"):
        _handshake(certs, certs.server_cert, certs.server_key, certs.other_ca_cert)
    with pytest.raises(ssl.SSLCertVerificationError, match="expired"):
        _handshake(certs, certs.expired_server_cert, certs.expired_server_key, certs.ca_cert)
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        _handshake(certs, certs.server_cert, certs.server_key, certs.ca_cert,
                   host="gateway.invalid")


def test_keys_are_private_and_expiry_is_in_the_past(certs: DevCertificates) -> None:
    assert certs.server_key.stat().st_mode & 0o077 == 0
    assert certs.client_key.stat().st_mode & 0o077 == 0
    old = x509.load_pem_x509_certificate(certs.expired_server_cert.read_bytes())
    assert old.not_valid_after_utc < dt.datetime.now(dt.UTC)
