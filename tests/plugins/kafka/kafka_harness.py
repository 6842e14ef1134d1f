"""Kafka-side helpers of the kafka plugin tests: the shared in-process gateway
(``tests.support.gateway``) with one ``kafka`` instance, and a plain aiokafka
consumer/producer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.pubsub.outcome import InboundMessage
from plugins.kafka import KafkaPluginConfig, plugin
from tests.support import gateway as support_gateway
from tests.support.gateway import BULLETIN, CONTROL, DEFAULT, STOCK, InProcessGateway
from tests.support.names import unique
from tests.support.service_client import put, wait_for_queue

__all__ = [
    "BULLETIN",
    "CONTROL",
    "DEFAULT",
    "STOCK",
    "consume",
    "headers_of",
    "produce",
    "send_command",
    "start_gateway",
    "unique",
    "wait_for_queue",
]


async def start_gateway(
    path: Path,
    config: KafkaPluginConfig,
    *,
    name: str = "kafka",
    gateway_id: str = "gw-test",
    qm: EmbeddedQueueManager | None = None,
    batch_size: int | None = None,
) -> InProcessGateway:
    """Start (or restart on ``path``) the test gateway with one kafka instance
    (``batch_size``: the broker's, if not its default)."""
    return await support_gateway.start_gateway(
        path, plugin.create(name, config), gateway_id=gateway_id, qm=qm,
        config=None if batch_size is None else support_gateway.bridge_config(
            batch_size=batch_size),
    )


async def send_command(
    qm: EmbeddedQueueManager, msg: InboundMessage, *, set_identity: bool = False
) -> bytes:
    """Put a legacy application's command; returns the MsgId it was put with."""
    return await put(qm, msg, set_identity=set_identity)


async def consume(
    bootstrap: str,
    topic: str,
    count: int,
    timeout: float = 60,
    *,
    extra_wait_ms: int = 500,
    isolation_level: str = "read_uncommitted",
) -> list[Any]:
    """Read ``topic`` from the beginning until ``count`` records (and nothing more
    arrives within ``extra_wait_ms``)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation_level,
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


async def create_topic(bootstrap: str, prefix: str, partitions: int) -> str:
    """A new topic named ``prefix`` plus a unique suffix, ``partitions`` partitions,
    replication 1; its name."""
    topic = unique(prefix)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()
    return topic
