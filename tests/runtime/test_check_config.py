"""Issue 12 item 7: ``mqgw run --check`` refuses what would crash the start, naming the
key and the file, without a traceback (run as a subprocess, as an operator would)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
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
    "data_dir_under_proc": (
        "queue_manager:\n  data_dir: /proc/mqgw-no-such/qm\n" + QUIET,
        "queue_manager.data_dir",
        "cannot be created",
    ),
    "request_reply_store_under_a_file": (
        "queue_manager:\n  data_dir: d/qm\n" + QUIET
        + "plugins:\n  - {name: m, plugin: memory}\n"
        "request_reply:\n  store: afile/rr.db\n"
        "  requests: [{name: q, plugin: m, source: a, destination: SVC.Q}]\n",
        "request_reply.store",
        "is a file, not a directory",
    ),
}


def rr_routes(*, reply_queue: str = "MQGW.REPLY", service_queue: str = "GW.SVC",
              destination: str = "SVC.Q", reply_to_q: str = "",
              extra: str = "") -> str:
    """A configuration with one requester and one service route on a memory instance,
    and a serviced stream STOCK.STREAM."""
    return (
        "queue_manager:\n  name: GW\n  data_dir: d/qm\n" + QUIET
        + "broker:\n  streams: [{name: STOCK.STREAM}]\n" + extra
        + "plugins:\n  - {name: m, plugin: memory}\n"
        f"request_reply:\n  reply_queue: {reply_queue}\n"
        + (f"  reply_to_q: {reply_to_q}\n" if reply_to_q else "")
        + f"  requests: [{{name: q, plugin: m, source: a, destination: '{destination}'}}]\n"
        f"  services: [{{name: s, queue: {service_queue}, plugin: m, target: t, replies: r}}]\n"
    )


#: The key each ``rr_routes`` keyword is checked under.
RR_KEYS = {"reply_queue": "request_reply.reply_queue",
           "service_queue": "request_reply.services[0].queue",
           "destination": "request_reply.requests[0].destination",
           "reply_to_q": "request_reply.reply_to_q"}
STREAM_QUEUE = "a stream queue the broker services"
#: Issue 29: request/reply queues that overlap the broker's own, each refused naming
#: the key (a reply_queue on a stream queue took 25 of 50 publications): case ->
#: (``rr_routes`` keyword, its value, the problem named, ``broker:`` keys added).
QUEUE_OVERLAPS: dict[str, tuple[str, str, str, str]] = {
    "reply_queue_on_a_stream_queue": ("reply_queue", "STOCK.STREAM", STREAM_QUEUE, ""),
    "service_queue_on_a_stream_queue": ("service_queue", "STOCK.STREAM", STREAM_QUEUE, ""),
    "service_queue_on_the_default_stream": (
        "service_queue", "SYSTEM.BROKER.DEFAULT.STREAM", STREAM_QUEUE, ""),
    "reply_queue_on_the_admin_stream": (
        "reply_queue", "SYSTEM.BROKER.ADMIN.STREAM", "the broker's admin stream", ""),
    "reply_queue_on_the_control_queue": (
        "reply_queue", "SYSTEM.BROKER.CONTROL.QUEUE", "the broker's control queue", ""),
    "service_queue_on_the_inter_broker_queue": (
        "service_queue", "SYSTEM.BROKER.INTER.BROKER.COMMUNICATIONS", "the inter-broker queue",
        ""),
    "service_queue_on_the_dead_letter_queue": (
        "service_queue", "GW.DLQ", "the dead-letter queue", "  dead_letter_queue: GW.DLQ\n"),
    "reply_queue_on_a_sink_backlog": (
        "reply_queue", "SYSTEM.MQGW.SINK.m", "a sink backlog queue", ""),
    "service_queue_on_a_system_queue": (
        "service_queue", "SYSTEM.ADMIN.COMMAND.QUEUE", "a system queue", ""),
    "service_queue_is_the_reply_queue": (
        "service_queue", "MQGW.REPLY", "also request_reply.reply_queue", ""),
    "destination_on_the_control_queue_of_another_broker": (
        "destination", "SYSTEM.BROKER.CONTROL.QUEUE@QM2", "the broker's control queue", ""),
    "destination_on_a_stream_queue": ("destination", "STOCK.STREAM", STREAM_QUEUE, ""),
    "reply_to_q_on_a_stream_queue": ("reply_to_q", "STOCK.STREAM", STREAM_QUEUE, ""),
    # the runtime keeps the queues request/reply reads and refuses every put there (2035)
    "destination_is_the_reply_queue": (
        "destination", "MQGW.REPLY",
        "MQGW.REPLY is request_reply.reply_queue, a queue request/reply reads", ""),
    "destination_is_the_reply_queue_on_the_own_queue_manager": (
        "destination", "MQGW.REPLY@GW", "is request_reply.reply_queue, a queue request/reply "
        "reads", ""),
    "destination_is_a_service_queue": (
        "destination", "GW.SVC",
        "GW.SVC is request_reply.services[0].queue, a queue request/reply reads", ""),
}
QUEUE_CASES = {
    case: (rr_routes(**{keyword: value}, extra=broker), RR_KEYS[keyword], problem)
    for case, (keyword, value, problem, broker) in QUEUE_OVERLAPS.items()
}
QUEUE_CASES["reply_queue_on_a_neighbours_stream"] = (
    rr_routes(reply_queue="BULLETIN") + "neighbours: [{q_mgr: QM2, streams: [BULLETIN]}]\n",
    "request_reply.reply_queue", STREAM_QUEUE)
CASES.update(QUEUE_CASES)


def kafka_requester(template: str, *, route_on: str = "k") -> str:
    """Kafka instance k with outbound ``topic_template``, a second instance k2, and a
    requester route on ``route_on``."""
    plugin = "    plugin: kafka\n    config:\n      bootstrap_servers: 127.0.0.1:1\n"
    return (
        "queue_manager:\n  data_dir: d/qm\n" + QUIET
        + "plugins:\n  - name: k\n" + plugin
        + f"      outbound: {{topic_template: '{template}'}}\n"
        + "  - name: k2\n" + plugin
        + "request_reply:\n"
        f"  requests: [{{name: q, plugin: {route_on}, source: quotes, destination: SVC.Q}}]\n"
    )


#: A requester route whose reply topic could never be accepted: an instance of its
#: plugin writes every topic name (the runtime asks all instances of the plugin).
CASES.update({
    "requester_on_a_kafka_instance_writing_every_topic": (
        kafka_requester("{topic}"), "request_reply.requests[0].plugin",
        "no reply topic can ever be accepted: every Kafka topic name is a topic of the "
        "outbound publications"),
    "requester_beside_a_kafka_instance_writing_every_topic": (
        kafka_requester("{topic}", route_on="k2"), "request_reply.requests[0].plugin",
        "of kafka instance 'k'"),
})


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


def test_the_start_refuses_a_data_dir_under_proc_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("queue_manager:\n  data_dir: /proc/mqgw-no-such/qm\n" + QUIET)
    done = mqgw_run(config)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert f"{config}: queue_manager.data_dir: cannot be created" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 2, done.stderr  # the heading + it


@contextlib.contextmanager
def unwritable(directory: Path) -> Iterator[None]:
    """``directory`` made read-only for this user: mode 0555, or for root (whom modes do
    not stop) the immutable attribute, removed again at the end."""
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run(
        [chattr, "+i", str(directory)], capture_output=True, check=False
    ).returncode != 0:
        pytest.fail("root, and no immutable attribute (chattr +i) on this file system: "
                    "nothing can make a directory read-only for this user")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(directory)], check=True)


@pytest.mark.parametrize("key", ["queue_manager.data_dir", "broker.store",
                                 "request_reply.store"])
def test_check_and_start_refuse_a_read_only_directory(tmp_path: Path, key: str) -> None:
    paths = {"queue_manager.data_dir": "d/qm", "broker.store": "d/pubsub.db",
             "request_reply.store": "d/rr.db"}
    paths[key] = "ro/new/x.db" if key.endswith("store") else "ro/new/qm"
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"queue_manager:\n  data_dir: {paths['queue_manager.data_dir']}\n" + QUIET
        + f"broker:\n  store: {paths['broker.store']}\n"
        "plugins:\n  - {name: m, plugin: memory}\n"
        f"request_reply:\n  store: {paths['request_reply.store']}\n"
        "  requests: [{name: q, plugin: m, source: a, destination: SVC.Q}]\n"
    )
    with unwritable(tmp_path / "ro"):
        for extra in (("--check",), ()):
            done = mqgw_run(config, *extra)
            assert done.returncode == 2, done.stdout + done.stderr
            assert "Traceback" not in done.stderr
            assert f"{config}: {key}: cannot be created: {tmp_path / 'ro'} is not " \
                "writable" in done.stderr, done.stderr
        assert list((tmp_path / "ro").iterdir()) == []


@pytest.mark.parametrize("template", ["mqgw.{stream}", "{stream}.{topic}", "x{topic}"])
def test_a_requester_beside_kafka_templates_with_room_for_replies_passes(
    tmp_path: Path, template: str
) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(kafka_requester(template))
    done = mqgw_run(config, "--check")
    assert done.returncode == 0, done.stderr


def test_a_destination_of_that_name_on_another_queue_manager_passes(tmp_path: Path) -> None:
    """Only the gateway's own queue manager's reply and service queues are kept."""
    config = tmp_path / "gateway.yaml"
    config.write_text(rr_routes(destination="MQGW.REPLY@QM2"))
    done = mqgw_run(config, "--check")
    assert done.returncode == 0, done.stderr


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


@pytest.mark.parametrize("key", ["queue_manager.data_dir", "broker.store",
                                 "request_reply.store"])
async def test_a_directory_that_fails_after_the_check_stops_the_start_naming_the_key(
    tmp_path: Path, key: str
) -> None:
    """The start checks too, but a directory can change between check and start (or a
    caller builds the app without load_config): the start still fails with one
    GatewayRuntimeError naming the key, never an OSError traceback."""
    from gateway.runtime.app import GatewayApp
    from gateway.runtime.config import parse_config
    from gateway.runtime.errors import GatewayRuntimeError
    from gateway.runtime.registry import PluginRegistry

    bad = "/proc/mqgw-no-such/x"
    data = {
        "queue_manager": {"data_dir": str(tmp_path / "qm")},
        "broker": {"store": str(tmp_path / "pubsub.db")},
        "metrics": {"enabled": False},
        "plugins": [{"name": "m", "plugin": "memory"}],
        "request_reply": {
            "store": str(tmp_path / "rr.db"),
            "requests": [{"name": "q", "plugin": "m", "source": "a", "destination": "SVC.Q"}],
        },
    }
    section, name = key.split(".")
    data[section][name] = bad  # type: ignore[index]
    registry = PluginRegistry.from_entry_points()
    app = GatewayApp(parse_config(data, registry, base_dir=tmp_path), registry)
    with pytest.raises(GatewayRuntimeError) as failed:
        await app.start()
    assert str(failed.value).startswith(f"{key} {bad}: "), failed.value
