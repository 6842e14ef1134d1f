"""Kafka -> MQ and MQTT -> MQ: the gateway's inbound path next to a raw consumer + raw puts.

One local Kafka broker and one Mosquitto (devstack), one embedded queue manager per run.
N 1 KiB messages are waiting in the external broker before each run starts (Kafka: a
one-partition topic, keys ``T0``..``T15``; MQTT: a persistent session's queue, 16
topics, QoS 1), so only the consuming side is timed:

* **gateway**: the ``kafka`` plugin (``inbound.topics``, ``max_batch`` records per MQ
  unit of work, offsets committed after the MQ commit) or the ``mqtt`` plugin
  (``inbound.filters``, ``batch_size`` per unit of work, PUBACK after the MQ commit), on
  a plugin host, putting MQRFH2 Publish commands to the stream queue;
* **raw**: an aiokafka consumer (``getmany`` of the same batch size, offsets committed
  after the MQ commit) or an aiomqtt subscriber (batches of what has arrived, same size
  and Receive Maximum; aiomqtt acknowledges on receipt, which favours the baseline),
  each record turned into the same MQRFH2 Publish command (psc folder with the topic,
  1 KiB body) and put under syncpoint to the same stream queue, one commit per batch.

Both are timed from the first publication on the queue to the N-th (consumer group
joins and connects are not the path; the broker service is not running, so the queue
keeps what arrived and its depth is the count: no loss, no duplicate). Goal (issue 16):
gateway >= 0.7x raw. Bounded: --messages (default 10,000), --time-limit per run.
Run: .venv/bin/python -m benchmarks.bench_inbound [--messages N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiomqtt
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from benchmarks.summary import Row, record
from gateway.devstack import KafkaBroker, MosquittoBroker
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import OpenOption, PutOptions
from gateway.plugin_api import PluginInstance
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.store import MemoryStore
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from gateway.wire.constants import Persistence
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER_2, FMT_STRING
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh2 import MQRFH2, encode_rfh2
from plugins.kafka import KafkaPluginConfig
from plugins.kafka import plugin as kafka_plugin
from plugins.mqtt import MqttConfig
from plugins.mqtt import plugin as mqtt_plugin

STREAM = "BENCH.STREAM"
DEFAULT_STREAM = "SYSTEM.BROKER.DEFAULT.STREAM"
PAYLOAD = b"x" * 1024
TOPICS = 16
KAFKA_BATCH = KafkaPluginConfig().inbound.max_batch
MQTT_BATCH = MqttConfig().inbound.batch_size
RECEIVE_MAXIMUM = MqttConfig().inbound.receive_maximum


def publish_command(topic: str, payload: bytes) -> tuple[MQMD, bytes]:
    """What a hand-written bridge puts: an MQRFH2 Publish of ``topic`` on the stream."""
    psc = Element.from_pairs(
        "psc", {"Command": "Publish", "Topic": f"$SYS/STREAM/{STREAM}/{topic}"}
    )
    rfh2 = MQRFH2(folders=[psc], format=FMT_STRING, coded_char_set_id=1208)
    md = MQMD(format=FMT_RF_HEADER_2, persistence=Persistence.PERSISTENT, coded_char_set_id=1208)
    return md, encode_rfh2(rfh2, ccsid=1208) + payload


def new_qm(work: Path, name: str) -> EmbeddedQueueManager:
    qm = EmbeddedQueueManager("QMIN", work / name)
    qm.run_mqsc(
        f"DEFINE QLOCAL('{STREAM}') DEFPSIST(YES) MAXDEPTH(1000000) REPLACE\n"
        f"ALTER QLOCAL('{DEFAULT_STREAM}') MAXDEPTH(1000000)",
        stop_on_error=True,
    )
    return qm


def depth(qm: EmbeddedQueueManager) -> int:
    return qm.queue_depth(STREAM) + qm.queue_depth(DEFAULT_STREAM)


async def timed(
    qm: EmbeddedQueueManager, n: int, limit: float, consume: Callable[[], Awaitable[None]]
) -> float:
    """Runs ``consume`` until ``n`` publications are on the queue; msg/s from the first."""
    task = asyncio.create_task(consume())
    try:
        deadline = time.perf_counter() + limit + 30  # + joining / connecting
        first_at, first = 0.0, 0
        while True:
            got = depth(qm)
            now = time.perf_counter()
            if got and not first_at:
                first_at, first = now, got
            if got >= n:
                break
            if task.done():
                task.result()  # raises what stopped it
                raise SystemExit(f"consumer ended with {got} of {n} on the queue")
            if now > deadline or (first_at and now - first_at > limit):
                raise SystemExit(f"{got} of {n} on the queue within the time limit")
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.3)  # a duplicate would show here
        if depth(qm) != n:
            raise SystemExit(f"{depth(qm)} publications on the queue, expected {n}")
        return (n - first) / (now - first_at)
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):  # cancelled, or already reported
            await task


async def _run_instance(host: PluginHost, instance: PluginInstance) -> None:
    """Start ``instance`` on ``host`` and keep it running (until cancelled)."""
    await host.start(instance)
    await asyncio.Event().wait()


# ----------------------------------------------------------------------- Kafka -> MQ ---


async def through_gateway(
    qm: EmbeddedQueueManager, instance: PluginInstance, n: int, limit: float
) -> float:
    """Run ``instance`` in a plugin host on ``qm`` (the stream serviced) until ``n``
    publications are on the stream queue; msg/s. Stops the host and ``qm``."""
    service = BrokerService(
        qm,
        PubSubEngine(qm.name, MemoryStore()),
        BrokerConfig(streams=[StreamQueueConfig(name=STREAM)]),
    )
    host = PluginHost(qm, service, "bench")
    try:
        return await timed(qm, n, limit, lambda: _run_instance(host, instance))
    finally:
        await host.stop_all()
        await qm.close()


async def kafka_preload(bootstrap: str, topic: str, n: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, acks=1)
    await producer.start()
    try:
        pending = [
            await producer.send(topic, PAYLOAD, key=f"T{i % TOPICS}".encode()) for i in range(n)
        ]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def kafka_gateway(bootstrap: str, work: Path, n: int, limit: float) -> float:
    topic = "in-gw"
    await kafka_preload(bootstrap, topic, n)
    qm = new_qm(work, "qm-kafka-gw")
    config = KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": bootstrap,
            "outbound": {"enabled": False},
            "inbound": {
                "topics": [{"kafka_topic": topic, "stream": STREAM}],
                "group_id": "bench-in-gw",
            },
        }
    )
    return await through_gateway(qm, kafka_plugin.create("kafka", config), n, limit)


async def kafka_raw(bootstrap: str, work: Path, n: int, limit: float, tag: str = "") -> float:
    topic = f"in-raw{tag}"
    await kafka_preload(bootstrap, topic, n)
    qm = new_qm(work, f"qm-kafka-raw{tag}")

    async def consume() -> None:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=f"bench-in-raw{tag}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        conn = await qm.connect()
        handle = await conn.open(STREAM, OpenOption.OUTPUT)
        opts = PutOptions(syncpoint=True)
        try:
            while True:
                batches = await consumer.getmany(timeout_ms=200, max_records=KAFKA_BATCH)
                records = [r for part in batches.values() for r in part]
                if not records:
                    continue
                for r in records:
                    md, body = publish_command((r.key or b"").decode(), r.value or b"")
                    await handle.put(md, body, opts)
                await conn.commit()
                await consumer.commit()
        finally:
            await conn.disconnect()
            await consumer.stop()

    try:
        return await timed(qm, n, limit, consume)
    finally:
        await qm.close()


# ------------------------------------------------------------------------ MQTT -> MQ ---


def _session_props() -> Properties:
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = 3600
    props.ReceiveMaximum = RECEIVE_MAXIMUM
    return props


async def mqtt_preload(broker: MosquittoBroker, prefix: str, n: int) -> None:
    """Publish ``n`` QoS 1 messages under ``prefix/`` (a persistent session queues them)."""
    async with aiomqtt.Client(
        broker.host, port=broker.port, identifier=f"load-{prefix}", max_inflight_messages=1000
    ) as pub:
        pub.pending_calls_threshold = n + 1
        for low in range(0, n, 1000):
            await asyncio.gather(
                *(
                    pub.publish(f"{prefix}/T{i % TOPICS}", PAYLOAD, qos=1)
                    for i in range(low, min(n, low + 1000))
                )
            )


async def mqtt_subscribe_session(broker: MosquittoBroker, client_id: str, filt: str) -> None:
    """Create ``client_id``'s persistent session with ``filt`` at QoS 1, then leave."""
    async with aiomqtt.Client(
        broker.host,
        port=broker.port,
        identifier=client_id,
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=False,
        properties=_session_props(),
    ) as client:
        await client.subscribe(filt, qos=1)


async def mqtt_gateway(broker: MosquittoBroker, work: Path, n: int, limit: float) -> float:
    client_id = "bench-in-gw"
    await mqtt_subscribe_session(broker, client_id, "in-gw/#")
    await mqtt_preload(broker, "in-gw", n)
    qm = new_qm(work, "qm-mqtt-gw")
    config = MqttConfig.model_validate(
        {
            "host": broker.host,
            "port": broker.port,
            "client_id": client_id,
            "session_expiry": 3600,
            "outbound": {"topics": ["$SYS/STREAM/NOT.BRIDGED/#"]},
            "inbound": {"filters": [{"filter": "in-gw/#", "stream": STREAM}]},
        }
    )
    return await through_gateway(qm, mqtt_plugin.create("mqtt", config), n, limit)


async def mqtt_raw(broker: MosquittoBroker, work: Path, n: int, limit: float) -> float:
    client_id = "bench-in-raw"
    await mqtt_subscribe_session(broker, client_id, "in-raw/#")
    await mqtt_preload(broker, "in-raw", n)
    qm = new_qm(work, "qm-mqtt-raw")

    async def consume() -> None:
        conn = await qm.connect()
        handle = await conn.open(STREAM, OpenOption.OUTPUT)
        opts = PutOptions(syncpoint=True)
        try:
            async with aiomqtt.Client(
                broker.host,
                port=broker.port,
                identifier=client_id,
                protocol=aiomqtt.ProtocolVersion.V5,
                clean_start=False,
                properties=_session_props(),
            ) as client:
                messages = aiter(client.messages)
                while True:
                    batch = [await anext(messages)]
                    while len(client.messages) and len(batch) < MQTT_BATCH:
                        batch.append(await anext(messages))
                    for m in batch:
                        payload = m.payload if isinstance(m.payload, bytes) else b""
                        md, body = publish_command(m.topic.value.partition("/")[2], payload)
                        await handle.put(md, body, opts)
                    await conn.commit()
        finally:
            await conn.disconnect()

    try:
        return await timed(qm, n, limit, consume)
    finally:
        await qm.close()


async def run(n: int, limit: float, paths: set[str]) -> int:
    work = Path(tempfile.mkdtemp(prefix="mqgw-bench-inbound-"))
    try:
        if "kafka" in paths:
            kafka = KafkaBroker(work / "kafka")
            kafka.start()
            try:
                await kafka_raw(kafka.bootstrap, work, min(n, 1000), limit, "-warm-up")  # JVM
                raw = await kafka_raw(kafka.bootstrap, work, n, limit)
                gw = await kafka_gateway(kafka.bootstrap, work, n, limit)
            finally:
                kafka.stop()
            print(f"raw aiokafka consumer + MQ puts (batch {KAFKA_BATCH}): {raw:9,.0f} msg/s")
            print(
                f"Kafka -> MQ gateway (max_batch {KAFKA_BATCH})       : {gw:9,.0f} msg/s"
                f"  ratio {gw / raw:.2f}",
                flush=True,
            )
            record(
                Row(
                    f"Kafka -> MQ, batch {KAFKA_BATCH}",
                    gw,
                    raw,
                    0.7,
                    note="vs raw consumer + raw puts",
                )
            )
        if "mqtt" in paths:
            mqtt = MosquittoBroker(work / "mosquitto")
            mqtt.start()
            try:
                raw = await mqtt_raw(mqtt, work, n, limit)
                gw = await mqtt_gateway(mqtt, work, n, limit)
            finally:
                mqtt.stop()
            print(f"raw aiomqtt subscriber + MQ puts (batch {MQTT_BATCH}): {raw:9,.0f} msg/s")
            print(
                f"MQTT -> MQ gateway (batch_size {MQTT_BATCH})         : {gw:9,.0f} msg/s"
                f"  ratio {gw / raw:.2f}",
                flush=True,
            )
            record(
                Row(
                    f"MQTT -> MQ QoS 1, batch {MQTT_BATCH}",
                    gw,
                    raw,
                    0.7,
                    note="vs raw subscriber + raw puts",
                )
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per run")
    parser.add_argument("--paths", default="kafka,mqtt")
    args = parser.parse_args(argv)
    return asyncio.run(run(args.messages, args.time_limit, set(args.paths.split(","))))


if __name__ == "__main__":
    sys.exit(main())
