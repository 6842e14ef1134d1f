"""MQTT → MQ through the real gateway pieces and the real Mosquitto: an MQTT client
publishes, MQRFH and MQRFH2 subscribers read their queues on the embedded QM."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gateway.devstack import MosquittoBroker
from gateway.plugin_api import PluginError
from plugins.mqtt import MqttConfig
from tests.plugins.mqtt.mqtt_harness import (
    DEFAULT,
    client,
    collect,
    drain_now,
    publish_rfh,
    register_mq_subscribers,
    start_gateway,
    unique,
    user_props,
    wait_for_queue,
)

pytestmark = [pytest.mark.mqtt]


def config(broker: MosquittoBroker, base: str, protocol: str = "5", **extra: object) -> MqttConfig:
    return MqttConfig.model_validate(
        {
            "host": broker.host,
            "port": broker.port,
            "protocol": protocol,
            "client_id": unique("gw-"),
            "outbound": {"topics": [], "prefix": f"{base}-out"},
            "inbound": {
                "filters": [
                    {
                        "filter": f"{base}/#",
                        "strip_prefix": f"{base}/",
                        "topic_prefix": "from-mqtt/",
                    }
                ]
            },
            **extra,
        }
    )


def props(**values: object) -> Properties:
    p = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    for name, value in values.items():
        setattr(p, name, value)
    return p


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_mqtt_publication_reaches_rfh_and_rfh2_subscribers(
    mqtt_broker: MosquittoBroker, tmp_path: Path, protocol: str
) -> None:
    base = unique("sensors")
    v5 = protocol == "5"
    gw = await start_gateway(tmp_path, config(mqtt_broker, base, protocol))
    try:
        await register_mq_subscribers(gw.qm, "from-mqtt/#")
        async with client(mqtt_broker.host, mqtt_broker.port, v5=v5) as pub:
            extra = (
                {"properties": props(UserProperty=[("Unit", "C")], MessageExpiryInterval=60)}
                if v5
                else {}
            )
            await pub.publish(f"{base}/room1/temp", b"21.5", qos=1, **extra)  # type: ignore[arg-type]
            await pub.publish(f"{base}/room2/temp", b"19.0", qos=0)
        rfh = await wait_for_queue(gw.qm, "SUB.RFH", 2)
        rfh2 = await wait_for_queue(gw.qm, "SUB.RFH2", 2)
    finally:
        await gw.close()
    rfh.sort(key=lambda r: r.topic or "")
    rfh2.sort(key=lambda r: r.topic or "")
    assert [(r.topic, r.payload) for r in rfh] == [
        ("from-mqtt/room1/temp", b"21.5"),
        ("from-mqtt/room2/temp", b"19.0"),
    ]
    assert [(r.topic, r.payload) for r in rfh2] == [
        ("from-mqtt/room1/temp", b"21.5"),
        ("from-mqtt/room2/temp", b"19.0"),
    ]
    # QoS 1 → persistent, QoS 0 → not persistent
    assert [r.md.persistence for r in rfh2] == [1, 0]
    if v5:
        assert rfh2[0].get("usr/Unit") == "C"
        assert ("Unit", "C") in rfh[0].pairs
        assert 0 < rfh2[0].md.expiry <= 600
    else:
        assert rfh2[0].md.expiry == -1


async def test_retained_and_deleted_on_mqtt_become_mq_retained_and_deletepub(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    base = unique("ret")
    gw = await start_gateway(tmp_path, config(mqtt_broker, base))
    try:
        async with client(mqtt_broker.host, mqtt_broker.port) as pub:
            await pub.publish(f"{base}/door", b"open", qos=1, retain=True)
            await asyncio.sleep(0.5)
            assert [r.topic for r in gw.service.engine.retained()] == ["from-mqtt/door"]
            await pub.publish(f"{base}/door", b"", qos=1, retain=True)
            async with asyncio.timeout(10):
                while gw.service.engine.retained():
                    await asyncio.sleep(0.05)
    finally:
        await gw.close()


async def test_no_echo_of_own_publications_with_mqtt5(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    """Outbound and inbound overlap completely; No Local and the origin keep each
    publication to one copy on each side."""
    base = unique("echo")
    cfg = MqttConfig.model_validate(
        {
            "host": mqtt_broker.host,
            "port": mqtt_broker.port,
            "client_id": unique("gw-"),
            "outbound": {"topics": ["#"], "prefix": base},
            "inbound": {"filters": [{"filter": f"{base}/#", "strip_prefix": f"{base}/"}]},
        }
    )
    gw = await start_gateway(tmp_path, cfg)
    try:
        await register_mq_subscribers(gw.qm, "loop/#")
        async with client(mqtt_broker.host, mqtt_broker.port) as sub:
            await sub.subscribe(f"{base}/#", qos=1)
            await publish_rfh(gw.qm, DEFAULT, "loop/from-mq", b"m")
            await pub_from_mqtt(mqtt_broker, f"{base}/loop/from-mqtt", b"q")
            got = await collect(sub, 2, quiet=1.0)
        rfh = await wait_for_queue(gw.qm, "SUB.RFH", 2)
        await asyncio.sleep(1.0)
        rfh += await drain_now(gw.qm, "SUB.RFH")
    finally:
        await gw.close()
    assert sorted(m.topic.value for m in got) == [f"{base}/loop/from-mq", f"{base}/loop/from-mqtt"]
    assert sorted((r.topic, r.payload) for r in rfh) == [
        ("loop/from-mq", b"m"),
        ("loop/from-mqtt", b"q"),
    ]


async def pub_from_mqtt(broker: MosquittoBroker, topic: str, payload: bytes) -> None:
    async with client(broker.host, broker.port) as pub:
        await pub.publish(topic, payload, qos=1)


async def test_mqtt311_refuses_echoing_config(mqtt_broker: MosquittoBroker, tmp_path: Path) -> None:
    cfg = MqttConfig.model_validate(
        {
            "host": mqtt_broker.host,
            "port": mqtt_broker.port,
            "protocol": "3.1.1",
            "outbound": {"topics": ["#"], "prefix": "mq"},
            "inbound": {"filters": [{"filter": "#"}]},
        }
    )
    with pytest.raises(PluginError, match=r"No Local.*allow_echo"):
        await start_gateway(tmp_path, cfg)


async def test_unpublishable_message_goes_to_dead_letter_topic(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    base = unique("dlt")
    gw = await start_gateway(
        tmp_path,
        config(mqtt_broker, base),
    )
    try:
        await register_mq_subscribers(gw.qm, "from-mqtt/#")
        async with client(mqtt_broker.host, mqtt_broker.port) as watcher:
            await watcher.subscribe("mqgw/dead-letter/#", qos=1)
            async with client(mqtt_broker.host, mqtt_broker.port) as pub:
                # %00 unescapes to NUL, which no MQ topic may hold
                await pub.publish(f"{base}/bad%00name", b"poison", qos=1)
                await pub.publish(f"{base}/good", b"fine", qos=1)
            parked = await collect(watcher, 1)
        rfh = await wait_for_queue(gw.qm, "SUB.RFH", 1)
    finally:
        await gw.close()
    assert [(m.topic.value, m.payload) for m in parked] == [
        (f"mqgw/dead-letter/{base}/bad%00name", b"poison")
    ]
    assert dict(user_props(parked[0]))["mqgw-topic"] == f"{base}/bad%00name"
    assert [(r.topic, r.payload) for r in rfh] == [("from-mqtt/good", b"fine")]


async def test_a_burst_is_put_while_the_unit_before_commits_in_order_and_once(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    """A burst of QoS 1 messages on a slow disk (each store write 20 ms longer): the
    next full batch is put while the unit before commits (``begin_publish``), and
    every message reaches the MQ subscriber once, in the order it was sent."""
    base = unique("burst")
    count, batch = 120, 8
    cfg = config(mqtt_broker, base)
    cfg.inbound.batch_size = batch
    gw = await start_gateway(tmp_path, cfg)
    write = gw.qm._store.apply

    def slow_write(*args: object, **kwargs: object) -> None:
        time.sleep(0.02)  # the writer thread's disk, not the event loop
        write(*args, **kwargs)  # type: ignore[arg-type]

    gw.qm._store.apply = slow_write  # type: ignore[method-assign]
    try:
        await register_mq_subscribers(gw.qm, "from-mqtt/#")
        async with client(
            mqtt_broker.host, mqtt_broker.port, max_inflight_messages=count
        ) as pub:
            pub.pending_calls_threshold = count + 1
            await asyncio.gather(
                *(pub.publish(f"{base}/seq", b"%04d" % i, qos=1) for i in range(count))
            )
        got = await wait_for_queue(gw.qm, "SUB.RFH2", count)
        got += await drain_now(gw.qm, "SUB.RFH2")
        publisher = gw.host.contexts["mqtt"].publisher
    finally:
        await gw.close()
    assert [r.payload for r in got] == [b"%04d" % i for i in range(count)]
    assert publisher.counters.overlapped > 0
