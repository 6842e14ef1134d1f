"""MQ → MQTT through the real gateway pieces and the real Mosquitto.

Legacy publishers put real MQRFH/MQRFH2 commands on an embedded queue manager, the
broker service hands the sink deliveries to the mqtt instance, and a plain aiomqtt
client checks what MQTT subscribers receive.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.devstack import MosquittoBroker
from plugins.mqtt import MqttConfig
from tests.plugins.mqtt.mqtt_harness import (
    BULLETIN,
    STOCK,
    client,
    collect,
    delete_rfh,
    publish_rfh,
    publish_rfh2,
    start_gateway,
    unique,
    user_props,
)

pytestmark = [pytest.mark.mqtt]


def config(broker: MosquittoBroker, prefix: str, protocol: str = "5", **out: object) -> MqttConfig:
    return MqttConfig.model_validate(
        {
            "host": broker.host,
            "port": broker.port,
            "protocol": protocol,
            "client_id": unique("gw-"),
            "outbound": {
                "prefix": prefix,
                "topics": ["#", f"$SYS/STREAM/{STOCK}/#", f"$SYS/STREAM/{BULLETIN}/#"],
                **out,
            },
        }
    )


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_rfh_and_rfh2_publishers_reach_mqtt(
    mqtt_broker: MosquittoBroker, tmp_path: Path, protocol: str
) -> None:
    prefix = unique("out")
    v5 = protocol == "5"
    gw = await start_gateway(tmp_path, config(mqtt_broker, prefix, protocol))
    try:
        async with client(mqtt_broker.host, mqtt_broker.port, v5=v5) as sub:
            await sub.subscribe(f"{prefix}/#", qos=2)
            await publish_rfh(gw.qm, STOCK, "IBM/Latest", b"IBM 123.45", pairs=[("Desk", "7")])
            await publish_rfh2(
                gw.qm,
                f"$SYS/STREAM/{BULLETIN}/news/today",
                b"hello",
                usr={"Colour": "red"},
                expiry=600,
            )
            await publish_rfh(
                gw.qm, "SYSTEM.BROKER.DEFAULT.STREAM", "plain/t", b"np", persistence=0
            )
            got = await collect(sub, 3)
    finally:
        await gw.close()
    by_topic = {m.topic.value: m for m in got}
    assert sorted(by_topic) == sorted(
        [
            f"{prefix}/{STOCK}/IBM/Latest",
            f"{prefix}/{BULLETIN}/news/today",
            f"{prefix}/plain/t",
        ]
    ), "a $SYS/STREAM/... topic must never be published as such"
    assert len(got) == 3
    stock = by_topic[f"{prefix}/{STOCK}/IBM/Latest"]
    news = by_topic[f"{prefix}/{BULLETIN}/news/today"]
    plain = by_topic[f"{prefix}/plain/t"]
    assert (stock.payload, news.payload, plain.payload) == (b"IBM 123.45", b"hello", b"np")
    # persistent → QoS 1, non-persistent → QoS 0 (defaults)
    assert (stock.qos, news.qos, plain.qos) == (1, 1, 0)
    if v5:
        assert user_props(stock) == [("Desk", "7")]
        assert user_props(news) == [("Colour", "red")]
        expiry = getattr(news.properties, "MessageExpiryInterval", None)
        assert expiry is not None and 0 < expiry <= 60
        assert getattr(stock.properties, "MessageExpiryInterval", None) is None
        assert getattr(stock.properties, "PayloadFormatIndicator", None) == 1


async def test_retained_publication_and_deletion(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    prefix = unique("ret")
    topic = f"{prefix}/{STOCK}/IBM/Latest"
    gw = await start_gateway(tmp_path, config(mqtt_broker, prefix))
    try:
        async with client(mqtt_broker.host, mqtt_broker.port) as live:
            await live.subscribe(f"{prefix}/#", qos=1)
            await publish_rfh(gw.qm, STOCK, "IBM/Latest", b"v1", retain=True)
            first = await collect(live, 1)
            assert [m.payload for m in first] == [b"v1"]
        # a late subscriber gets it from the broker's retained store
        async with client(mqtt_broker.host, mqtt_broker.port) as late:
            await late.subscribe(topic, qos=1)
            kept = await collect(late, 1)
            assert [(m.payload, m.retain) for m in kept] == [(b"v1", True)]
            await delete_rfh(gw.qm, STOCK, "IBM/Latest")
            deletion = await collect(late, 1)
            assert [m.payload for m in deletion] == [b""]
        async with client(mqtt_broker.host, mqtt_broker.port) as after:
            await after.subscribe(topic, qos=1)
            with pytest.raises(TimeoutError):
                await collect(after, 1, timeout=1.0)
    finally:
        await gw.close()


async def test_order_per_topic_is_kept(mqtt_broker: MosquittoBroker, tmp_path: Path) -> None:
    prefix = unique("ord")
    n = 300
    gw = await start_gateway(tmp_path, config(mqtt_broker, prefix))
    try:
        async with client(mqtt_broker.host, mqtt_broker.port) as sub:
            await sub.subscribe(f"{prefix}/#", qos=1)
            for i in range(n):
                await publish_rfh(gw.qm, STOCK, f"t{i % 3}", f"{i}".encode())
            got = await collect(sub, n, timeout=60)
    finally:
        await gw.close()
    assert len(got) == n
    for t in range(3):
        seen = [int(m.payload) for m in got if m.topic.value.endswith(f"/t{t}")]
        assert seen == [i for i in range(n) if i % 3 == t]


async def test_forbidden_characters_are_escaped_not_lost(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    prefix = unique("esc")
    gw = await start_gateway(tmp_path, config(mqtt_broker, prefix))
    try:
        async with client(mqtt_broker.host, mqtt_broker.port) as sub:
            await sub.subscribe(f"{prefix}/#", qos=1)
            await publish_rfh2(gw.qm, "odd/a+b/c#d/50%", b"x")
            got = await collect(sub, 1)
    finally:
        await gw.close()
    assert [m.topic.value for m in got] == [f"{prefix}/odd/a%2Bb/c%23d/50%25"]


async def test_ebcdic_text_is_converted_to_utf8(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    """An MQSTR payload in CCSID 500 (EBCDIC) arrives as UTF-8, flagged as such."""
    from gateway.wire.folder import Element
    from gateway.wire.formats import FMT_RF_HEADER_2, FMT_STRING
    from gateway.wire.mqmd import MQMD
    from gateway.wire.rfh2 import MQRFH2, encode_rfh2
    from tests.plugins.mqtt.mqtt_harness import put_raw

    prefix = unique("ccsid")
    text = "Grüße, ¥ & €-less"
    rfh2 = MQRFH2(
        folders=[Element.from_pairs("psc", {"Command": "Publish", "Topic": "txt"})],
        format=FMT_STRING,
        coded_char_set_id=500,
    )
    body = encode_rfh2(rfh2, ccsid=1208) + text.replace("€", "").encode("cp500")
    md = MQMD(format=FMT_RF_HEADER_2, coded_char_set_id=1208, persistence=1)
    gw = await start_gateway(tmp_path, config(mqtt_broker, prefix))
    try:
        async with client(mqtt_broker.host, mqtt_broker.port) as sub:
            await sub.subscribe(f"{prefix}/#", qos=1)
            await put_raw(gw.qm, "SYSTEM.BROKER.DEFAULT.STREAM", md, body)
            got = await collect(sub, 1)
    finally:
        await gw.close()
    assert [m.payload for m in got] == [text.replace("€", "").encode("utf-8")]
    assert getattr(got[0].properties, "PayloadFormatIndicator", None) == 1
