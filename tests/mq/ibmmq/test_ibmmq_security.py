"""The IBM MQ adapter's TLS and user/password (issue 15), through the stand-in MQI module
(tests/support/mqi_standin.py): the configured fields reach the MQCD, MQSCO and the MQCSP
keywords, the password comes from a Secret and is never logged, and the connect failures
an operator meets when securing a channel (2035, 2393, 2397, 2059) are one line naming
the cause, retried with backoff only where waiting can help."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gateway.mq.ibmmq import IBMMQConfig, IBMMQQueueManager
from gateway.mq.port import MQError
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import IBMMQQueueManagerConfig, parse_config
from gateway.runtime.errors import GatewayRuntimeError
from gateway.runtime.registry import PluginRegistry
from gateway.secrets import Secret
from tests.support.mqi_standin import StandIn

PASSWORD = "s3cr3t-Pa55-word"  # a test value, looked for in logs


async def _no_sleep(s: float) -> None:
    return None


def _connect_args(standin: StandIn) -> dict[str, Any]:
    call = standin.calls[0]
    assert call.name == "connect_with_options"
    return call.args


async def test_tls_and_credentials_reach_the_mqcd_mqsco_and_mqcsp(
    standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MQ_TEST_PASSWORD", PASSWORD)
    monkeypatch.setenv("MQ_TEST_KEYR_PASSWORD", "keyr-" + PASSWORD)
    cfg = IBMMQConfig.model_validate({
        "q_mgr_name": "STANDIN", "channel": "GW.TLS.SVRCONN", "user": "mqgw",
        "password": {"env": "MQ_TEST_PASSWORD"}, "tls_cipher_spec": "ANY_TLS12_OR_HIGHER",
        "key_repository": "/var/mqm/ssl/client/key.p12", "cert_label": "mqgw-client",
        "key_repository_password": {"env": "MQ_TEST_KEYR_PASSWORD"},
    })
    conn = await IBMMQQueueManager(cfg, mqi=standin.module).connect()
    await conn.disconnect()
    args = _connect_args(standin)
    cd, sco = args["cd"], args["sco"]
    assert cd.SSLCipherSpec == b"ANY_TLS12_OR_HIGHER" and cd.ChannelName == b"GW.TLS.SVRCONN"
    assert sco.KeyRepository == b"/var/mqm/ssl/client/key.p12"
    assert sco.CertificateLabel == b"mqgw-client"
    assert sco.KeyRepoPassword == "keyr-" + PASSWORD and sco.Version >= 6
    # the keywords ibmmq/pymqi turn into an MQCSP (MQCSP_AUTH_USER_ID_AND_PWD)
    assert args["user"] == "mqgw" and args["password"] == PASSWORD
    assert PASSWORD not in repr(cfg) and PASSWORD not in str(cfg.model_dump())


async def test_password_from_a_file_is_read_at_each_connect(
    standin: StandIn, tmp_path: Path
) -> None:
    secret_file = tmp_path / "mq-password"
    secret_file.write_text("first\n")
    cfg = IBMMQConfig(q_mgr_name="STANDIN", user="app",
                      password=Secret(file=secret_file))
    qm = IBMMQQueueManager(cfg, mqi=standin.module)
    await (await qm.connect()).disconnect()
    secret_file.write_text("rotated\n")
    await (await qm.connect()).disconnect()
    passwords = [c.args["password"] for c in standin.calls if c.name == "connect_with_options"]
    assert passwords == ["first", "rotated"]


def test_the_old_literal_password_form_is_still_accepted() -> None:
    cfg = IBMMQConfig(q_mgr_name="QM1", user="app", password="literal")  # type: ignore[arg-type]
    assert isinstance(cfg.password, Secret) and cfg.password.reveal() == "literal"
    assert "literal" not in repr(cfg)


def test_inconsistent_security_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="tls_cipher_spec"):
        IBMMQConfig(q_mgr_name="QM1", key_repository="/var/mqm/ssl/key")
    with pytest.raises(ValueError, match="tls_cipher_spec"):
        IBMMQConfig(q_mgr_name="QM1", cert_label="lbl")
    with pytest.raises(ValueError, match="tls_cipher_spec"):
        IBMMQConfig(q_mgr_name="QM1", key_repository_password=Secret(env="X"))
    with pytest.raises(ValueError, match="user"):
        IBMMQConfig(q_mgr_name="QM1", password=Secret(env="X"))


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        (2035, "not authorized: wrong user or password"),
        (2393, "TLS initialization failed on this side"),
        (2397, "TLS (JSSE) error"),
    ],
)
async def test_auth_and_tls_failures_are_fatal_with_the_cause(
    standin: StandIn, caplog: pytest.LogCaptureFixture, reason: int, cause: str
) -> None:
    caplog.set_level(logging.DEBUG)
    standin.connect_failures = [reason] * 3
    cfg = IBMMQConfig(q_mgr_name="STANDIN", user="app", password=Secret(value=PASSWORD),
                      tls_cipher_spec="ANY_TLS12_OR_HIGHER")
    with pytest.raises(MQError) as err:
        await IBMMQQueueManager(cfg, mqi=standin.module, sleep=_no_sleep).connect()
    assert err.value.reason == reason and not err.value.retriable
    text = str(err.value)
    assert "\n" not in text and cause in text and "STANDIN at 127.0.0.1(1414)" in text
    assert err.value.__cause__ is None  # no MQI traceback chained to the one line
    assert [c.name for c in standin.calls] == ["connect_with_options"]  # no retry
    assert PASSWORD not in caplog.text and PASSWORD not in text


async def test_2059_is_retried_with_backoff_one_line_each(
    standin: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)

    standin.connect_failures = [2059, 2059]
    cfg = IBMMQConfig(q_mgr_name="STANDIN", user="app", password=Secret(value=PASSWORD),
                      backoff_initial_s=0.5, backoff_max_s=4.0)
    qm = IBMMQQueueManager(cfg, mqi=standin.module, sleep=sleep)
    conn = await qm.connect()
    await conn.disconnect()
    assert len(waits) == 2 and 0.25 <= waits[0] <= 0.5 and 0.5 <= waits[1] <= 1.0
    assert qm.connect_failures == {2059: 2}  # exported as mqgw_mq_connect_failures
    lines = [r.getMessage() for r in caplog.records
             if r.name == "gateway.mq.ibmmq.connection" and r.levelno == logging.WARNING]
    assert len(lines) == 2
    for line in lines:
        assert "MQRC_Q_MGR_NOT_AVAILABLE (2059)" in line and "TLS handshake" in line
        assert "retrying in" in line and "\n" not in line
    assert not any(r.exc_info for r in caplog.records)
    assert PASSWORD not in caplog.text


async def test_2059_gives_up_after_the_attempts(standin: StandIn) -> None:
    standin.connect_failures = [2059] * 3
    with pytest.raises(MQError) as err:
        await IBMMQQueueManager(IBMMQConfig(q_mgr_name="STANDIN", connect_attempts=3),
                                mqi=standin.module, sleep=_no_sleep).connect()
    assert err.value.reason == 2059 and "gave up after 3 attempt(s)" in str(err.value)


async def test_an_unreadable_password_names_its_source_only(
    standin: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MQ_TEST_UNSET_PASSWORD", raising=False)
    cfg = IBMMQConfig(q_mgr_name="STANDIN", user="app",
                      password=Secret(env="MQ_TEST_UNSET_PASSWORD"))
    with pytest.raises(MQError) as err:
        await IBMMQQueueManager(cfg, mqi=standin.module, sleep=_no_sleep).connect()
    assert "env MQ_TEST_UNSET_PASSWORD" in str(err.value) and not err.value.retriable
    assert standin.calls == []  # MQCONNX was not even tried


def test_runtime_config_takes_a_secret_or_the_old_password_env() -> None:
    registry = PluginRegistry()
    loaded = parse_config({"queue_manager": {
        "type": "ibmmq", "name": "QM9", "user": "app", "password": {"file": "/run/secrets/mq"},
        "tls_cipher_spec": "ANY_TLS12_OR_HIGHER", "key_repository": "/var/mqm/ssl/key",
        "cert_label": "gw"}}, registry)
    qmc = loaded.gateway.queue_manager
    assert isinstance(qmc, IBMMQQueueManagerConfig)
    assert qmc.password_secret() == Secret(file=Path("/run/secrets/mq"))
    old = IBMMQQueueManagerConfig(type="ibmmq", name="QM9", password_env="MQPW")
    assert old.password_secret() == Secret(env="MQPW")
    with pytest.raises(ValueError, match="not both"):
        IBMMQQueueManagerConfig.model_validate(
            {"type": "ibmmq", "name": "QM9", "password": "x", "password_env": "MQPW"})


async def test_gateway_start_reports_a_wrong_password_in_one_line(
    standin: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``mqgw run`` against IBM MQ with a refused password: start fails with one message
    naming the queue manager and the cause (run.py logs it as ``cannot start: ...``), and
    MQCONNX is not repeated with the refused password."""
    monkeypatch.setitem(__import__("sys").modules, "ibmmq", standin.module)
    monkeypatch.setenv("MQ_TEST_PASSWORD", PASSWORD)
    caplog.set_level(logging.DEBUG)
    standin.connect_failures = [2035] * 10
    registry = PluginRegistry()
    loaded = parse_config({"queue_manager": {
        "type": "ibmmq", "name": "STANDIN", "user": "app",
        "password": {"env": "MQ_TEST_PASSWORD"}}, "metrics": {"enabled": False}},
        registry, base_dir=tmp_path)
    app = GatewayApp(loaded, registry)
    with pytest.raises(GatewayRuntimeError) as err:
        await app.start()
    text = str(err.value)
    assert "IBM MQ queue manager STANDIN at 127.0.0.1(1414)" in text and "not authorized" in text
    assert "MQRC_NOT_AUTHORIZED" in text and "\n" not in text
    assert PASSWORD not in caplog.text and PASSWORD not in text
    attempts = [c for c in standin.calls if c.name == "connect_with_options"]
    # one MQCONNX per start step (stream report, depth sample, broker): none is retried
    assert 1 <= len(attempts) <= 3


async def test_connect_failures_are_counted_on_metrics(
    standin: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway that got through 2059s at start shows them on /metrics by reason."""
    monkeypatch.setitem(__import__("sys").modules, "ibmmq", standin.module)
    standin.connect_failures = [2059]  # the first start step's connect retries once
    registry = PluginRegistry()
    loaded = parse_config({"queue_manager": {"type": "ibmmq", "name": "STANDIN"},
                           "metrics": {"enabled": False}}, registry, base_dir=tmp_path)
    app = GatewayApp(loaded, registry)
    await app.start()
    try:
        assert app.metrics is not None
        text = app.metrics.exposition().decode()
        assert 'mqgw_mq_connect_failures_total{reason="2059"} 1.0' in text
    finally:
        await app.shutdown()
