"""Issue 15: the kafka plugin over TLS and SASL (``security:``), against ONE real broker
with SSL (client certificate), SASL_SSL (PLAIN, SCRAM-SHA-256/512), expired-certificate
and wrong-host-name listeners (tests/support/secure_kafka.py).

Round trips MQ -> Kafka and Kafka -> MQ per mechanism; Kafka's own console consumer
reads what the gateway wrote over SSL and SASL_SSL; each failure (wrong CA, expired
certificate, host name mismatch, missing client certificate, wrong password, unknown
user) is one clear line naming the instance and cause, retried with backoff, visible in
/healthz and /metrics, with no secret in the DEBUG log or ``mqgw run --check`` output.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gateway.devstack import console_tool_command
from gateway.devstack.ports import free_ports
from gateway.wire.constants import MsgType
from plugins.kafka import KafkaPluginConfig
from plugins.kafka.errors import KafkaSecurityError
from plugins.kafka.security import KafkaSecurityConfig, KafkaTlsConfig, preflight, ssl_context
from tests.plugins.kafka.kafka_harness import (
    CONTROL,
    STOCK,
    consume,
    produce,
    send_command,
    start_gateway,
    unique,
    wait_for_queue,
)
from tests.support.pubsub_messages import rfh_message
from tests.support.secure_kafka import SecureKafka, secure_kafka

__all__ = ["secure_kafka"]  # the module-scoped fixture

KINDS = ["ssl", "plain", "scram-256", "scram-512"]


# ------------------------------------------------------------ config validation ----


@pytest.mark.parametrize(
    "key", ["security_protocol", "ssl_context", "sasl_mechanism", "sasl_plain_password"]
)
def test_client_options_refuse_security_keys(key: str) -> None:
    with pytest.raises(ValidationError) as info:
        KafkaPluginConfig.model_validate({"client_options": {key: "x"}})
    text = str(info.value)
    assert key in text and "security: block" in text


def test_missing_tls_file_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as info:
        KafkaPluginConfig.model_validate(
            {"security": {"protocol": "SSL", "tls": {"ca_file": str(tmp_path / "nope.pem")}}}
        )
    [err] = info.value.errors()
    assert err["loc"] == ("security", "tls", "ca_file")
    assert "nope.pem: no such file" in err["msg"]


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        ({"protocol": "SASL_SSL"}, "needs a sasl: block"),
        (
            {"protocol": "SSL", "sasl": {"username": "u", "password": "p"}},
            "sasl: is given but protocol is SSL",
        ),
        ({"protocol": "PLAINTEXT", "tls": {}}, "tls: is given but protocol is PLAINTEXT"),
        ({"protocol": "TLS"}, "Input should be"),
        ({"protocol": "SASL_SSL", "sasl": {"mechanism": "GSSAPI", "username": "u",
                                           "password": "p"}}, "Input should be"),
    ],
)
def test_inconsistent_security_blocks_are_refused(block: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as info:
        KafkaSecurityConfig.model_validate(block)
    assert problem in str(info.value)


def test_ssl_without_ca_file_uses_system_cas_and_checks_host_names() -> None:
    context = ssl_context(KafkaTlsConfig(), "k")
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert not ssl_context(KafkaTlsConfig(check_hostname=False), "k").check_hostname


def test_password_never_in_config_repr_or_dump() -> None:
    cfg = KafkaPluginConfig.model_validate({"security": {
        "protocol": "SASL_SSL", "sasl": {"username": "u", "password": "hunter2-literal"}}})
    assert "hunter2-literal" not in repr(cfg)
    assert "hunter2-literal" not in str(cfg.model_dump())
    assert "hunter2-literal" not in cfg.model_dump_json()


def _mqgw(config: Path, *extra: str, env: dict[str, str] | None = None,
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", "run", "--config", str(config), *extra],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **(env or {})}, cwd=config.parent,
    )


def _gateway_yaml(tmp: Path, plugins: list[dict[str, Any]], *, port: int = 0,
                  level: str = "info") -> Path:
    config = {
        "id": "gw-sec",
        "queue_manager": {"data_dir": "qm"},
        "broker": {"store": "pubsub.db"},
        "metrics": {"enabled": bool(port), "port": port},
        "logging": {"format": "text", "level": level},
        "plugins": plugins,
    }
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _kafka(name: str, bootstrap: str, security: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "plugin": "kafka",
            "config": {"bootstrap_servers": bootstrap, "security": security}}


def test_check_output_has_no_secret_and_names_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("not checked by --check beyond existence\n")
    ok = _gateway_yaml(tmp_path, [_kafka("k", "127.0.0.1:1", {
        "protocol": "SASL_SSL", "tls": {"ca_file": str(tmp_path / "ca.pem")},
        "sasl": {"username": "u", "password": "literal-pw-1"}}), _kafka("k2", "127.0.0.1:1", {
        "protocol": "SASL_SSL", "sasl": {"mechanism": "SCRAM-SHA-512", "username": "u",
                                         "password": {"env": "KSEC_PW"}}})])
    done = _mqgw(ok, "--check", env={"KSEC_PW": "env-pw-2"})
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert "plugin instance k: kafka" in out
    assert "literal-pw-1" not in out and "env-pw-2" not in out

    bad = _gateway_yaml(tmp_path, [_kafka("k", "127.0.0.1:1", {
        "protocol": "SSL", "tls": {"ca_file": str(tmp_path / "gone.pem")},
    })])
    done = _mqgw(bad, "--check")
    assert done.returncode == 2
    assert "plugins[0].config.security.tls.ca_file" in done.stderr
    assert "gone.pem: no such file" in done.stderr
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------ real broker ----------


def _config(
    secure: SecureKafka, kind: str, prefix: str, inbound: str, backend: str = "aiokafka"
) -> KafkaPluginConfig:
    return KafkaPluginConfig.model_validate({
        "bootstrap_servers": secure.address(secure.listener_of(kind)),
        "backend": backend,
        "security": secure.security(kind),
        "outbound": {"topic_template": prefix + ".{stream}", "routes": [{"stream": STOCK}]},
        "inbound": {"group_id": unique("g"),
                    "topics": [{"kafka_topic": inbound, "stream": STOCK, "topic": "Sec/In"}]},
    })


async def _subscribe(gw: Any) -> None:
    await send_command(gw.qm, rfh_message(
        CONTROL,
        [("MQPSCommand", "RegSub"), ("MQPSStreamName", STOCK), ("MQPSTopic", "Sec/*"),
         ("MQPSQName", "SUB.RFH")],
        reply_to_q="REPLY.Q", msg_type=MsgType.REQUEST,
    ))
    [reply] = await wait_for_queue(gw.qm, "REPLY.Q", 1)
    assert reply.get("MQPSCompCode") in (None, "0")


async def _publish(gw: Any, topic: str, payload: bytes) -> None:
    await send_command(gw.qm, rfh_message(
        STOCK, [("MQPSCommand", "Publish"), ("MQPSStreamName", STOCK), ("MQPSTopic", topic)],
        payload,
    ))


@pytest.mark.kafka
@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
@pytest.mark.parametrize("kind", KINDS)
async def test_round_trip_mq_to_kafka_and_back(
    secure_kafka: SecureKafka, tmp_path: Path, kind: str, backend: str
) -> None:
    prefix, inbound = unique(f"sec-{kind}-out"), unique(f"sec-{kind}-in")
    gw = await start_gateway(tmp_path, _config(secure_kafka, kind, prefix, inbound, backend))
    try:
        assert gw.instance.healthy()
        await _subscribe(gw)
        await _publish(gw, "Out/Sec", f"over {kind}".encode())
        [record] = await consume(secure_kafka.plaintext, f"{prefix}.{STOCK}", 1, timeout=60)
        assert (record.key, record.value) == (b"Out/Sec", f"over {kind}".encode())

        await produce(secure_kafka.plaintext, inbound, [(b"Sec/Back", b"back " + kind.encode(),
                                                         [])])
        [got] = await wait_for_queue(gw.qm, "SUB.RFH", 1, timeout=60)
        assert (got.topic, got.payload) == ("Sec/Back", b"back " + kind.encode())
    finally:
        await gw.close()


def _console_consume(properties: Path, bootstrap: str, topic: str) -> str:
    proc = subprocess.run(
        console_tool_command(
            "kafka-console-consumer", "--bootstrap-server", bootstrap, "--topic", topic,
            "--command-config", str(properties), "--from-beginning", "--max-messages", "1",
            "--timeout-ms", "60000", "--formatter-property", "print.key=true",
            "--formatter-property", "key.separator=|",
        ),
        capture_output=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    return proc.stdout.decode(errors="replace")


@pytest.mark.kafka
@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_kafka_console_consumer_reads_what_the_gateway_wrote_over_tls_and_sasl(
    secure_kafka: SecureKafka, tmp_path: Path, backend: str
) -> None:
    prefix = unique("sec-console")
    gw = await start_gateway(tmp_path, _config(secure_kafka, "scram-512", prefix,
                                               unique("sec-console-in"), backend))
    try:
        await _publish(gw, "Sec/Console", b"IBM 120.00")
        topic = f"{prefix}.{STOCK}"
        for kind in ("ssl", "plain"):  # client certificate; SASL_SSL PLAIN
            out = await asyncio.to_thread(
                _console_consume, secure_kafka.client_properties(kind),
                secure_kafka.address(secure_kafka.listener_of(kind)), topic)
            assert [ln for ln in out.splitlines() if ln] == ["Sec/Console|IBM 120.00"], kind
    finally:
        await gw.close()


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _failure_cases(secure: SecureKafka) -> dict[str, tuple[str, dict[str, Any], str]]:
    """instance -> (bootstrap, security block, the cause its line must name)."""
    ca = str(secure.certs.ca_cert)
    scram = secure.security("scram-512")
    return {
        "k-wrong-ca": (secure.address("SSL"), {"protocol": "SSL", "tls": {
            "ca_file": str(secure.certs.other_ca_cert), "cert_file": str(secure.certs.client_cert),
            "key_file": str(secure.certs.client_key)}},
            "TLS handshake failed: unable to get local issuer certificate (the broker's "
            "certificate is not signed by security.tls.ca_file)"),
        "k-expired": (secure.address("EXPIRED"), {"protocol": "SSL", "tls": {"ca_file": ca}},
                      "TLS handshake failed: certificate has expired"),
        "k-hostname": (secure.address("MISMATCH"), {"protocol": "SSL", "tls": {
            "ca_file": str(secure.mismatch_ca)}},
            "TLS handshake failed: IP address mismatch, certificate is not valid for "
            "'127.0.0.1'. (connect by a name the broker's certificate lists, or set "
            "security.tls.check_hostname: false)"),
        "k-no-client-cert": (secure.address("SSL"), {"protocol": "SSL", "tls": {"ca_file": ca}},
                             "TLS handshake failed: SSLV3_ALERT_BAD_CERTIFICATE (the broker "
                             "refused the client certificate: security.tls.cert_file)"),
        "k-wrong-password": (secure.address("SASL_SSL"), {**scram, "sasl": {
            **scram["sasl"], "password": "wrong-literal-pw"}},
            "SASL authentication failed for user 'carol' with SCRAM-SHA-512: wrong password "
            "or unknown user"),
        "k-unknown-user": (secure.address("SASL_SSL"), {**secure.security("plain"), "sasl": {
            "mechanism": "PLAIN", "username": "mallory", "password": {"env": "KSEC_PLAIN_PW"}}},
            "SASL authentication failed for user 'mallory' with PLAIN: wrong password or "
            "unknown user"),
    }


@pytest.mark.kafka
def test_tls_and_sasl_failures_are_one_clear_line_retried_and_visible(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    cases = _failure_cases(secure_kafka)
    # One healthy instance too: its real SCRAM password (from a file) is used for
    # every connection and must not reach the DEBUG log either.
    pw_file = tmp_path / "scram.pw"
    pw_file.write_text(secure_kafka.scram_password + "\n")
    good = secure_kafka.security("scram-512")
    good["sasl"]["password"] = {"file": str(pw_file)}
    plugins = [_kafka(n, b, s) for n, (b, s, _) in cases.items()]
    plugins.append(_kafka("k-good", secure_kafka.address("SASL_SSL"), good))
    [port] = free_ports(1)
    config = _gateway_yaml(tmp_path, plugins, port=port, level="debug")
    log_path = tmp_path / "gateway.log"
    env = {**os.environ, "KSEC_PLAIN_PW": secure_kafka.plain_password, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.runtime.cli", "run", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, env=env,
        )
    try:
        deadline = time.monotonic() + 45
        counts: dict[str, int] = {}
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            text = log_path.read_text(encoding="utf-8", errors="replace")
            counts = {
                name: len(re.findall(
                    rf"plugin instance {name} cannot start yet: kafka plugin '{name}': "
                    + re.escape(cause) + r" \(server 127\.0\.0\.1:\d+\)\n", text))
                for name, (_, _, cause) in cases.items()
            }
            if min(counts.values()) >= 2 and "plugin instance k-good started" in text:
                break
            time.sleep(0.25)
        elapsed = time.monotonic() - started
        assert min(counts.values()) >= 2, (counts, text[-4000:])
        # Capped exponential backoff (0.5 s doubling, jitter 0.5-1.5): a handful of
        # attempts in this time, never a tight loop.
        assert max(counts.values()) <= 2 + int(elapsed), (counts, elapsed)
        status, body = _get(port, "/healthz")
        health = json.loads(body)
        assert status == 503 and health["plugins"]["k-good"] is True
        assert all(health["plugins"][n] is False for n in cases)
        _, metrics = _get(port, "/metrics")
        for name, (_, _, cause) in cases.items():
            kind = "sasl" if "SASL" in cause else "tls"
            assert f'mqgw_plugin_stat{{plugin="{name}",stat="security_failing"}} 1.0' in metrics
            found = re.search(rf'mqgw_plugin_stat{{plugin="{name}",'
                              rf'stat="security_failures_{kind}"}} (\d+)', metrics)
            assert found and int(found.group(1)) >= 2, (name, kind)
    finally:
        proc.terminate()
        proc.wait(30)
    text = log_path.read_text(encoding="utf-8", errors="replace")
    assert "DEBUG" in text  # the level under test
    assert "Traceback" not in text
    for secret in (secure_kafka.scram_password, secure_kafka.plain_password, "wrong-literal-pw"):
        assert secret not in text


@pytest.mark.kafka
async def test_preflight_accepts_a_wrong_name_with_check_hostname_false_and_ignores_a_down_broker(
    secure_kafka: SecureKafka,
) -> None:
    tls = {"ca_file": str(secure_kafka.mismatch_ca)}
    strict = KafkaSecurityConfig.model_validate({"protocol": "SSL", "tls": tls})
    with pytest.raises(KafkaSecurityError) as info:
        await preflight(secure_kafka.address("MISMATCH"), strict, "k")
    assert info.value.cause == "tls" and info.value.retriable
    lax = KafkaSecurityConfig.model_validate(
        {"protocol": "SSL", "tls": {**tls, "check_hostname": False}})
    await preflight(secure_kafka.address("MISMATCH"), lax, "k")
    # Nothing listening: not a security failure (the clients' own start error applies).
    [closed] = free_ports(1)
    await preflight(f"127.0.0.1:{closed}", strict, "k")
