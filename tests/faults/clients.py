"""The outside clients of the fault suite: an aiokafka consumer and an MQTT subscriber
reading the outbound paths for a whole run, and steady Kafka/MQTT feeds for the inbound
paths that keep going through broker outages."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import aiomqtt
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from tests.faults.ledger import Ledger, PathLedger
from tests.faults.scenario import FaultWorld
from tests.support.names import unique


class KafkaReader:
    """Reads an outbound topic (default the at-least-once one) from the beginning for the
    whole run (no group); ``read_committed`` for the exactly-once topic."""

    def __init__(self, world: FaultWorld, ledger: PathLedger, topic: str | None = None,
                 read_committed: bool = False) -> None:
        self.world = world
        self.ledger = ledger
        self.topic = topic or world.kafka_out
        self.isolation_level = "read_committed" if read_committed else "read_uncommitted"
        self.task: asyncio.Task[None] | None = None
        self.stop = asyncio.Event()

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.world.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            metadata_max_age_ms=1000,
            isolation_level=self.isolation_level,
        )
        await consumer.start()
        try:
            consumer.subscribe([self.topic])
            while not self.stop.is_set():
                batches = await consumer.getmany(timeout_ms=200)
                for records in batches.values():
                    # padding after an id (``id|...``) is cut off
                    self.ledger.receive(r.value.decode().partition("|")[0]
                                        for r in records if r.value)
        finally:
            await consumer.stop()

    def start(self) -> None:
        self.task = asyncio.create_task(self.run())

    async def close(self) -> None:
        self.stop.set()
        if self.task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.task, 15)


class MqttReader:
    """A persistent-session QoS 1 subscriber that reconnects (it survives a Mosquitto
    restart when the broker keeps sessions)."""

    def __init__(self, world: FaultWorld, ledger: PathLedger) -> None:
        self.world = world
        self.ledger = ledger
        self.client_id = unique("faults-reader-")
        self.task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.stop = asyncio.Event()

    async def run(self) -> None:
        while not self.stop.is_set():
            try:
                async with aiomqtt.Client(
                    self.world.mqtt_host,
                    self.world.mqtt_port,
                    identifier=self.client_id,
                    protocol=aiomqtt.ProtocolVersion.V311,
                    clean_session=False,
                    keepalive=5,
                ) as client:
                    await client.subscribe(self.world.mqtt_out_filter, qos=1)
                    self.ready.set()
                    async for msg in client.messages:
                        payload = msg.payload
                        if isinstance(payload, bytes | bytearray):
                            self.ledger.receive([bytes(payload).decode(
                                "utf-8", "replace").partition("|")[0]])
            except aiomqtt.MqttError:
                await asyncio.sleep(0.5)

    def start(self) -> None:
        self.task = asyncio.create_task(self.run())

    async def close(self) -> None:
        self.stop.set()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


class SteadyFeeds:
    """Kafka records and MQTT QoS 1 messages at a steady rate until stopped, through
    outages: an id counts as sent only once its broker acknowledged it (acks=all /
    PUBACK); a send that failed is not retried under the same id."""

    def __init__(self, world: FaultWorld, ledger: Ledger, rate: float = 20.0) -> None:
        self.world = world
        self.kafka = ledger.paths["Kafka->MQ"]
        self.mqtt = ledger.paths["MQTT->MQ"]
        self.period = 1.0 / rate
        #: Bytes of padding after each id (``id|....``): a test that must make the
        #: queue manager's store grow sets it for a while.
        self.pad = 0
        self.stop = asyncio.Event()
        self.failures: Counter[str] = Counter()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._kafka()), asyncio.create_task(self._mqtt())]

    async def close(self) -> None:
        self.stop.set()
        async with asyncio.timeout(30):
            await asyncio.gather(*self.tasks)

    def _payload(self, i: str) -> bytes:
        return i.encode() + (b"|" + b"." * self.pad if self.pad else b"")

    async def _kafka(self) -> None:
        n = 0
        while not self.stop.is_set():
            producer = AIOKafkaProducer(
                bootstrap_servers=self.world.bootstrap, acks="all", request_timeout_ms=3000
            )
            try:
                await asyncio.wait_for(producer.start(), 5)
                while not self.stop.is_set():
                    i = f"k-{n}"
                    n += 1
                    await asyncio.wait_for(
                        producer.send_and_wait(self.world.kafka_in, self._payload(i),
                                               key=f"F/{i}".encode()), 5)
                    self.kafka.sent.add(i)
                    await asyncio.sleep(self.period)
            except Exception:  # the broker is down: a new producer after a pause
                self.failures["kafka"] += 1
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(producer.stop(), 5)

    async def _mqtt(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                async with aiomqtt.Client(
                    self.world.mqtt_host, self.world.mqtt_port,
                    identifier=unique("faults-pub-"), timeout=3,
                ) as client:
                    while not self.stop.is_set():
                        i = f"m-{n}"
                        n += 1
                        await asyncio.wait_for(
                            client.publish(f"{self.world.mqtt_in_prefix}/F/{i}", self._payload(i),
                                           qos=1), 5)
                        self.mqtt.sent.add(i)
                        await asyncio.sleep(self.period)
            except (aiomqtt.MqttError, TimeoutError):
                self.failures["mqtt"] += 1
                await asyncio.sleep(0.5)
