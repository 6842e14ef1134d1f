"""Shared session fixtures: real Kafka, real Mosquitto and a local SparkSession.

Lazy: a service starts the first time a test asks for its fixture, once per session,
and stops when the session ends (also on Ctrl-C: the devstack kills its children at exit
and the kernel does when pytest dies). A service that cannot start FAILS every test that
uses it, with the service's log tail in the report; nothing is skipped.

- ``kafka_broker``: ``gateway.devstack.KafkaBroker`` (``.bootstrap`` "127.0.0.1:<port>",
  ``.log_path``), single node KRaft, auto topic creation on, 1 partition by default.
- ``mqtt_broker``: ``gateway.devstack.MosquittoBroker`` (``.host``, ``.port``), anonymous.
- ``spark_session``: a ``SparkSession`` (``local[2]``, UI off, 2 shuffle partitions,
  driver on 127.0.0.1) with the Kafka connector jars on its classpath.

Tests that use one of these get the matching marker (kafka / mqtt / spark) added, so
``pytest -m "not kafka and not spark"`` runs without starting a JVM.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.devstack import (
    DevstackError,
    KafkaBroker,
    MosquittoBroker,
    spark_session_conf,
)
from gateway.devstack.process import log_tail

try:
    from tests.support import parallel
except ImportError:  # this file run on its own (tests/devstack/test_devstack_fixtures.py)
    parallel = None  # type: ignore[assignment]

_SERVICE_MARKERS = {"kafka_broker": "kafka", "mqtt_broker": "mqtt", "spark_session": "spark"}


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests driven by Debian's MQTT command-line clients fail, never skip, without them
    (tools/setup.sh installs them; a skip would hide an untested path)."""
    if item.get_closest_marker("mosquitto_clients") is None:
        return
    missing = [c for c in ("mosquitto_pub", "mosquitto_sub") if shutil.which(c) is None]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not on PATH: install Debian's mosquitto-clients "
                    "(make setup does)", pytrace=False)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        for fixture, marker in _SERVICE_MARKERS.items():
            if fixture in names and item.get_closest_marker(marker) is None:
                item.add_marker(getattr(pytest.mark, marker))
    if parallel is not None:
        parallel.mark_process_tests(items)
        parallel.plan(items, parallel.worker_count(config))


@pytest.hookimpl(trylast=True)  # after the slowest tests (--durations)
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """``make test``'s wall time, set-up and lint measured apart (tools/run_tests.sh)."""
    times = dict(
        kv.split("=", 1) for kv in os.environ.get("MQGW_TEST_TIMES", "").split() if "=" in kv
    )
    if "start" not in times or hasattr(config, "workerinput"):
        return
    total = time.time() - float(times["start"])
    setup, lint = float(times.get("setup", 0)), float(times.get("lint", 0))
    workers = times.get("workers", "0")
    terminalreporter.write_sep("=", "wall time")
    terminalreporter.write_line(
        f"make {'test' if times.get('mode') == 'test' else 'test-quick'}: "
        f"{round(total) // 60} min {round(total) % 60} s wall = set-up {setup:.1f} s + lint "
        f"{lint:.1f} s + tests {total - setup - lint:.1f} s "
        f"({workers if workers != '0' else 'no'} pytest-xdist workers)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On a failed test that used a broker, attach the broker's log tail to the report."""
    outcome: Any = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    for fixture in ("kafka_broker", "mqtt_broker"):
        broker = funcargs.get(fixture)
        path = getattr(broker, "log_path", None)
        if path is not None:
            report.sections.append((f"{fixture} log tail ({path})", log_tail(path, 30)))


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    try:
        broker.start()
    except DevstackError as exc:
        broker.stop()
        pytest.fail(f"the Kafka broker fixture could not start:\n{exc}", pytrace=False)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def mqtt_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MosquittoBroker]:
    broker = MosquittoBroker(tmp_path_factory.mktemp("mosquitto"))
    try:
        broker.start()
    except DevstackError as exc:
        broker.stop()
        pytest.fail(f"the Mosquitto fixture could not start:\n{exc}", pytrace=False)
    try:
        yield broker
    finally:
        broker.stop()


def _shutdown_spark(spark: Any) -> None:
    """Stop the session *and* its JVM (pyspark would leave it running until exit)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    spark.stop()
    if gateway is not None:
        with contextlib.suppress(Exception):
            gateway.shutdown()
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    SparkContext._gateway = None
    SparkContext._jvm = None


@pytest.fixture(scope="session")
def spark_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    work_dir = tmp_path_factory.mktemp("spark")
    try:
        conf = spark_session_conf(work_dir, app_name="mqgw-tests", fast_start=True)
    except DevstackError as exc:
        pytest.fail(f"the Spark fixture has no Kafka connector jars:\n{exc}", pytrace=False)
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # the JVM's own output went to this test's captured stderr
        pytest.fail(f"the Spark fixture could not start a SparkSession: {exc}", pytrace=False)
    spark.sparkContext.setLogLevel("WARN")
    try:
        yield spark
    finally:
        _shutdown_spark(spark)
