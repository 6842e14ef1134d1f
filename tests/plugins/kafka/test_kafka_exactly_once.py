"""Issue 12 item 10 (sink side) with the real broker: with ``delivery: exactly_once``
each send is one Kafka transaction that also records its envelopes as committed. A
restart after the Kafka commit but before the MQ commit (the same envelopes offered
again to a new sink) writes nothing twice, over several streams and partitions; a
read_committed reader sees every publication once.

Not covered yet: a SIGKILLed gateway subprocess at random points (the fault suite).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from gateway.devstack import KafkaBroker
from gateway.plugin_api import Envelope
from plugins.kafka import KafkaPluginConfig
from plugins.kafka.sink import KafkaSink
from tests.plugins.kafka.kafka_harness import unique

pytestmark = [pytest.mark.kafka]

STREAMS = ["S1.STREAM", "S2.STREAM", "S3.STREAM", "S4.STREAM"]


def _envelope(i: int) -> Envelope:
    stream = STREAMS[i % len(STREAMS)]
    return Envelope(
        stream=stream,
        topic=f"T{i % 5}",
        payload=str(i).encode(),
        msg_id=(i + 1).to_bytes(24, "big"),
        subscription_stream=stream,
        subscription_filter="#",
    )


async def _read_committed(bootstrap: str, topics: list[str], count: int) -> list[Any]:
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    records: list[Any] = []
    try:
        async with asyncio.timeout(60):
            while len(records) < count:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    records.extend(batch)
        for batch in (await consumer.getmany(timeout_ms=1500)).values():
            records.extend(batch)
    finally:
        await consumer.stop()
    return records


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_envelopes_committed_before_a_crash_are_not_written_again(
    kafka_broker: KafkaBroker, backend: str
) -> None:
    p = unique("eos")
    config = KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": kafka_broker.bootstrap,
            "backend": backend,
            "delivery": "exactly_once",
            "partitions": 3,
            "send_timeout_s": 30,
            "exactly_once_topic_name": p + "-eos",
            "outbound": {
                "topic_template": p + ".{stream}",
                "routes": [{"stream": s} for s in STREAMS],
            },
        }
    )
    first = [_envelope(i) for i in range(200)]
    sink = KafkaSink(config, config.outbound.router(), instance="kafka", gateway_id="gw")
    await sink.start()
    try:
        for k in range(0, 200, 25):
            await sink.send(first[k : k + 25])
    finally:
        await sink.stop()  # "crash": MQ never committed, it offers them all again
    again = KafkaSink(config, config.outbound.router(), instance="kafka", gateway_id="gw")
    await again.start()
    try:
        for k in range(0, 300, 30):
            await again.send([_envelope(i) for i in range(k, k + 30)])
        assert again.already_committed == 200
    finally:
        await again.stop()
    topics = [f"{p}.{s}" for s in STREAMS]
    records = await _read_committed(kafka_broker.bootstrap, topics, 300)
    values = sorted(int(r.value) for r in records)
    assert values == list(range(300))  # 0 lost, 0 duplicated
    assert len({r.partition for r in records}) > 1  # several partitions at once
