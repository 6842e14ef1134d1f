"""A Kafka request/reply route consumes again at once after the gateway was SIGKILLed.

Each route's consumer group is the gateway's own (``mqgw.<id>.rr.<route>``). As a
dynamic member, the restarted consumer could not be given the partitions before the
coordinator evicted the dead one: its session (aiokafka's ``session_timeout_ms``,
10 s) runs from its last heartbeat (every 3 s), so at the earliest 7 s after the kill.
A static member (``group.instance.id``, KIP-345) takes the dead one's place at once.
The request waits on the topic (sent with Kafka's console producer while the gateway
is down) and the test reads ``requests_sent`` from ``/healthz``.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gateway.devstack import KafkaBroker
from gateway.devstack.ports import free_port
from tests.support.gateway_process import GatewayProcess, write_config
from tests.support.kafka_console import console_produce
from tests.support.names import unique

pytestmark = [pytest.mark.kafka, pytest.mark.subprocess]

QM = "RESTARTQM"
STARTED = f"gateway mqgw-{QM} started"
START_S = 60.0
#: aiokafka's defaults: a dead dynamic member holds its partitions this long at least
SESSION_TIMEOUT_S = 10.0
HEARTBEAT_S = 3.0


def _requests_sent(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            body: dict[str, Any] = json.loads(r.read())
    except OSError:
        return 0
    return int((body.get("request_reply") or {}).get("requests_sent", 0))


def _wait(gw: GatewayProcess, what: str, check: Any, timeout: float) -> float:
    """Poll ``check`` until true; the monotonic time it became true."""
    deadline = time.monotonic() + timeout
    while not check():
        assert gw.running, gw.log_tail()
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s\n{gw.log_tail()}"
        time.sleep(0.05)
    return time.monotonic()


def test_a_request_route_consumes_at_once_after_a_sigkill(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic = unique("rr-restart")
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
        killed = time.monotonic()
        console_produce(kafka_broker.bootstrap, topic, request)  # waits on the topic
        gw.start()
        started = _wait(gw, "the restart", lambda: gw.has_logged(STARTED), START_S)
        consumed = _wait(gw, "the request after the restart",
                         lambda: _requests_sent(port) >= 1, START_S)
    finally:
        if gw.running:
            gw.terminate(timeout=30)
    restart_s, after_kill_s = started - killed, consumed - killed
    # A dynamic member gets the partition SESSION - HEARTBEAT s after the kill at the
    # earliest; the restart itself must leave room to tell the two apart.
    earliest_dynamic = SESSION_TIMEOUT_S - HEARTBEAT_S
    assert restart_s < earliest_dynamic - 1.0, f"the restart alone took {restart_s:.1f} s"
    assert after_kill_s < earliest_dynamic, (
        f"consumed {after_kill_s:.1f} s after the kill ({consumed - started:.1f} s after "
        f"the restart's start): waited out the dead member's session")
