"""Inbound poison never blocks an MQTT source (issue 12 item 4), driven from outside with
Debian's ``mosquitto_pub``/``mosquitto_sub`` against the real Mosquitto.

A message MQ can never take (5 MB: over the queue manager's 4 MB MAXMSGL, MQRC 2031)
goes to ``mqgw/dead-letter/<topic>`` with its reason and is acknowledged, so later
messages flow and a restart does not hand it back. A full stream queue (MQRC 2053) is
back-pressure: nothing is dead-lettered, everything arrives once the queue drains.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from gateway.devstack import MosquittoBroker
from gateway.runtime.metrics import GatewayMetrics
from plugins.mqtt import MqttConfig
from plugins.mqtt.instance import MqttInstance
from tests.plugins.mqtt.mqtt_harness import (
    DEFAULT,
    drain_now,
    register_mq_subscribers,
    start_gateway,
    unique,
    wait_for_queue,
)
from tests.support.gateway import BRIDGE_QUEUES

pytestmark = [
    pytest.mark.mqtt,
    pytest.mark.mosquitto_clients,
]

DEAD_LETTER = "mqgw/dead-letter"


def config(broker: MosquittoBroker, base: str, client_id: str) -> MqttConfig:
    inbound = {"filter": f"{base}/#", "strip_prefix": f"{base}/", "topic_prefix": "from-mqtt/"}
    return MqttConfig.model_validate(
        {
            "host": broker.host,
            "port": broker.port,
            "protocol": "5",
            "client_id": client_id,
            "outbound": {"topics": [], "prefix": f"{base}-out"},
            "inbound": {"filters": [inbound]},
        }
    )


def mosquitto_pub(broker: MosquittoBroker, topic: str, *args: str) -> None:
    subprocess.run(
        ["mosquitto_pub", "-h", broker.host, "-p", str(broker.port), "-V", "5", "-q", "1",
         "-t", topic, *args],
        check=True,
        timeout=30,
    )


async def start_sub(broker: MosquittoBroker, topic: str, count: int) -> asyncio.subprocess.Process:
    """``mosquitto_sub`` printing topic, length and user properties of ``count`` messages
    (then it exits); returns once it is subscribed (a QoS 1 probe came back)."""
    probe = unique("probe/")
    proc = await asyncio.create_subprocess_exec(
        "mosquitto_sub", "-h", broker.host, "-p", str(broker.port), "-V", "5", "-q", "1",
        "-t", topic, "-t", probe, "-F", "%t|%l|%P", "-C", str(count + 1),
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    async with asyncio.timeout(15):
        while True:
            mosquitto_pub(broker, probe, "-m", "probe")
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), 0.5)
            except TimeoutError:
                continue
            assert line.startswith(f"{probe}|".encode()), line
            return proc


async def read_lines(proc: asyncio.subprocess.Process, timeout: float) -> list[str]:
    assert proc.stdout is not None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
    return [line for line in out.decode().splitlines() if line]


def inbound_stats(instance: object) -> dict[str, int]:
    assert isinstance(instance, MqttInstance)
    return {k: v for k, v in instance.stats().items() if k.startswith("inbound_")}


async def test_too_big_message_goes_to_dead_letter_topic_and_later_ones_flow(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    base = unique("poison")
    client_id = unique("gw-")
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (5 * 1024 * 1024))
    watcher = await start_sub(mqtt_broker, f"{DEAD_LETTER}/{base}/#", 1)
    gw = await start_gateway(tmp_path / "gw", config(mqtt_broker, base, client_id))
    try:
        await register_mq_subscribers(gw.qm, "from-mqtt/#")
        mosquitto_pub(mqtt_broker, f"{base}/big", "-f", str(big))
        mosquitto_pub(mqtt_broker, f"{base}/small", "-m", "hello")
        got = await wait_for_queue(gw.qm, "SUB.RFH2", 1, timeout=20)
        assert [(r.topic, r.payload) for r in got] == [("from-mqtt/small", b"hello")]
        lines = await read_lines(watcher, 20)
        stats = inbound_stats(gw.instance)
        exposition = GatewayMetrics(gw.service, gw.host, lambda: {}).exposition().decode()
    finally:
        await gw.close()
    assert len(lines) == 1, lines
    topic, length, props = lines[0].split("|", 2)
    assert topic == f"{DEAD_LETTER}/{base}/big"
    assert int(length) == 5 * 1024 * 1024
    assert "mqgw-reason:2031" in props and f"mqgw-topic:{base}/big" in props, props
    assert stats["inbound_dead_lettered"] == 1
    assert stats["inbound_published"] == 1
    assert (
        'mqgw_inbound_refused_total{plugin="mqtt",reason="MQRC_MSG_TOO_BIG_FOR_Q_MGR"} 1.0'
        in exposition
    ), exposition

    # A restart (same client id, persistent session): the big one is not handed back.
    watcher = await start_sub(mqtt_broker, f"{DEAD_LETTER}/{base}/#", 1)
    gw = await start_gateway(tmp_path / "gw", config(mqtt_broker, base, client_id))
    try:
        mosquitto_pub(mqtt_broker, f"{base}/after", "-m", "again")
        got = await wait_for_queue(gw.qm, "SUB.RFH2", 1, timeout=20)
        assert [(r.topic, r.payload) for r in got] == [("from-mqtt/after", b"again")]
        await asyncio.sleep(1.0)
        stats = inbound_stats(gw.instance)
    finally:
        await gw.close()
    assert await read_lines(watcher, 1.0) == []
    assert stats["inbound_received"] == 1
    assert stats["inbound_dead_lettered"] == 0


async def test_full_stream_queue_is_back_pressure_not_poison(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    """The stream queue is full and nobody drains it (the service does not run while it
    is full in this test): the source pauses, dead-letters nothing, and once the queue
    drains every message arrives, in order."""
    base = unique("full")
    watcher = await start_sub(mqtt_broker, f"{DEAD_LETTER}/{base}/#", 1)
    mqsc = BRIDGE_QUEUES + f"ALTER QLOCAL('{DEFAULT}') MAXDEPTH(3)\n"
    gw = await start_gateway(tmp_path / "gw", config(mqtt_broker, base, unique("gw-")), mqsc=mqsc)
    try:
        await register_mq_subscribers(gw.qm, "from-mqtt/#")
        await gw.service.stop()  # nobody drains the stream queue now
        for i in range(8):
            mosquitto_pub(mqtt_broker, f"{base}/m{i}", "-m", f"v{i}")
        async with asyncio.timeout(20):
            while inbound_stats(gw.instance)["inbound_publish_failures"] < 2:
                await asyncio.sleep(0.1)
        stats = inbound_stats(gw.instance)
        assert stats["inbound_dead_lettered"] == 0
        assert stats["inbound_published"] < 8
        await gw.service.start()  # the queue drains
        got = await wait_for_queue(gw.qm, "SUB.RFH2", 8, timeout=30)
        stats = inbound_stats(gw.instance)
        leftover = await drain_now(gw.qm, "SUB.RFH2")
    finally:
        await gw.close()
    assert [r.payload for r in got] == [f"v{i}".encode() for i in range(8)]
    assert leftover == []
    assert stats["inbound_dead_lettered"] == 0
    assert await read_lines(watcher, 1.0) == []
