"""A Kafka request/reply route's consumer is a static group member, so a gateway
restarted after a SIGKILL takes its partitions back at once.

Each route's consumer group is the gateway's own (``<gateway id>.rr.<route>``). As a
dynamic member, the restarted consumer could not be given the partitions before the
coordinator evicted the dead one: its session (aiokafka's ``session_timeout_ms``, 10 s)
runs from its last heartbeat, so 7-10 s after the kill (measured: 9.9 s). A static member
(``group.instance.id``, KIP-345) takes the dead one's place as soon as it joins (0.15-0.3
s after the restart's start, measured by hand; docs/request-reply.md).

What is asserted does not depend on how fast the machine restarts the gateway: Kafka's
own ``kafka-consumer-groups`` tool shows the group's one member, with the group's name as
its instance id, after the kill and restart; and a request sent while the gateway was
down reaches MQ after the restart.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gateway.devstack import KafkaBroker, console_tool_command
from gateway.devstack.ports import free_port
from tests.support.gateway_process import GatewayProcess, write_config
from tests.support.kafka_console import console_produce
from tests.support.names import unique

pytestmark = [pytest.mark.kafka, pytest.mark.subprocess]

QM = "RESTARTQM"
GATEWAY_ID = f"mqgw-{QM}"
STARTED = f"gateway {GATEWAY_ID} started"
START_S = 60.0


def _requests_sent(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            body: dict[str, Any] = json.loads(r.read())
    except OSError:
        return 0
    return int((body.get("request_reply") or {}).get("requests_sent", 0))


def _wait(gw: GatewayProcess, what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert gw.running, gw.log_tail()
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s\n{gw.log_tail()}"
        time.sleep(0.05)


def _members(bootstrap: str, group: str) -> list[list[str]]:
    """``kafka-consumer-groups --describe --members``: one row of columns per member."""
    done = subprocess.run(
        console_tool_command("kafka-consumer-groups", "--bootstrap-server", bootstrap,
                             "--describe", "--members", "--group", group),
        capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.strip()]
    header = next(i for i, r in enumerate(rows) if r[:2] == ["GROUP", "CONSUMER-ID"])
    return rows[header + 1:]


def test_a_request_route_is_a_static_member_that_a_restart_replaces(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic = unique("rr-restart")
    group = f"{GATEWAY_ID}.rr.quote"
    port = free_port()
    (tmp_path / "queues.mqsc").write_text("DEFINE QLOCAL(SVC.QUOTE) REPLACE\n")
    config = {
        "queue_manager": {"name": QM, "data_dir": "qm", "mqsc_file": "queues.mqsc"},
        "broker": {"store": "pubsub.db"},
        "metrics": {"host": "127.0.0.1", "port": port, "dashboard": False},
        "plugins": [{"name": "kafka1", "plugin": "kafka",
                     "config": {"bootstrap_servers": kafka_broker.bootstrap}}],
        "request_reply": {"store": "rr.db", "requests": [
            {"name": "quote", "plugin": "kafka1", "source": topic,
             "destination": "SVC.QUOTE", "timeout": 300}]},
    }
    gw = GatewayProcess(write_config(tmp_path / "gateway.yaml", config), tmp_path / "gw.log")
    request = [({"mq.reply.topic": f"{topic}.answers"}, "quote please")]
    gw.start()
    try:
        _wait(gw, "first start", lambda: gw.has_logged(STARTED), START_S)
        console_produce(kafka_broker.bootstrap, topic, request)
        _wait(gw, "the first request", lambda: _requests_sent(port) >= 1, START_S)

        gw.kill()
        console_produce(kafka_broker.bootstrap, topic, request)  # waits on the topic
        gw.start()
        _wait(gw, "the restart", lambda: gw.has_logged(STARTED), START_S)
        _wait(gw, "the request after the restart", lambda: _requests_sent(port) >= 1, START_S)
        members = _members(kafka_broker.bootstrap, group)
    finally:
        if gw.running:
            gw.terminate(timeout=30)
    # GROUP CONSUMER-ID GROUP-INSTANCE-ID HOST CLIENT-ID #PARTITIONS: one member, the
    # restarted one, under the group's name (a dynamic member shows "-" there)
    assert len(members) == 1, members
    assert members[0][2] == group, members
