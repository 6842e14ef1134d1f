"""The metrics endpoint's TLS and authentication (issue 15 deliverable 3), against a
running GatewayApp: real HTTPS handshakes with the devstack certificates, a bearer token
and basic auth on ``/metrics`` (401 with WWW-Authenticate when missing or wrong),
``/healthz`` open for probes, mutual TLS, the start-up warning on a non-loopback bind,
and no secret in the logs (DEBUG) or in ``mqgw run --check``."""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.devstack.certs import DevCertificates, make_dev_certificates
from gateway.devstack.ports import free_port
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.errors import ConfigErrors, GatewayRuntimeError
from gateway.runtime.registry import PluginRegistry
from gateway.runtime.run import run_command
from plugins.memory import reset_buses

TOKEN = "tok-7f3a9c1e5b"  # test values, looked for in logs and --check output
PASSWORD = "pw-4e8d2b6a0c"
KEY_PASSPHRASE = "kp-1a2b3c4d5e"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return make_dev_certificates(tmp_path_factory.mktemp("certs"))


def _data(metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        "broker": {"wait_ms": 50},
        "metrics": {"host": "127.0.0.1", "port": 0, **metrics},
        "plugins": [{"name": "mem", "plugin": "memory", "config": {"bus": "sec"}}],
    }


@asynccontextmanager
async def running(tmp_path: Path, metrics: dict[str, Any]) -> AsyncIterator[GatewayApp]:
    reset_buses()
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(parse_config(_data(metrics), registry, base_dir=tmp_path), registry)
    await app.start()
    try:
        yield app
    finally:
        await app.shutdown()


def _client_context(
    ca: Path, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


async def _get(
    app: GatewayApp, path: str, *, ctx: ssl.SSLContext | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request from another thread (the server runs on this loop)."""
    assert app.http is not None
    port = app.http.port

    def call() -> tuple[int, dict[str, str], bytes]:
        conn: http.client.HTTPConnection
        if ctx is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        else:
            conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ctx)
        try:
            conn.request("GET", path, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    return await asyncio.to_thread(call)


def _no_secret_in(text: str) -> None:
    for value in (TOKEN, PASSWORD, KEY_PASSPHRASE):
        assert value not in text


async def test_https_and_bearer_token(
    tmp_path: Path, certs: DevCertificates, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("MQGW_TEST_METRICS_TOKEN", TOKEN)
    metrics = {
        "tls": {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)},
        "auth": {"token": {"env": "MQGW_TEST_METRICS_TOKEN"}},
    }
    async with running(tmp_path, metrics) as app:
        assert app.http is not None and app.http.url.startswith("https://127.0.0.1:")
        ctx = _client_context(certs.ca_cert)
        status, headers, _ = await _get(app, "/metrics", ctx=ctx)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer ")
        status, headers, _ = await _get(
            app, "/metrics", ctx=ctx, headers={"Authorization": "Bearer not-the-token"})
        assert status == 401 and headers["www-authenticate"].startswith("Bearer ")
        status, _, body = await _get(
            app, "/metrics", ctx=ctx, headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and b"mqgw_plugin_up" in body
        status, _, body = await _get(app, "/healthz", ctx=ctx)  # probes need no token
        assert status in (200, 503) and body.startswith(b"{")
        # a client trusting another CA refuses the server: the handshake is real
        with pytest.raises(ssl.SSLCertVerificationError):
            await _get(app, "/healthz", ctx=_client_context(certs.other_ca_cert))
        # plain HTTP to the HTTPS port: refused, the server keeps serving, no traceback
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            await _get(app, "/healthz")
        status, _, _ = await _get(app, "/healthz", ctx=ctx)
        assert status in (200, 503)
    assert any("refused GET /metrics" in r.getMessage() and "wrong token" in r.getMessage()
               for r in caplog.records)
    assert not any(r.levelno >= logging.ERROR for r in caplog.records)
    assert not any(r.exc_info for r in caplog.records)
    _no_secret_in(caplog.text)


async def test_basic_auth_from_a_file(
    tmp_path: Path, certs: DevCertificates, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = tmp_path / "metrics-password"
    secret.write_text(PASSWORD + "\n")
    metrics = {"auth": {"username": "prometheus", "password": {"file": str(secret)}}}
    async with running(tmp_path, metrics) as app:

        def basic(user: str, password: str) -> dict[str, str]:
            raw = base64.b64encode(f"{user}:{password}".encode()).decode()
            return {"Authorization": f"Basic {raw}"}

        status, headers, _ = await _get(app, "/metrics")
        assert status == 401 and headers["www-authenticate"].startswith("Basic realm=")
        status, _, _ = await _get(app, "/metrics", headers=basic("prometheus", "wrong"))
        assert status == 401
        status, _, _ = await _get(app, "/metrics", headers=basic("other", PASSWORD))
        assert status == 401
        status, _, _ = await _get(app, "/metrics", headers={"Authorization": f"Bearer {PASSWORD}"})
        assert status == 401
        status, _, body = await _get(app, "/metrics", headers=basic("prometheus", PASSWORD))
        assert status == 200 and b"mqgw_" in body
        secret.write_text("rotated\n")  # read at each request: rotation needs no restart
        status, _, _ = await _get(app, "/metrics", headers=basic("prometheus", "rotated"))
        assert status == 200
        status, _, _ = await _get(app, "/healthz")
        assert status in (200, 503)
    _no_secret_in(caplog.text)


async def test_protect_metrics_false_leaves_metrics_open(tmp_path: Path) -> None:
    metrics = {"auth": {"token": TOKEN, "protect_metrics": False}}
    async with running(tmp_path, metrics) as app:
        status, _, _ = await _get(app, "/metrics")
        assert status == 200


async def test_mutual_tls_with_an_encrypted_key(
    tmp_path: Path, certs: DevCertificates, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from cryptography.hazmat.primitives import serialization

    caplog.set_level(logging.DEBUG)
    key = serialization.load_pem_private_key(certs.server_key.read_bytes(), password=None)
    encrypted = tmp_path / "server-encrypted.key"
    encrypted.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(KEY_PASSPHRASE.encode())))
    monkeypatch.setenv("MQGW_TEST_KEY_PASSPHRASE", KEY_PASSPHRASE)
    metrics = {"tls": {
        "cert_file": str(certs.server_cert), "key_file": str(encrypted),
        "key_password": {"env": "MQGW_TEST_KEY_PASSPHRASE"},
        "client_ca_file": str(certs.ca_cert),
    }}
    async with running(tmp_path, metrics) as app:
        with_cert = _client_context(certs.ca_cert, certs.client_cert, certs.client_key)
        status, _, _ = await _get(app, "/metrics", ctx=with_cert)
        assert status == 200
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            await _get(app, "/metrics", ctx=_client_context(certs.ca_cert))
        status, _, _ = await _get(app, "/healthz", ctx=with_cert)
        assert status in (200, 503)
    assert not any(r.exc_info for r in caplog.records)
    _no_secret_in(caplog.text)


async def test_bad_tls_files_are_refused_naming_the_key(
    tmp_path: Path, certs: DevCertificates
) -> None:
    missing = {"tls": {"cert_file": "nowhere.pem", "key_file": str(certs.server_key)}}
    with pytest.raises(ConfigErrors) as err:
        async with running(tmp_path, missing):
            pass
    [problem] = err.value.errors
    assert problem.key == "metrics.tls.cert_file" and "nowhere.pem" in str(problem)
    mismatched = {"tls": {"cert_file": str(certs.server_cert),
                          "key_file": str(certs.client_key)}}
    with pytest.raises(GatewayRuntimeError, match=r"metrics\.tls: cannot load"):
        async with running(tmp_path, mismatched):
            pass


@pytest.mark.parametrize(
    ("secure", "warned"), [(False, True), (True, False)], ids=["open", "tls+auth"]
)
async def test_warning_on_a_non_loopback_bind(
    tmp_path: Path, certs: DevCertificates, caplog: pytest.LogCaptureFixture,
    secure: bool, warned: bool,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.runtime.metrics")
    metrics: dict[str, Any] = {"host": "0.0.0.0", "port": free_port()}
    if secure:
        metrics["tls"] = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}
        metrics["auth"] = {"token": TOKEN}
    async with running(tmp_path, metrics):
        pass
    lines = [
        r.getMessage() for r in caplog.records if "reachable from other hosts" in r.getMessage()
    ]
    assert bool(lines) is warned
    if warned:
        assert "without TLS or authentication" in lines[0]


def test_auth_config_is_validated() -> None:
    registry = PluginRegistry.from_entry_points()
    bad: list[dict[str, Any]] = [
        {"token": "a", "username": "u", "password": "p"},
        {"username": "u"},
        {},
        {"token": "a", "realm": "x"},
    ]
    for auth in bad:
        with pytest.raises(ConfigErrors) as err:
            parse_config({"metrics": {"auth": auth}}, registry)
        assert all(e.key.startswith("metrics.auth") for e in err.value.errors)


def test_check_prints_the_effective_config_with_secrets_as_their_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("MQGW_TEST_METRICS_TOKEN", TOKEN)
    (tmp_path / "tls").mkdir()
    for name in ("server.pem", "server.key"):  # --check wants them to exist
        (tmp_path / "tls" / name).write_text("-")
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "queue_manager": {"type": "ibmmq", "name": "QM1", "user": "app",
                          "password": PASSWORD, "tls_cipher_spec": "ANY_TLS12_OR_HIGHER"},
        "metrics": {
            "tls": {"cert_file": "tls/server.pem", "key_file": "tls/server.key",
                    "key_password": {"file": "/run/secrets/metrics-key"}},
            "auth": {"token": {"env": "MQGW_TEST_METRICS_TOKEN"}},
        },
        "plugins": [{"name": "mem", "plugin": "memory", "config": {"bus": "check"}}],
    }))
    assert run_command(argparse.Namespace(config=config, check=True)) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "effective configuration" in text
    assert "<secret from env MQGW_TEST_METRICS_TOKEN>" in text
    assert "<secret from file /run/secrets/metrics-key>" in text
    assert "password: <secret from inline>" in text
    assert "tls_cipher_spec: ANY_TLS12_OR_HIGHER" in text and "bus: check" in text
    _no_secret_in(text)
    _no_secret_in(caplog.text)


def test_effective_config_hides_plain_strings_under_secret_keys() -> None:
    from pydantic import BaseModel, SecretStr

    from gateway.runtime.effective_config import HIDDEN, redacted

    class Legacy(BaseModel):
        password: str = PASSWORD
        password_env: str = "MQPW"
        api_token: SecretStr = SecretStr(TOKEN)
        host: str = "h"

    assert redacted(Legacy()) == {
        "password": HIDDEN, "password_env": "MQPW", "api_token": HIDDEN, "host": "h"
    }


async def test_an_oversized_header_closes_the_connection_and_the_server_keeps_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with running(tmp_path, {"auth": {"token": TOKEN}}) as app:
        assert app.http is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", app.http.port)
        try:
            writer.write(b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer " + b"x" * 100_000
                         + b"\r\n\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 10)
        except ConnectionResetError:  # closed with our bytes unread: a reset
            answer = b""
        assert answer == b""  # closed without an answer
        writer.close()
        status, _, _ = await _get(app, "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200
    assert not any(r.exc_info for r in caplog.records)


def test_a_refusal_never_echoes_what_may_be_a_credential() -> None:
    """A token sent without ``Bearer`` (a common scraper mistake) is refused without any
    part of it in the reason, which is logged; known schemes are named."""
    from gateway.runtime.config import MetricsAuthConfig
    from gateway.runtime.metrics import refusal

    token_auth = MetricsAuthConfig.model_validate({"token": "s3cr3t-token-abcdefgh"})
    why = refusal(token_auth, "s3cr3t-token-abcdefgh")
    assert why is not None and "s3cr3t" not in why and "malformed" in why
    why = refusal(token_auth, "Basic czNjcjN0")
    assert why == "Basic credentials where a bearer token is required"
    basic = MetricsAuthConfig.model_validate({"username": "u", "password": "pw-secret-123"})
    why = refusal(basic, "pw-secret-123 x")
    assert why is not None and "pw-secret" not in why
