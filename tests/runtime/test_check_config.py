"""Issue 12 item 7: ``mqgw run --check`` refuses what would crash the start, naming the
key and the file, without a traceback (run as a subprocess, as an operator would)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.devstack import KafkaBroker, MosquittoBroker

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.yaml"
QUIET = "metrics:\n  enabled: false\n"


def mqgw_run(
    config: Path, *extra: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", "run", "--config", str(config), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def kafka_route(stream: str, topic: str) -> str:
    return (
        "plugins:\n  - name: k\n    plugin: kafka\n    config:\n"
        "      bootstrap_servers: 127.0.0.1:1\n      outbound:\n        routes:\n"
        f"          - stream: {stream}\n            topic: '{topic}'\n"
    )


CASES = {
    "data_dir_under_a_file": (
        "queue_manager:\n  data_dir: afile/qm\n" + QUIET,
        "queue_manager.data_dir",
        "is a file, not a directory",
    ),
    "store_under_a_file": (
        "broker:\n  store: afile/pubsub.db\nqueue_manager:\n  data_dir: d/qm\n" + QUIET,
        "broker.store",
        "is a file, not a directory",
    ),
    "missing_mqsc_file": (
        "queue_manager:\n  data_dir: d/qm\n  mqsc_file: nothere.mqsc\n" + QUIET,
        "queue_manager.mqsc_file",
        "does not exist",
    ),
    "duplicate_key": (
        "queue_manager:\n  data_dir: d/qm\n" + QUIET + "metrics:\n  enabled: true\n",
        "metrics",
        "written twice",
    ),
    "infinite_duration": (
        "queue_manager:\n  data_dir: d/qm\n" + QUIET + "shutdown_timeout: .inf\n",
        "shutdown_timeout",
        "not a finite number",
    ),
    "huge_duration": (
        "queue_manager:\n  data_dir: d/qm\n" + QUIET + "broker:\n  retry_delay: 1e308\n",
        "broker.retry_delay",
        "too large",
    ),
    "kafka_filter_hash_inside": (
        "queue_manager:\n  data_dir: d/qm\n"
        + QUIET
        + kafka_route("SYSTEM.BROKER.DEFAULT.STREAM", "a/#/b"),
        "plugins[0].config.outbound.routes[0].topic",
        "'#' must be the whole last level",
    ),
    "route_to_unserviced_stream": (
        "queue_manager:\n  data_dir: d/qm\n" + QUIET + kafka_route("NOT.SERVICED", "#"),
        "plugins[0].config.outbound.routes[0].stream",
        "'NOT.SERVICED' is not serviced",
    ),
    "empty_file": ("", "(top level)", "the file is empty"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_refuses_what_would_crash_the_start(tmp_path: Path, case: str) -> None:
    text, key, problem = CASES[case]
    (tmp_path / "afile").write_text("not a directory\n")
    config = tmp_path / "gateway.yaml"
    config.write_text(text)
    done = mqgw_run(config, "--check")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert f"{config}: {key}: " in done.stderr, done.stderr
    assert problem in done.stderr
    assert "configuration OK" not in done.stdout


def test_the_start_refuses_it_the_same_way(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory\n")
    config = tmp_path / "gateway.yaml"
    config.write_text("queue_manager:\n  data_dir: afile/qm\n" + QUIET)
    done = mqgw_run(config)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert f"{config}: queue_manager.data_dir: cannot be created" in done.stderr


def test_a_valid_config_with_every_check_still_passes(tmp_path: Path) -> None:
    (tmp_path / "queues.mqsc").write_text("DEFINE QLOCAL(X) REPLACE\n")
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "queue_manager:\n  data_dir: new/deep/qm\n  mqsc_file: queues.mqsc\n"
        "broker:\n  streams:\n    - name: STOCK.STREAM\n  retry_delay: 0.5\n"
        + QUIET
        + kafka_route("STOCK.STREAM", "a/+/#")
    )
    done = mqgw_run(config, "--check")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "new").exists()  # --check creates nothing


def test_example_config_checks_with_the_devstack_variables(
    kafka_broker: KafkaBroker, mqtt_broker: MosquittoBroker
) -> None:
    # What `mqgw devstack up` prints, exported as the example's header says.
    env = {
        "MQGW_KAFKA_BOOTSTRAP": kafka_broker.bootstrap,
        "MQGW_MQTT_HOST": mqtt_broker.host,
        "MQGW_MQTT_PORT": str(mqtt_broker.port),
    }
    done = mqgw_run(EXAMPLE, "--check", env=env)
    assert done.returncode == 0, done.stderr
    assert f"plugin instance kafka: kafka -> {kafka_broker.bootstrap}" in done.stdout
    assert f"plugin instance mqtt: mqtt -> {mqtt_broker.host}:{mqtt_broker.port}" in done.stdout
