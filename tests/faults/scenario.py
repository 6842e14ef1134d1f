"""The fault suite's world: one ``mqgw run`` child on the embedded queue manager with the
kafka and mqtt plugins, the four persistent paths it carries, outside clients feeding
and reading each path, and a ledger of unique message ids per path.

Paths (each message's payload is its unique id):

- ``MQ->Kafka`` and ``MQ->MQTT``: MQRFH publications on ``STOCK.STREAM``, put by the
  test process while the gateway is down (the data directory is locked while it runs);
  read by an aiokafka consumer and an MQTT subscriber that stay connected throughout.
- ``Kafka->MQ`` and ``MQTT->MQ``: records / QoS 1 messages produced by outside clients
  while the gateway runs, published by it on ``BULLETIN.STREAM`` to the MQ subscriber
  queue ``FAULT.SUB`` (an MQRFH2 RegSub registered on the first start), which the test
  drains after the gateway has stopped.

Why the inbound and outbound streams differ: nothing the gateway brings in from Kafka or
MQTT is sent back out, so every count belongs to exactly one path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomqtt
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.wire.constants import MsgType
from gateway.wire.reasons import Reason
from tests.support.gateway_process import GatewayProcess, write_config
from tests.support.names import unique
from tests.support.pubsub_messages import CONTROL, decode, rfh2_message, rfh_message

QM_NAME = "QM1"
OUT_STREAM = "STOCK.STREAM"
IN_STREAM = "BULLETIN.STREAM"
SUB_Q = "FAULT.SUB"
REPLY_Q = "FAULT.REPLY"
PATHS = ("MQ->Kafka", "MQ->MQTT", "Kafka->MQ", "MQTT->MQ")


@dataclass
class PathLedger:
    """What one path sent (unique ids) and received (id -> times seen)."""

    sent: set[str] = field(default_factory=set)
    received: Counter[str] = field(default_factory=Counter)

    def receive(self, ids: Iterable[str]) -> None:
        self.received.update(i for i in ids if i)

    @property
    def lost(self) -> list[str]:
        return sorted(self.sent - set(self.received))

    @property
    def duplicated(self) -> int:
        return sum(n - 1 for i, n in self.received.items() if i in self.sent and n > 1)

    @property
    def complete(self) -> bool:
        return not self.lost


@dataclass
class Ledger:
    paths: dict[str, PathLedger] = field(
        default_factory=lambda: {p: PathLedger() for p in PATHS}
    )

    def table(self, trials: int) -> list[dict[str, Any]]:
        return [
            {
                "path": name,
                "trials": trials,
                "sent": len(p.sent),
                "received": sum(n for i, n in p.received.items() if i in p.sent),
                "lost": len(p.lost),
                "duplicated": p.duplicated,
                "unexpected": sum(n for i, n in p.received.items() if i not in p.sent),
            }
            for name, p in self.paths.items()
        ]

    @staticmethod
    def render(rows: list[dict[str, Any]]) -> str:
        cols = ("path", "trials", "sent", "received", "lost", "duplicated", "unexpected")
        lines = ["  ".join(f"{c:>10}" for c in cols)]
        lines += ["  ".join(f"{row[c]!s:>10}" for c in cols) for row in rows]
        return "\n".join(lines)


@dataclass
class FaultWorld:
    """Names and settings of one suite run (unique per run on the shared brokers)."""

    work: Path
    bootstrap: str
    mqtt_host: str
    mqtt_port: int
    tag: str = field(default_factory=lambda: unique("faults"))
    kafka_extra: dict[str, Any] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        return self.work / "qm"

    @property
    def kafka_out(self) -> str:
        return f"{self.tag}.out"

    @property
    def kafka_in(self) -> str:
        return f"{self.tag}.in"

    @property
    def mqtt_out_filter(self) -> str:
        return f"{self.tag}/out/{OUT_STREAM}/#"

    @property
    def mqtt_in_prefix(self) -> str:
        return f"{self.tag}/in"

    def config(self) -> dict[str, Any]:
        return {
            "id": f"mqgw-{self.tag}",
            "queue_manager": {"name": QM_NAME, "data_dir": "qm"},
            "broker": {
                "store": "pubsub.db",
                "streams": [{"name": OUT_STREAM}, {"name": IN_STREAM}],
                "wait_ms": 100,
                "sink_retry_max_delay": 1.0,
            },
            "metrics": {"enabled": False},
            "logging": {"format": "text", "level": "info"},
            "shutdown_timeout": 20.0,
            "plugins": [
                {
                    "name": "kafka",
                    "plugin": "kafka",
                    "config": {
                        "bootstrap_servers": self.bootstrap,
                        **self.kafka_extra,
                        "outbound": {
                            "routes": [
                                {"stream": OUT_STREAM, "topic": "#", "kafka_topic": self.kafka_out}
                            ]
                        },
                        "inbound": {
                            "topics": [{"kafka_topic": self.kafka_in, "stream": IN_STREAM}],
                            "poll_timeout_ms": 100,
                        },
                    },
                },
                {
                    "name": "mqtt",
                    "plugin": "mqtt",
                    "config": {
                        "host": self.mqtt_host,
                        "port": self.mqtt_port,
                        "reconnect_max_delay": 1.0,
                        "outbound": {
                            "prefix": f"{self.tag}/out",
                            "topics": [f"$SYS/STREAM/{OUT_STREAM}/#"],
                        },
                        "inbound": {
                            "filters": [
                                {
                                    "filter": f"{self.mqtt_in_prefix}/#",
                                    "strip_prefix": f"{self.mqtt_in_prefix}/",
                                    "stream": IN_STREAM,
                                }
                            ]
                        },
                    },
                },
            ],
        }

    def gateway(self) -> GatewayProcess:
        self.work.mkdir(parents=True, exist_ok=True)
        path = write_config(self.work / "gateway.yaml", self.config())
        return GatewayProcess(path, self.work / "gateway.log")


# ------------------------------------------------------- the MQ side (gateway down) ----


async def prepare_queue_manager(world: FaultWorld) -> None:
    """Define the subscriber and reply queues and queue the RegSub (answered at start)."""
    qm = EmbeddedQueueManager(QM_NAME, world.data_dir)
    try:
        qm.run_mqsc(
            f"DEFINE QLOCAL({SUB_Q}) MAXDEPTH(500000) REPLACE\n"
            f"DEFINE QLOCAL({REPLY_Q}) REPLACE\n"
            f"DEFINE QLOCAL('{OUT_STREAM}') MAXDEPTH(500000) DEFPSIST(YES) REPLACE\n"
            f"DEFINE QLOCAL('{IN_STREAM}') MAXDEPTH(500000) DEFPSIST(YES) REPLACE\n",
            stop_on_error=True,
        )
        regsub = rfh2_message(
            CONTROL,
            [("Command", "RegSub"), ("Topic", f"$SYS/STREAM/{IN_STREAM}/#"), ("QName", SUB_Q)],
            msg_type=MsgType.REQUEST,
            reply_to_q=REPLY_Q,
            reply_to_q_mgr=QM_NAME,
        )
        conn = await qm.connect()
        try:
            await conn.put1(regsub.queue, regsub.md, regsub.body, PutOptions())
        finally:
            await conn.disconnect()
    finally:
        await qm.close()


async def regsub_answer(world: FaultWorld) -> str:
    """``ok`` or the broker's reason from the RegSub's response (gateway down)."""
    qm = EmbeddedQueueManager(QM_NAME, world.data_dir)
    try:
        replies = await _drain(qm, REPLY_Q)
    finally:
        await qm.close()
    if not replies:
        return "no response"
    answer = decode(replies[0][0], replies[0][1])
    return answer.get("pscr/Completion") or "no pscr"


async def put_publications(world: FaultWorld, ids: list[str]) -> None:
    """Persistent MQRFH publications (payload = id) on the outbound stream, one commit."""
    qm = EmbeddedQueueManager(QM_NAME, world.data_dir)
    try:
        conn = await qm.connect()
        try:
            handle = await conn.open(OUT_STREAM, OpenOption.OUTPUT)
            for i in ids:
                msg = rfh_message(
                    OUT_STREAM,
                    [("MQPSCommand", "Publish"), ("MQPSStreamName", OUT_STREAM),
                     ("MQPSTopic", f"F/{i}")],
                    i.encode(),
                )
                await handle.put(msg.md, msg.body, PutOptions(syncpoint=True))
            await conn.commit()
            await handle.close()
        finally:
            await conn.disconnect()
    finally:
        await qm.close()


async def drain_subscriber(world: FaultWorld) -> list[str]:
    """Ids of every publication on the MQ subscriber queue (destructive; gateway down)."""
    qm = EmbeddedQueueManager(QM_NAME, world.data_dir)
    try:
        got = await _drain(qm, SUB_Q)
    finally:
        await qm.close()
    return [decode(md, body).payload.decode("utf-8", "replace") for md, body in got]


async def queue_depths(world: FaultWorld, *queues: str) -> dict[str, int]:
    qm = EmbeddedQueueManager(QM_NAME, world.data_dir)
    try:
        return {q: qm.queue_depth(q) for q in queues}
    finally:
        await qm.close()


async def _drain(qm: EmbeddedQueueManager, queue: str) -> list[tuple[Any, bytes]]:
    conn = await qm.connect()
    out: list[tuple[Any, bytes]] = []
    try:
        handle = await conn.open(queue, OpenOption.INPUT_SHARED)
        while True:
            try:
                m = await handle.get(GetOptions(wait_ms=0, syncpoint=True))
            except MQError as exc:
                if exc.reason == Reason.NO_MSG_AVAILABLE:
                    break
                raise
            out.append((m.md, m.body))
        await conn.commit()
        await handle.close()
    finally:
        await conn.disconnect()
    return out


# --------------------------------------------------------- outside clients ------------


class KafkaReader:
    """Reads the outbound topic from the beginning for the whole run (no group)."""

    def __init__(self, world: FaultWorld, ledger: PathLedger) -> None:
        self.world = world
        self.ledger = ledger
        self.task: asyncio.Task[None] | None = None
        self.stop = asyncio.Event()

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.world.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            metadata_max_age_ms=1000,
        )
        await consumer.start()
        try:
            consumer.subscribe([self.world.kafka_out])
            while not self.stop.is_set():
                batches = await consumer.getmany(timeout_ms=200)
                for records in batches.values():
                    self.ledger.receive(r.value.decode() for r in records if r.value)
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
                            self.ledger.receive([bytes(payload).decode("utf-8", "replace")])
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


async def produce_kafka(world: FaultWorld, ids: list[str], ledger: PathLedger) -> None:
    """Records (key = MQ topic, value = id), acks=all; an id counts as sent once acked."""
    producer = AIOKafkaProducer(bootstrap_servers=world.bootstrap, acks="all")
    await producer.start()
    try:
        for i in ids:
            await producer.send_and_wait(world.kafka_in, i.encode(), key=f"F/{i}".encode())
            ledger.sent.add(i)
    finally:
        await producer.stop()


async def publish_mqtt(world: FaultWorld, ids: list[str], ledger: PathLedger) -> None:
    """QoS 1 publications; an id counts as sent once Mosquitto acknowledged it."""
    async with aiomqtt.Client(
        world.mqtt_host, world.mqtt_port, identifier=unique("faults-pub-")
    ) as client:
        for i in ids:
            await client.publish(f"{world.mqtt_in_prefix}/F/{i}", i.encode(), qos=1)
            ledger.sent.add(i)


async def wait_until(predicate: Any, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(step)
    return bool(predicate())


def write_report(path: Path, rows: list[dict[str, Any]], **extra: Any) -> None:
    path.write_text(json.dumps({"paths": rows, **extra}, indent=2), encoding="utf-8")
