"""MQTT over TLS with passwords and client certificates, against a real secured Mosquitto
(tests/support/secure_mosquitto.py) with Debian's ``mosquitto_pub``/``mosquitto_sub`` as
the outside clients.

Proves: round trips MQ -> MQTT and MQTT -> MQ through the gateway over TLS with a user
name and password (the password from an environment variable) and over TLS with a
client certificate; a wrong CA, an expired server certificate, a wrong password and a
missing client certificate each give one clear log line naming the plugin instance and
the cause, retried with backoff (no traceback), an unhealthy instance in ``/healthz`` and
a failure counter in ``/metrics``; no secret reaches the DEBUG log or ``mqgw run
--check``. Plus the config validation and the TLS set-up errors, without a broker.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from pydantic import ValidationError

from gateway.devstack import mosquitto as mosquitto_module
from gateway.devstack.mosquitto import (
    MosquittoBroker,
    MosquittoOptions,
    SecureListener,
    mosquitto_conf,
)
from gateway.devstack.ports import free_port
from gateway.secrets import Secret
from plugins.mqtt import MqttConfig
from plugins.mqtt.config import TlsConfig
from plugins.mqtt.connection import MqttConnection, MqttConnectionError, ssl_cause, tls_context
from tests.plugins.mqtt.mqtt_harness import (
    publish_rfh2,
    register_mq_subscribers,
    start_gateway,
    unique,
    wait_for_queue,
)
from tests.support.secure_mosquitto import (
    PASSWORD,
    USER,
    SecureMosquitto,
    mosquitto_client,
    secure_mosquitto,
)

__all__ = ["secure_mosquitto"]  # the module-scoped fixture, used by name below

PASSWORD_ENV = "MQGW_TEST_MQTT_PASSWORD"
#: The inline (literal) wrong password of the failure gateway: must never be shown.
WRONG_PASSWORD = "wrong-pw-5a1b2c3d-never-logged"


# ----------------------------------------------------------------- config validation --


def test_tls_and_credentials_validate() -> None:
    cfg = MqttConfig.model_validate(
        {
            "username": "u",
            "password": {"env": "SOME_VAR"},
            "tls": {"ca_file": "ca.pem", "cert_file": "c.pem", "key_file": "c.key",
                    "key_password": {"file": "/run/secrets/key-pass"}},
        }
    )
    assert cfg.tls is not None and cfg.tls.check_hostname is True
    assert cfg.tls.tls_version == "1.2"
    assert isinstance(cfg.password, Secret) and cfg.password.source == "env SOME_VAR"
    assert MqttConfig.model_validate({"tls": True}).tls == TlsConfig()
    assert MqttConfig.model_validate({"tls": False}).tls is None
    assert MqttConfig.model_validate({}).tls is None


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"password": "x"}, "password needs username"),
        ({"ca_file": "ca.pem"}, "ca_file moved under tls"),
        ({"tls": {"key_file": "k.pem"}}, "need tls.cert_file"),
        ({"tls": {"ca": "ca.pem"}}, "Extra inputs are not permitted"),
        ({"tls": {"tls_version": "1.1"}}, "tls_version"),
        ({"username": "u", "password": {"env": "A", "file": "b"}}, "a secret is one of"),
    ],
)
def test_invalid_security_config_is_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        MqttConfig.model_validate(config)


def test_a_literal_password_never_shows_in_repr_or_dump() -> None:
    cfg = MqttConfig.model_validate({"username": "u", "password": WRONG_PASSWORD})
    assert WRONG_PASSWORD not in repr(cfg)
    assert WRONG_PASSWORD not in str(cfg.model_dump())
    assert WRONG_PASSWORD not in cfg.model_dump_json()
    assert cfg.password is not None and cfg.password.reveal() == WRONG_PASSWORD


# ------------------------------------------------------------------ TLS set-up errors --


def _encrypted_key(secured: SecureMosquitto, path: Path, passphrase: bytes) -> Path:
    key = serialization.load_pem_private_key(secured.certs.client_key.read_bytes(), None)
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(passphrase),
    ))
    return path


def test_tls_setup_errors_name_the_key_not_the_secret(
    secure_mosquitto: SecureMosquitto, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certs = secure_mosquitto.certs
    with pytest.raises(MqttConnectionError, match=r"TLS setup failed: tls\.ca_file: No such"):
        tls_context(TlsConfig(ca_file=str(tmp_path / "missing.pem")))
    key = _encrypted_key(secure_mosquitto, tmp_path / "enc.key", b"right-passphrase")
    good = TlsConfig(
        ca_file=str(certs.ca_cert), cert_file=str(certs.client_cert), key_file=str(key),
        key_password=Secret(env="MQGW_TEST_KEY_PASS"),
    )
    monkeypatch.setenv("MQGW_TEST_KEY_PASS", "right-passphrase")
    assert tls_context(good).check_hostname
    monkeypatch.setenv("MQGW_TEST_KEY_PASS", "wrong-passphrase-xyz")
    with pytest.raises(MqttConnectionError) as info:
        tls_context(good)
    assert str(info.value) == (
        "TLS setup failed: tls.cert_file/tls.key_file: cannot read the private key "
        "(wrong or missing tls.key_password, or not a PEM file)"
    )
    assert "wrong-passphrase-xyz" not in str(info.value)
    assert info.value.kind == "tls" and info.value.retriable
    monkeypatch.delenv("MQGW_TEST_KEY_PASS")
    with pytest.raises(MqttConnectionError, match=r"tls\.key_password: secret from env "
                                                  r"MQGW_TEST_KEY_PASS: the variable is unset"):
        tls_context(good)
    assert tls_context(TlsConfig(check_hostname=False)).check_hostname is False
    with pytest.raises(MqttConnectionError, match=r"tls\.key_file: key values mismatch$"):
        tls_context(TlsConfig(cert_file=str(certs.client_cert), key_file=str(certs.server_key)))


def test_ssl_cause_keeps_the_readable_part() -> None:
    text = (
        "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required "
        "(_ssl.c:2576)"
    )
    assert ssl_cause(text) == "tlsv13 alert certificate required"


# ------------------------------------------------------------------- devstack pieces --


def test_default_broker_configuration_is_unchanged() -> None:
    conf = mosquitto_conf(port=1883)
    assert conf.startswith("listener 1883 127.0.0.1\nallow_anonymous true\n")
    assert "per_listener_settings" not in conf and "user " not in conf
    assert "password_file" not in conf and "certfile" not in conf


@pytest.mark.mqtt
@pytest.mark.mosquitto_clients
def test_password_file_written_without_mosquitto_passwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback hash format (no mosquitto_passwd on PATH) is what Mosquitto checks."""
    real_which = mosquitto_module.shutil.which
    monkeypatch.setattr(
        mosquitto_module.shutil, "which",
        lambda name: None if name == "mosquitto_passwd" else real_which(name),
    )
    options = MosquittoOptions(listeners=(SecureListener("pw"),), users={"bob": "pa:ss w"})
    with MosquittoBroker(tmp_path, options) as broker:
        assert (tmp_path / "passwords").read_text().startswith("bob:$7$101$")
        results = [
            subprocess.run(
                ["mosquitto_pub", "-h", broker.host, "-p", str(broker.ports["pw"]),
                 "-V", "mqttv5", "-t", "t", "-m", "m", "-u", "bob", "-P", password],
                capture_output=True, text=True, timeout=20, check=False,
            ).returncode
            for password in ("pa:ss w", "wrong")
        ]
    assert results[0] == 0 and results[1] != 0, results


async def _forward(listen_host: str, target_port: int) -> asyncio.Server:
    """A TCP relay from ``listen_host`` to 127.0.0.1:``target_port`` (same broker, an
    address its certificate does not name)."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(relay, listen_host, 0)


@pytest.mark.mqtt
async def test_hostname_mismatch_is_refused_unless_check_hostname_is_off(
    secure_mosquitto: SecureMosquitto, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    server = await _forward("127.0.0.2", secure_mosquitto.port("tls-password"))
    port = server.sockets[0].getsockname()[1]
    try:
        for check in (True, False):
            config = MqttConfig.model_validate({
                "host": "127.0.0.2", "port": port, "username": USER,
                "password": {"env": PASSWORD_ENV}, "connect_timeout": 5,
                "tls": {"ca_file": str(secure_mosquitto.certs.ca_cert), "check_hostname": check},
            })
            conn = MqttConnection(config, unique("mismatch-"), on_message=lambda r: None,
                                  subscriptions=list, name="mismatch")
            if check:
                with pytest.raises(MqttConnectionError) as info:
                    await conn.start()
                assert str(info.value) == (
                    "TLS handshake failed: IP address mismatch, certificate is not valid for "
                    f"'127.0.0.2'. (server 127.0.0.2:{port})"
                )
            else:
                await conn.start()
                assert conn.connected
                await conn.close()
    finally:
        server.close()


@pytest.mark.mqtt
@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_wrong_password_is_an_auth_failure_in_both_protocols(
    secure_mosquitto: SecureMosquitto, protocol: str
) -> None:
    failures: list[MqttConnectionError] = []
    config = MqttConfig.model_validate({
        "host": secure_mosquitto.host, "port": secure_mosquitto.port("tls-password"),
        "protocol": protocol, "username": USER, "password": WRONG_PASSWORD,
        "tls": {"ca_file": str(secure_mosquitto.certs.ca_cert)},
    })
    conn = MqttConnection(config, unique("badpw-"), on_message=lambda r: None,
                          subscriptions=list, name="badpw", on_failure=failures.append)
    with pytest.raises(MqttConnectionError) as info:
        await conn.start()
    assert str(info.value).startswith("the broker refused the connection: Not authorized (0x87)")
    assert (info.value.kind, info.value.retriable) == ("auth", True)
    assert failures == [info.value]
    assert WRONG_PASSWORD not in str(info.value)


# ------------------------------------------------------------- round trips over TLS --


async def _sub(argv: list[str], topic: str, count: int, probe_pub: list[str]) -> Any:
    """``mosquitto_sub`` printing ``topic|payload`` for ``count`` messages, returned once
    subscribed (a probe publication came back)."""
    probe = unique("probe/")
    proc = await asyncio.create_subprocess_exec(
        *argv, "-q", "1", "-t", topic, "-t", probe, "-F", "%t|%p", "-C", str(count + 1),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    async with asyncio.timeout(20):
        while True:
            await _pub(probe_pub, probe, "probe")
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), 0.5)
            except TimeoutError:
                continue
            assert line.startswith(f"{probe}|".encode()), line
            return proc


async def _pub(argv: list[str], topic: str, payload: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, "-q", "1", "-t", topic, "-m", payload,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, (argv, err.decode())


async def _lines(proc: Any, count: int, timeout: float = 15) -> list[str]:
    out: list[str] = []
    try:
        async with asyncio.timeout(timeout):
            while len(out) < count:
                line = await proc.stdout.readline()
                if not line:
                    break
                out.append(line.decode().rstrip("\n"))
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    return out


@pytest.mark.mqtt
@pytest.mark.mosquitto_clients
@pytest.mark.parametrize("mode", ["password", "client-cert"])
async def test_round_trip_over_tls(
    secure_mosquitto: SecureMosquitto,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    secured = secure_mosquitto
    certs = secured.certs
    base = unique("sec")
    prefix = unique("secout")
    if mode == "password":
        listener = "tls-password"
        monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
        auth: dict[str, Any] = {"username": USER, "password": {"env": PASSWORD_ENV},
                                "tls": {"ca_file": str(certs.ca_cert)}}
        outside = mosquitto_client("mosquitto_sub", secured, listener, user=USER,
                                   password=PASSWORD)
        outside_pub = mosquitto_client("mosquitto_pub", secured, listener, user=USER,
                                       password=PASSWORD)
    else:
        listener = "tls-client-cert"
        auth = {"tls": {"ca_file": str(certs.ca_cert), "cert_file": str(certs.client_cert),
                        "key_file": str(certs.client_key)}}
        outside = mosquitto_client("mosquitto_sub", secured, listener, client_cert=True)
        outside_pub = mosquitto_client("mosquitto_pub", secured, listener, client_cert=True)
    config = MqttConfig.model_validate({
        "host": secured.host,
        "port": secured.port(listener),
        "client_id": unique("gw-"),
        "outbound": {"topics": ["#"], "prefix": prefix},
        "inbound": {"filters": [{"filter": f"{base}/#", "strip_prefix": f"{base}/",
                                 "topic_prefix": f"{base}-in/"}]},
        **auth,
    })
    gw = await start_gateway(tmp_path, config, name="mqtt-secure")
    try:
        await register_mq_subscribers(gw.qm, f"{base}-in/#")
        sub = await _sub(outside, f"{prefix}/#", 1, outside_pub)
        await publish_rfh2(gw.qm, f"{base}-mq/greeting", f"hello over {mode}".encode())
        got = await _lines(sub, 1)
        await _pub(outside_pub, f"{base}/room/temp", f"21.5 {mode}")
        rfh2 = await wait_for_queue(gw.qm, "SUB.RFH2", 1)
    finally:
        await gw.close()
    assert got == [f"{prefix}/{base}-mq/greeting|hello over {mode}"]
    assert [(r.topic, r.payload) for r in rfh2] == [
        (f"{base}-in/room/temp", f"21.5 {mode}".encode())
    ]


@pytest.mark.mqtt
@pytest.mark.mosquitto_clients
async def test_outside_client_with_wrong_password_is_refused(
    secure_mosquitto: SecureMosquitto,
) -> None:
    """The broker really checks: the same tool with a wrong password is refused."""
    argv = mosquitto_client("mosquitto_pub", secure_mosquitto, "tls-password", user=USER,
                            password="not-the-password")
    proc = await asyncio.create_subprocess_exec(
        *argv, "-t", "x", "-m", "y", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode != 0 and b"Not authorized" in err


# ------------------------------------------------ failures through ``mqgw run`` --------


def _plugin(name: str, port: int, **config: Any) -> dict[str, Any]:
    return {"name": name, "plugin": "mqtt", "config": {
        "host": "127.0.0.1", "port": port, "client_id": f"mqgw-sec-{name}",
        "outbound": {"topics": [], "prefix": f"sec-{name}"},
        "reconnect_min_delay": 0.2, "connect_timeout": 5, **config,
    }}


def _failing_gateway_config(secured: SecureMosquitto, tmp: Path, metrics_port: int) -> Path:
    certs = secured.certs
    ca = str(certs.ca_cert)
    pw_file = tmp / "password.txt"
    pw_file.write_text(PASSWORD + "\n", encoding="utf-8")
    good = {"username": USER, "password": {"file": str(pw_file)}}
    plugins = [
        _plugin("good", secured.port("tls-password"), tls={"ca_file": ca}, **good),
        _plugin("wrong-ca", secured.port("tls-password"),
                tls={"ca_file": str(certs.other_ca_cert)}, **good),
        _plugin("expired", secured.port("tls-expired"), tls={"ca_file": ca}, **good),
        _plugin("bad-password", secured.port("tls-password"), tls={"ca_file": ca},
                username=USER, password=WRONG_PASSWORD),
        _plugin("no-client-cert", secured.port("tls-client-cert"), tls={"ca_file": ca}),
    ]
    (tmp / "queues.mqsc").write_text("DEFINE QLOCAL(SUB.Q) REPLACE\n")
    config = {
        "id": "gw-sec",
        "queue_manager": {"data_dir": "qm", "mqsc_file": "queues.mqsc"},
        "broker": {"store": "pubsub.db", "wait_ms": 50},
        "metrics": {"port": metrics_port},
        "logging": {"format": "text", "level": "debug"},
        "plugins": plugins,
    }
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _mqgw(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway.runtime.cli", *args]


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


#: The cause each failing instance must report, once per attempt.
CAUSES = {
    # Mosquitto sends its CA along, hence "self-signed ... in chain" for an unknown CA.
    "wrong-ca": r"TLS handshake failed: self-signed certificate in certificate chain "
                r"\(no CA in tls\.ca_file signed the broker's certificate\) "
                r"\(server 127\.0\.0\.1:\d+\)",
    "expired": r"TLS handshake failed: certificate has expired \(server 127\.0\.0\.1:\d+\)",
    "bad-password": rf"the broker refused the connection: Not authorized \(0x87\) "
                    rf"\(user '{USER}', server 127\.0\.0\.1:\d+\)",
    "no-client-cert": r"TLS handshake failed: the broker closed the connection: "
                      r"tlsv13 alert certificate required \(server 127\.0\.0\.1:\d+\)",
}


@pytest.fixture(scope="module")
def failing_gateway(
    secure_mosquitto: SecureMosquitto, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, int, subprocess.Popen[bytes]]]:
    """``mqgw run`` (DEBUG log) with one working and four failing TLS/auth instances,
    left retrying for a few seconds: (config, log text, metrics port) + live process."""
    tmp = tmp_path_factory.mktemp("sec-gw")
    port = free_port()
    cfg = _failing_gateway_config(secure_mosquitto, tmp, port)
    log_path = tmp / "mqgw.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            _mqgw("run", "--config", str(cfg)), stdout=log, stderr=subprocess.STDOUT,
            cwd=tmp, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()
            text = log_path.read_text(errors="replace")
            if all(len(re.findall(rf"plugin instance {name} cannot start yet", text)) >= 3
                   for name in CAUSES):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"not every instance retried 3 times:\n{text[-4000:]}")
        yield cfg, port, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.mqtt
def test_failures_are_one_clear_line_retried_with_backoff(
    failing_gateway: Any,
) -> None:
    cfg, port, proc = failing_gateway
    started = time.monotonic()
    status, body = _get(port, "/healthz")
    health = json.loads(body)
    _, metrics = _get(port, "/metrics")
    time.sleep(max(0.0, 2.0 - (time.monotonic() - started)))
    text = (cfg.parent / "mqgw.log").read_text(errors="replace")
    assert status == 503 and health["plugins"] == {
        "good": True, "wrong-ca": False, "expired": False, "bad-password": False,
        "no-client-cert": False,
    }, health
    assert "Traceback" not in text
    for name, cause in CAUSES.items():
        lines = [ln for ln in text.splitlines() if f"plugin instance {name} " in ln]
        assert len(lines) >= 3, text[-3000:]
        for line in lines:
            assert re.search(
                rf"WARNING.*plugin instance {name} cannot start yet: mqtt plugin '{name}': "
                rf"{cause} \(check ", line
            ), line
        # any other line naming the instance is DEBUG detail, not a second error line
        others = [ln for ln in text.splitlines() if f"'{name}'" in ln and ln not in lines]
        assert all(" DEBUG " in ln or "DEBUG" in ln.split(":", 1)[0] for ln in others), others
        # backoff: a few attempts in these seconds, not a tight loop
        assert len(lines) <= 12, len(lines)
        kind = "auth" if name == "bad-password" else "tls"
        counted = re.search(
            rf'mqgw_plugin_stat\{{plugin="{name}",stat="{kind}_failures"\}} ([0-9.]+)', metrics
        )
        assert counted is not None and float(counted.group(1)) >= 3, metrics
    assert re.search(r'mqgw_plugin_stat\{plugin="good",stat="connected"\} 1\.0', metrics)
    assert proc.poll() is None, "the gateway must keep running and retrying"


@pytest.mark.mqtt
def test_no_secret_in_debug_log_metrics_or_check(failing_gateway: Any) -> None:
    cfg, port, _ = failing_gateway
    text = (cfg.parent / "mqgw.log").read_text(errors="replace")
    _, metrics = _get(port, "/metrics")
    _, health = _get(port, "/healthz")
    assert " DEBUG " in text or "DEBUG" in text, "the log must be at DEBUG level"
    assert "Sending CONNECT" in text  # paho's debug lines are there ...
    check = subprocess.run(
        _mqgw("run", "--config", str(cfg), "--check"), capture_output=True, text=True,
        timeout=60, cwd=cfg.parent,
    )
    assert check.returncode == 0, check.stderr
    assert "plugin instance bad-password: mqtt -> 127.0.0.1:" in check.stdout
    for secret in (PASSWORD, WRONG_PASSWORD):
        for where, out in (("log", text), ("metrics", metrics), ("healthz", health),
                           ("--check", check.stdout + check.stderr)):
            assert secret not in out, f"a secret leaked into {where}"
