"""A Mosquitto MQTT broker on 127.0.0.1 with a generated configuration.

Debian's ``mosquitto`` package (``/usr/sbin/mosquitto``, not on a non-root PATH) runs in
the foreground with ``-c <work_dir>/mosquitto.conf``; it keeps no files (no persistence;
it logs to stderr, unbuffered unlike stdout, which goes to ``mosquitto.log``), so dropping
privileges when started as root is harmless. Readiness means an MQTT CONNECT answered by
a CONNACK with return code 0.

Optional secured listeners (:class:`SecureListener`, in :attr:`MosquittoOptions.listeners`)
add TLS (certificates from :mod:`gateway.devstack.certs`), client certificates and a
password file, each with ``allow_anonymous false``; the anonymous loopback listener
stays (it is how readiness is probed), so the default broker is unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from gateway.devstack.errors import ExecutableNotFoundError, ServiceStartError
from gateway.devstack.ports import LOOPBACK, free_port
from gateway.devstack.process import ServiceProcess, spawn

MOSQUITTO_CANDIDATES = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "/usr/bin/mosquitto")


def find_mosquitto() -> str:
    """``$MQGW_MOSQUITTO``, then ``mosquitto`` on PATH, then Debian's /usr/sbin/mosquitto."""
    searched: list[str] = []
    override = os.environ.get("MQGW_MOSQUITTO")
    candidates = [override] if override else []
    on_path = shutil.which("mosquitto")
    if on_path:
        candidates.append(on_path)
    candidates.extend(MOSQUITTO_CANDIDATES)
    for cand in candidates:
        searched.append(cand)
        if os.access(cand, os.X_OK):
            return cand
    raise ExecutableNotFoundError(
        "mosquitto",
        ["$MQGW_MOSQUITTO", "PATH", *MOSQUITTO_CANDIDATES],
        "run `make setup` (installs Debian's mosquitto package as root)",
    )


@dataclass(frozen=True, slots=True)
class SecureListener:
    """One extra listener on 127.0.0.1 with TLS and/or credentials, never anonymous.

    ``require_certificate``: clients must present a certificate signed by ``ca_file``;
    its common name becomes the MQTT user name (``use_identity_as_username``), so no
    password is asked. Otherwise, with ``passwords``, the user name and password are
    checked against the broker's password file (:attr:`MosquittoOptions.users`).
    """

    #: Key of :attr:`MosquittoBroker.ports` (e.g. ``"tls-password"``).
    name: str
    cert_file: Path | None = None
    key_file: Path | None = None
    ca_file: Path | None = None
    require_certificate: bool = False
    passwords: bool = True

    def conf(self, port: int, password_file: Path | None) -> str:
        lines = [f"listener {port} {LOOPBACK}", "allow_anonymous false"]
        if self.cert_file is not None and self.key_file is not None:
            lines += [f"certfile {self.cert_file}", f"keyfile {self.key_file}"]
            if self.ca_file is not None:
                lines.append(f"cafile {self.ca_file}")
        if self.require_certificate:
            lines += ["require_certificate true", "use_identity_as_username true"]
        elif self.passwords and password_file is not None:
            lines.append(f"password_file {password_file}")
        return "\n".join(lines) + "\n"


def _passwd_hash(password: str) -> str:
    """Mosquitto 2.0's password file hash: ``$7$<iterations>$<b64 salt>$<b64 hash>``
    (PBKDF2-HMAC-SHA512, 101 iterations, 12-byte salt), as ``mosquitto_passwd`` writes."""
    salt = os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, 101)
    return f"$7$101${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def write_password_file(path: Path, users: dict[str, str]) -> Path:
    """A Mosquitto password file for ``users`` (name -> password): Debian's
    ``mosquitto_passwd -b`` when installed, else the same hash format written here."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("", encoding="utf-8")
    path.chmod(0o600)
    tool = shutil.which("mosquitto_passwd")
    if tool is None:
        path.write_text(
            "".join(f"{user}:{_passwd_hash(pw)}\n" for user, pw in users.items()),
            encoding="utf-8",
        )
        return path
    for user, password in users.items():
        # -b takes the password on the command line: fine for throw-away dev accounts.
        subprocess.run(
            [tool, "-b", str(path), user, password],
            check=True,
            capture_output=True,
            timeout=30,
        )
    return path


def mosquitto_conf(
    *,
    port: int,
    max_queued_messages: int = 100_000,
    secure: dict[int, SecureListener] | None = None,
    password_file: Path | None = None,
    acl_file: Path | None = None,
) -> str:
    """The broker configuration: one anonymous loopback listener, no persistence, plus
    the ``secure`` listeners by port (then ``per_listener_settings`` is on so each
    listener has its own ``allow_anonymous``/``password_file``); ``acl_file`` limits
    what the anonymous listener's clients may read and write.

    A configured ``listener`` turns ``allow_anonymous`` off by default, so it is set
    explicitly; the in-flight and queue limits are raised from 20 / 1000 so a gateway
    publishing bursts at QoS 1 is not silently dropped.
    """
    extra = "".join(
        listener.conf(listener_port, password_file)
        for listener_port, listener in (secure or {}).items()
    )
    # Started as root, Mosquitto switches to the "mosquitto" user before it reads the
    # password file, which (like the 0600 private keys, in a private temporary
    # directory) that user cannot read: a secured dev broker keeps the starting user.
    # The same for an ACL file.
    private_files = bool(secure) or acl_file is not None
    keep_user = (
        "user root\n" if private_files and hasattr(os, "geteuid") and os.geteuid() == 0 else ""
    )
    return (
        keep_user
        + ("per_listener_settings true\n" if secure else "")
        + f"listener {port} {LOOPBACK}\n"
        "allow_anonymous true\n"
        + (f"acl_file {acl_file}\n" if acl_file is not None else "")
        + extra
        + "persistence false\n"
        "log_dest stderr\n"
        "log_type error\n"
        "log_type warning\n"
        "log_type notice\n"
        "log_type information\n"
        "connection_messages false\n"
        "log_timestamp true\n"
        "log_timestamp_format %Y-%m-%dT%H:%M:%S\n"
        "max_inflight_messages 1000\n"
        f"max_queued_messages {max_queued_messages}\n"
        "max_queued_bytes 0\n"
        "set_tcp_nodelay true\n"
    )


def _connect_packet(client_id: bytes) -> bytes:
    # MQTT 3.1.1 section 3.1: protocol name, level 4, clean session, keep-alive 10 s.
    variable = b"\x00\x04MQTT\x04\x02\x00\x0a"
    payload = len(client_id).to_bytes(2, "big") + client_id
    remaining = len(variable) + len(payload)
    assert remaining < 128  # one-byte remaining length
    return bytes([0x10, remaining]) + variable + payload


_PROBE_CONNECT = _connect_packet(b"mqgw-devstack-probe")
_CONNACK_OK = bytes([0x20, 0x02, 0x00, 0x00])
_DISCONNECT = bytes([0xE0, 0x00])


def mqtt_handshake(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when an MQTT 3.1.1 CONNECT (clean session) gets CONNACK 'accepted'."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(_PROBE_CONNECT)
            reply = b""
            while len(reply) < 4:
                chunk = sock.recv(4 - len(reply))
                if not chunk:
                    return False
                reply += chunk
            if reply != _CONNACK_OK:
                return False
            sock.sendall(_DISCONNECT)
            return True
    except OSError:
        return False


@dataclass(slots=True)
class MosquittoOptions:
    startup_timeout: float = 20.0
    stop_timeout: float = 5.0
    max_queued_messages: int = 100_000
    #: Secured listeners besides the anonymous one (see :class:`SecureListener`).
    listeners: tuple[SecureListener, ...] = ()
    #: Accounts of the password file (user name -> password) for ``passwords`` listeners.
    users: dict[str, str] = field(default_factory=dict)
    #: An ACL file's lines (Mosquitto's ``acl_file`` syntax: ``topic [read|write|
    #: readwrite|deny] <filter>``) for the anonymous listener, e.g. to make the broker
    #: refuse a topic (PUBACK 0x87); empty: no ACL. Not with ``listeners``.
    acl: tuple[str, ...] = ()


class MosquittoBroker:
    """A running (after ``start()``) Mosquitto broker at ``host``:``port``."""

    def __init__(
        self, work_dir: Path, options: MosquittoOptions | None = None, *, detach: bool = False
    ) -> None:
        self.work_dir = work_dir
        self.options = options or MosquittoOptions()
        self.detach = detach
        self.host = LOOPBACK
        self.port = 0
        #: Port of each secured listener, by :attr:`SecureListener.name`.
        self.ports: dict[str, int] = {}
        self.log_path = work_dir / "mosquitto.log"
        self.process: ServiceProcess | None = None

    def start(self) -> MosquittoBroker:
        binary = find_mosquitto()
        for attempt in range(3):
            try:
                self._start_once(binary)
                return self
            except ServiceStartError as exc:
                self.stop()
                if attempt < 2 and "Address already in use" in exc.log_tail:
                    continue
                raise
        raise AssertionError("unreachable")

    def _start_once(self, binary: str) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.ports = {}
        taken = {self.port}
        for listener in self.options.listeners:
            port = free_port()
            while port in taken:
                port = free_port()
            taken.add(port)
            self.ports[listener.name] = port
        password_file = (
            write_password_file(self.work_dir / "passwords", self.options.users)
            if self.options.users
            else None
        )
        acl_file = None
        if self.options.acl:
            if self.options.listeners:
                raise ValueError("MosquittoOptions.acl applies to the anonymous listener "
                                 "alone: not with secured listeners")
            acl_file = self.work_dir / "acl"
            acl_file.write_text("".join(f"{line}\n" for line in self.options.acl),
                                encoding="utf-8")
        conf = self.work_dir / "mosquitto.conf"
        conf.write_text(
            mosquitto_conf(
                port=self.port,
                max_queued_messages=self.options.max_queued_messages,
                secure={self.ports[lst.name]: lst for lst in self.options.listeners},
                password_file=password_file,
                acl_file=acl_file,
            ),
            encoding="utf-8",
        )
        self.process = spawn(
            "mosquitto",
            [binary, "-c", str(conf)],
            log_path=self.log_path,
            cwd=self.work_dir,
            detach=self.detach,
        )
        deadline = time.monotonic() + self.options.startup_timeout
        while time.monotonic() < deadline:
            if not self.process.alive():
                rc = self.process.exit_code()
                raise ServiceStartError(
                    "mosquitto", f"exited with {rc}", self.log_path, self.process.log_tail(), rc
                )
            if mqtt_handshake(self.host, self.port):
                return
            time.sleep(0.05)
        raise ServiceStartError(
            "mosquitto",
            f"no CONNACK after {self.options.startup_timeout:.0f} s",
            self.log_path,
            self.process.log_tail(),
            None,
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(self.options.stop_timeout)

    def __enter__(self) -> MosquittoBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
