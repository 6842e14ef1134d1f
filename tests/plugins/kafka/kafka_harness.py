"""A whole gateway in the test process: embedded queue manager, broker service, the
runtime's plugin host and one ``kafka`` instance, plus legacy-application helpers that
put real MQRFH/MQRFH2 commands and a plain aiokafka consumer/producer."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.outcome import InboundMessage
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.runtime.plugin_host import PluginHost
from gateway.runtime.pubsub_service import BrokerConfig, BrokerService, StreamQueueConfig
from plugins.kafka import KafkaInstance, KafkaPluginConfig, plugin
from tests.support.pubsub_messages import Received, decode
from tests.support.service_client import drain_raw, put

STOCK = "STOCK.STREAM"
BULLETIN = "BULLETIN.STREAM"
DEFAULT = "SYSTEM.BROKER.DEFAULT.STREAM"
CONTROL = "SYSTEM.BROKER.CONTROL.QUEUE"
QUEUES = f"""
DEFINE QLOCAL('{STOCK}') DEFPSIST(YES) REPLACE
DEFINE QLOCAL('{BULLETIN}') DEFPSIST(YES) REPLACE
DEFINE QLOCAL(SUB.RFH) REPLACE
DEFINE QLOCAL(SUB.RFH2) REPLACE
DEFINE QLOCAL(REPLY.Q) REPLACE
"""


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


@dataclass
class Gateway:
    qm: EmbeddedQueueManager
    store: SqliteStore
    service: BrokerService
    host: PluginHost
    instance: KafkaInstance

    async def close(self) -> None:
        try:
            # Drain first: the batch in progress still needs its sink to commit.
            await self.service.stop()
            await self.host.stop_all()
        finally:
            await self.qm.close()
            self.store.close()


async def start_gateway(
    path: Path,
    config: KafkaPluginConfig,
    *,
    name: str = "kafka",
    gateway_id: str = "gw-test",
    qm: EmbeddedQueueManager | None = None,
) -> Gateway:
    """Start (or restart on ``path``) the gateway with one kafka instance."""
    qmgr = qm or EmbeddedQueueManager("QM1", path / "qm")
    qmgr.run_mqsc(QUEUES, stop_on_error=True)
    store = SqliteStore(path / "pubsub.db", synchronous="NORMAL")
    service = BrokerService(
        qmgr,
        PubSubEngine(qmgr.name, store),
        BrokerConfig(
            streams=[StreamQueueConfig(name=STOCK), StreamQueueConfig(name=BULLETIN)],
            wait_ms=50,
            retry_delay=0.05,
        ),
    )
    host = PluginHost(qmgr, service, gateway_id)
    instance = plugin.create(name, config)
    try:
        await host.start(instance)
        await service.start()
    except BaseException:
        await host.stop_all()
        await qmgr.close()
        store.close()
        raise
    return Gateway(qmgr, store, service, host, instance)


async def send_command(
    qm: EmbeddedQueueManager, msg: InboundMessage, *, set_identity: bool = False
) -> bytes:
    """Put a legacy application's command; returns the MsgId it was put with."""
    return await put(qm, msg, set_identity=set_identity)


async def wait_for_queue(
    qm: EmbeddedQueueManager, queue: str, count: int, timeout: float = 20
) -> list[Received]:
    """Get ``count`` messages from ``queue`` (destructively), waiting up to ``timeout``."""
    got: list[Received] = []
    async with asyncio.timeout(timeout):
        while len(got) < count:
            got.extend(decode(m.md, m.body) for m in await drain_raw(qm, queue))
            if len(got) < count:
                await asyncio.sleep(0.05)
    return got


async def consume(
    bootstrap: str, topic: str, count: int, timeout: float = 60, *, extra_wait_ms: int = 500
) -> list[Any]:
    """Read ``topic`` from the beginning until ``count`` records (and nothing more
    arrives within ``extra_wait_ms``)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    records: list[Any] = []
    try:
        async with asyncio.timeout(timeout):
            while len(records) < count:
                batches = await consumer.getmany(timeout_ms=200)
                for batch in batches.values():
                    records.extend(batch)
        extra = await consumer.getmany(timeout_ms=extra_wait_ms)
        records.extend(r for batch in extra.values() for r in batch)
    finally:
        await consumer.stop()
    return records


async def produce(
    bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None, list[Any]]]
) -> None:
    """Produce (key, value, headers) records in order and wait for their acks."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=key, headers=headers)
            for key, value, headers in records
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def headers_of(record: Any) -> dict[str, bytes]:
    return {k: bytes(v) for k, v in record.headers}
