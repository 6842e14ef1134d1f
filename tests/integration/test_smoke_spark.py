"""Smoke: PySpark's Kafka source (batch, includeHeaders) against the real broker."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from gateway.devstack import KafkaBroker

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

N_RECORDS = 500


async def _produce(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                key=f"k-{i}".encode(),
                value=f"v-{i}".encode(),
                headers=[("trace", f"trace-{i}".encode())],
            )
            for i in range(N_RECORDS)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def test_batch_read_counts_exactly_and_reads_a_header(
    kafka_broker: KafkaBroker, spark_session: Any
) -> None:
    topic = f"spark-smoke-{uuid.uuid4().hex[:12]}"
    asyncio.run(_produce(kafka_broker.bootstrap, topic))

    df = (
        spark_session.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("includeHeaders", "true")
        .load()
    )
    assert df.count() == N_RECORDS
    assert df.select("value").distinct().count() == N_RECORDS

    rows = df.where("CAST(key AS STRING) = 'k-321'").select("value", "headers").collect()
    assert len(rows) == 1
    assert bytes(rows[0]["value"]) == b"v-321"
    headers = [(h["key"], bytes(h["value"])) for h in rows[0]["headers"]]
    assert headers == [("trace", b"trace-321")]
