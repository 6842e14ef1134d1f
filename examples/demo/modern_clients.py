"""The modern clients of the demo: a Kafka consumer and an MQTT subscriber watching what
the gateway bridges out of MQ, a Kafka producer and an MQTT publisher sending into MQ.

Their client libraries (aiokafka, aiomqtt) are imported lazily: aiomqtt comes with the
``demo`` extra, not with the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from examples.demo.bars import parse_bar
from examples.demo.paths import (
    BULLETIN,
    KAFKA_IN,
    MQTT_IN,
    PATHS,
    SAMPLES,
    SENT_PAIR,
    SEQ_PAIR,
    TICKS_TOPIC,
    PathStats,
    parse_path_body,
    path_body,
)


def _sent_at(pairs: Sequence[tuple[str, str]]) -> float | None:
    for name, value in pairs:
        if name == SENT_PAIR:
            with contextlib.suppress(ValueError):
                return float(value)
    return None


async def kafka_consumer(
    bootstrap: str, stats: dict[str, PathStats], ready: asyncio.Event, stop: asyncio.Event
) -> None:
    """Count the ticks and bulletins that reach Kafka (the tick by its ``mq.nv.DemoSent``)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        TICKS_TOPIC,
        f"mqgw.{BULLETIN}",
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        group_id="mqgw-demo-viewer",
        metadata_max_age_ms=1000,
    )
    await consumer.start()
    ready.set()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for r in records:
                    headers = [(k, v.decode(errors="replace")) for k, v in r.headers]
                    tick_sent = _sent_at([(k.removeprefix("mq.nv."), v) for k, v in headers])
                    if tick_sent is not None:
                        stats[PATHS[0]].add(tick_sent)
                        h = dict(headers)
                        SAMPLES.setdefault("Kafka tick", (
                            f"topic={r.topic} key={r.key!r} value={r.value!r} "
                            f"mq.putTime={h.get('mq.putTime')} mq.pubHeader="
                            f"{h.get('mq.pubHeader')} mq.nv.{SEQ_PAIR}={h.get('mq.nv.' + SEQ_PAIR)}"
                        ))
                        continue
                    data = parse_path_body(r.value or b"")
                    if data is None or data["path"] != "rfh2":
                        continue
                    stats[PATHS[1]].add(float(data["sent"]))
                    SAMPLES.setdefault("Kafka bulletin", f"topic={r.topic} key={r.key!r} "
                                       "headers=" + ", ".join(
                                           f"{k}={v}" for k, v in headers
                                           if k in ("mq.stream", "mq.topic", "mq.pubHeader",
                                                    "usr.Desk")))
    finally:
        await consumer.stop()


async def kafka_producer(bootstrap: str, count: int, stats: dict[str, PathStats]) -> None:
    """Send ``count`` records to the gateway's Kafka inbound topic."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for seq in range(count):
            await producer.send_and_wait(KAFKA_IN, path_body("kafka", seq), key=b"FromKafka/Quote")
            stats["Kafka -> MQRFH subscriber"].sent += 1
            stats["Kafka -> MQRFH2 subscriber"].sent += 1
    finally:
        await producer.stop()


async def mqtt_subscriber(
    host: str, port: int, stats: dict[str, PathStats], ready: asyncio.Event, stop: asyncio.Event
) -> None:
    """Count the ticks and bulletins that reach MQTT (MQTT v5 user properties).

    One read runs until ``stop``: a read cancelled by a timeout can drop the message it
    already took off aiomqtt's queue, which under load lost one now and then.
    """
    import aiomqtt

    def count(msg: aiomqtt.Message) -> None:
        payload = msg.payload if isinstance(msg.payload, bytes) else str(msg.payload).encode()
        props = getattr(msg.properties, "UserProperty", None) if msg.properties else None
        pairs = [(str(k), str(v)) for k, v in props] if props else []
        tick_sent = _sent_at(pairs)
        if tick_sent is not None:
            stats[PATHS[2]].add(tick_sent)
            return
        if parse_bar(payload) is not None:
            SAMPLES.setdefault("MQTT bar", f"topic={msg.topic} payload={payload.decode()}")
            return
        data = parse_path_body(payload)
        if data is None or data["path"] != "rfh2":
            return
        SAMPLES.setdefault("MQTT bulletin", f"topic={msg.topic} qos={msg.qos} "
                           f"user_properties={props}")
        stats[PATHS[3]].add(float(data["sent"]))

    async with aiomqtt.Client(
        host, port, identifier="mqgw-demo-viewer", protocol=aiomqtt.ProtocolVersion.V5
    ) as client:

        async def read() -> None:
            async for msg in client.messages:
                count(msg)

        await client.subscribe("mq/#", qos=1)
        reader = asyncio.create_task(read())
        ready.set()
        try:
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait((reader, stopped), return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def mqtt_publisher(host: str, port: int, count: int, stats: dict[str, PathStats]) -> None:
    """Publish ``count`` messages under the gateway's MQTT inbound filter."""
    import aiomqtt

    async with aiomqtt.Client(host, port, identifier="mqgw-demo-sender") as client:
        for seq in range(count):
            await client.publish(f"{MQTT_IN}/FromMqtt/Quote", path_body("mqtt", seq), qos=1)
            stats["MQTT -> MQRFH subscriber"].sent += 1
            stats["MQTT -> MQRFH2 subscriber"].sent += 1
