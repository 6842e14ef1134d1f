"""A session fixture whose service cannot start FAILS the tests using it, with the log tail.

Runs an inner pytest session that uses this project's real ``tests/conftest.py`` with a
Java that cannot start, and checks the outcome: errors (not skips), and the log shown.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"

INNER_TESTS = """
def test_one(kafka_broker):
    assert kafka_broker.bootstrap

def test_two(kafka_broker):
    assert kafka_broker.bootstrap

def test_without_kafka():
    assert True
"""


def test_kafka_fixture_failure_errors_tests_and_shows_log(tmp_path: Path) -> None:
    java_home = tmp_path / "jdk"
    (java_home / "bin").mkdir(parents=True)
    java = java_home / "bin" / "java"
    calls = tmp_path / "java-calls"
    java.write_text(
        f'#!/bin/sh\necho x >> {calls}\necho "fake-jvm: Could not reserve enough space"\nexit 1\n'
    )
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "conftest.py").write_text(CONFTEST.read_text())
    (inner / "test_inner.py").write_text(INNER_TESTS)
    env = dict(os.environ, JAVA_HOME=str(java_home))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rA",
            "-o",
            "markers=kafka\nmqtt\nspark",
            str(inner),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=inner,
        timeout=120,
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "1 passed, 2 errors" in out, out
    assert "skipped" not in out
    assert "fake-jvm: Could not reserve enough space" in out
    # started once per session: the failure is cached, not retried for the second test
    assert calls.read_text().splitlines() == ["x"]


INNER_FAILING_MQTT_TEST = """
def test_fails_while_using_mosquitto(mqtt_broker):
    assert mqtt_broker.port == -1
"""


def test_failed_test_using_a_broker_reports_the_broker_log(tmp_path: Path) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "conftest.py").write_text(CONFTEST.read_text())
    (inner / "test_inner.py").write_text(INNER_FAILING_MQTT_TEST)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-o",
            "markers=mqtt",
            str(inner),
        ],
        capture_output=True,
        text=True,
        cwd=inner,
        timeout=120,
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "1 failed" in out, out
    assert "mqtt_broker log tail" in out, out
    assert "mosquitto.log" in out
    assert "mosquitto version" in out  # the log's content, not just its name
