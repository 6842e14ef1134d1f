"""Smoke: the real Kafka 4.x broker from the devstack with aiokafka (idempotent + transactional)."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from gateway.devstack import KafkaBroker
from tests.plugins.kafka.kafka_harness import create_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

N_RECORDS = 1000
N_PARTITIONS = 3
N_KEYS = 17


async def _consume(
    bootstrap: str, topic: str, expected: int, *, isolation_level: str = "read_uncommitted"
) -> list[Any]:
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
        async with asyncio.timeout(60):
            while len(records) < expected:
                batches = await consumer.getmany(timeout_ms=500)
                for batch in batches.values():
                    records.extend(batch)
        # Nothing beyond what was produced may show up.
        extra = await consumer.getmany(timeout_ms=500)
        records.extend(r for batch in extra.values() for r in batch)
    finally:
        await consumer.stop()
    return records


async def test_idempotent_produce_with_keys_and_headers_reads_back_in_order(
    kafka_broker: KafkaBroker,
) -> None:
    topic = await create_topic(kafka_broker.bootstrap, "smoke-", N_PARTITIONS)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap, enable_idempotence=True, linger_ms=5
    )
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                value=f"value-{i}".encode(),
                key=f"key-{i % N_KEYS}".encode(),
                headers=[("seq", str(i).encode()), ("origin", b"smoke")],
            )
            for i in range(N_RECORDS)
        ]
        metadata = await asyncio.gather(*futures)
    finally:
        await producer.stop()

    produced_per_partition: dict[int, list[int]] = defaultdict(list)
    for i, meta in enumerate(metadata):
        produced_per_partition[meta.partition].append(i)
    assert len(produced_per_partition) > 1, "17 keys over 3 partitions must use more than one"

    records = await _consume(kafka_broker.bootstrap, topic, N_RECORDS)
    assert len(records) == N_RECORDS

    consumed_per_partition: dict[int, list[int]] = defaultdict(list)
    partition_of_key: dict[bytes, int] = {}
    for rec in records:
        headers = dict(rec.headers)
        seq = int(headers["seq"])
        assert headers["origin"] == b"smoke"
        assert rec.value == f"value-{seq}".encode()
        assert rec.key == f"key-{seq % N_KEYS}".encode()
        # a key always lands on the same partition
        assert partition_of_key.setdefault(rec.key, rec.partition) == rec.partition
        consumed_per_partition[rec.partition].append(seq)

    assert consumed_per_partition == produced_per_partition
    for seqs in consumed_per_partition.values():
        assert seqs == sorted(seqs)


async def test_transactional_producer_commit_is_visible_and_abort_is_not(
    kafka_broker: KafkaBroker,
) -> None:
    topic = await create_topic(kafka_broker.bootstrap, "smoke-", 1)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap,
        transactional_id=f"smoke-tx-{uuid.uuid4().hex[:8]}",
    )
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(100):
                await producer.send(topic, value=f"committed-{i}".encode())
        await producer.begin_transaction()
        for i in range(50):
            await producer.send(topic, value=f"aborted-{i}".encode())
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send(topic, value=b"committed-last")
    finally:
        await producer.stop()

    records = await _consume(kafka_broker.bootstrap, topic, 101, isolation_level="read_committed")
    values = [r.value for r in records]
    assert values == [f"committed-{i}".encode() for i in range(100)] + [b"committed-last"]
