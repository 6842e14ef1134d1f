"""A service that cannot start raises ServiceStartError carrying its log tail and exit code."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gateway.devstack import KafkaBroker, MosquittoBroker, ServiceStartError
from gateway.devstack.mosquitto import mosquitto_conf, mqtt_handshake
from gateway.devstack.ports import free_port
from gateway.devstack.process import pid_alive


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_kafka_failure_carries_log_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    java_home = tmp_path / "jdk"
    (java_home / "bin").mkdir(parents=True)
    _script(java_home / "bin" / "java", 'echo "fake-jvm: cannot start ($*)"; exit 7')
    monkeypatch.setenv("JAVA_HOME", str(java_home))
    broker = KafkaBroker(tmp_path / "kafka")
    with pytest.raises(ServiceStartError) as info:
        broker.start()
    err = info.value
    assert err.service == "kafka"
    assert err.exit_code == 7
    assert "fake-jvm: cannot start" in err.log_tail
    assert "fake-jvm: cannot start" in str(err)


def test_mosquitto_failure_carries_log_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _script(tmp_path / "mosquitto", 'echo "Error: fake broker refuses"; exit 3')
    monkeypatch.setenv("MQGW_MOSQUITTO", str(fake))
    broker = MosquittoBroker(tmp_path / "mq")
    with pytest.raises(ServiceStartError) as info:
        broker.start()
    assert info.value.exit_code == 3
    assert "fake broker refuses" in info.value.log_tail


def test_mosquitto_conf_allows_anonymous_on_loopback_only() -> None:
    lines = mosquitto_conf(port=1884).splitlines()
    assert "listener 1884 127.0.0.1" in lines
    assert "allow_anonymous true" in lines
    assert [ln for ln in lines if ln.startswith("listener")] == ["listener 1884 127.0.0.1"]


def test_handshake_is_false_when_nothing_listens() -> None:
    assert mqtt_handshake("127.0.0.1", free_port(), timeout=0.5) is False


@pytest.mark.mqtt
def test_real_mosquitto_starts_answers_and_stops(tmp_path: Path) -> None:
    with MosquittoBroker(tmp_path / "mq") as broker:
        proc = broker.process
        assert proc is not None
        assert pid_alive(proc.pid, proc.start_time)
        assert mqtt_handshake(broker.host, broker.port)
    assert not pid_alive(proc.pid, proc.start_time)
    assert not mqtt_handshake(broker.host, broker.port, timeout=0.5)
