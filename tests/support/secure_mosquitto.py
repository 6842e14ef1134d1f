"""One secured Mosquitto for the MQTT security tests, started by the devstack code.

Three listeners besides the anonymous probe listener, all TLS with the devstack's
throw-away certificates (:func:`gateway.devstack.certs.make_dev_certificates`):

* ``tls-password``: server certificate from the dev CA, user name and password checked
  against a password file (``mosquitto_passwd``);
* ``tls-client-cert``: the same server certificate, a client certificate from the dev
  CA required (its common name is the user name);
* ``tls-expired``: an expired server certificate, otherwise like ``tls-password``.

Plus :func:`mosquitto_client`, the command line of Debian's ``mosquitto_pub`` /
``mosquitto_sub`` for one listener (``--cafile --cert --key -u -P``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.devstack.certs import DevCertificates, make_dev_certificates
from gateway.devstack.errors import DevstackError
from gateway.devstack.mosquitto import MosquittoBroker, MosquittoOptions, SecureListener

#: The password file's account (a throw-away value, recognisable in a leak check).
USER = "gw-user"
PASSWORD = "pw-7f3c9e1d-never-logged"


@dataclass(frozen=True)
class SecureMosquitto:
    broker: MosquittoBroker
    certs: DevCertificates

    @property
    def host(self) -> str:
        return self.broker.host

    def port(self, listener: str) -> int:
        return self.broker.ports[listener]


def start_secure_mosquitto(work_dir: Path) -> SecureMosquitto:
    certs = make_dev_certificates(work_dir / "certs")
    options = MosquittoOptions(
        listeners=(
            SecureListener("tls-password", certs.server_cert, certs.server_key, certs.ca_cert),
            SecureListener(
                "tls-client-cert",
                certs.server_cert,
                certs.server_key,
                certs.ca_cert,
                require_certificate=True,
            ),
            SecureListener(
                "tls-expired", certs.expired_server_cert, certs.expired_server_key, certs.ca_cert
            ),
        ),
        users={USER: PASSWORD},
    )
    broker = MosquittoBroker(work_dir / "broker", options)
    try:
        broker.start()
    except BaseException:
        broker.stop()
        raise
    return SecureMosquitto(broker, certs)


@pytest.fixture(scope="module")
def secure_mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureMosquitto]:
    """The secured broker of one test module; the test FAILS when it cannot start."""
    try:
        secured = start_secure_mosquitto(tmp_path_factory.mktemp("secure-mosquitto"))
    except DevstackError as exc:
        pytest.fail(f"the secured Mosquitto could not start:\n{exc}", pytrace=False)
    try:
        yield secured
    finally:
        secured.broker.stop()


def mosquitto_client(
    tool: str,
    secured: SecureMosquitto,
    listener: str,
    *,
    user: str | None = None,
    password: str | None = None,
    client_cert: bool = False,
    ca_file: Path | None = None,
) -> list[str]:
    """``mosquitto_pub``/``mosquitto_sub`` (``tool``) connecting over TLS to ``listener``
    (MQTT 5); fails the test when Debian's mosquitto-clients are missing."""
    binary = shutil.which(tool)
    if binary is None:
        pytest.fail(f"{tool} not found: install Debian's mosquitto-clients (make setup)")
    argv = [
        binary,
        "-h",
        secured.host,
        "-p",
        str(secured.port(listener)),
        "-V",
        "mqttv5",
        "--cafile",
        str(ca_file or secured.certs.ca_cert),
    ]
    if client_cert:
        argv += ["--cert", str(secured.certs.client_cert), "--key", str(secured.certs.client_key)]
    if user is not None:
        argv += ["-u", user]
    if password is not None:
        argv += ["-P", password]
    return argv
