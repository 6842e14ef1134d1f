"""Inbound poison never blocks a Kafka partition (issue 12 item 4), with the real broker.

A record MQ can never take (here: larger than the stream queue's MAXMSGL, MQRC 2030)
goes to the dead-letter topic with the reason and where it came from; its offset is
committed with the batch, and the records after it reach MQ subscribers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.devstack import KafkaBroker
from gateway.runtime.metrics import GatewayMetrics
from gateway.wire.constants import MsgType
from plugins.kafka import KafkaInstance, KafkaPluginConfig, plugin
from tests.plugins.kafka.kafka_harness import (
    CONTROL,
    STOCK,
    consume,
    headers_of,
    produce,
    send_command,
    unique,
    wait_for_queue,
)
from tests.support.gateway import BRIDGE_QUEUES, start_gateway
from tests.support.pubsub_messages import rfh2_message

pytestmark = [pytest.mark.kafka]


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_record_mq_can_never_take_goes_to_dead_letter_topic_and_later_ones_flow(
    kafka_broker: KafkaBroker, tmp_path: Path, backend: str
) -> None:
    source_topic, dlq, group = unique("in"), unique("dlq"), unique("g")
    cfg = KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": kafka_broker.bootstrap,
            "backend": backend,
            "outbound": {"enabled": False},
            "inbound": {
                "group_id": group,
                "dead_letter_topic": dlq,
                "topics": [{"kafka_topic": source_topic, "stream": STOCK, "topic": "Orders/X"}],
            },
        }
    )
    mqsc = BRIDGE_QUEUES + f"ALTER QLOCAL('{STOCK}') MAXMSGL(4000)\n"
    gw = await start_gateway(tmp_path, plugin.create("kafka", cfg), mqsc=mqsc)
    try:
        await send_command(
            gw.qm,
            rfh2_message(
                CONTROL,
                [
                    ("Command", "RegSub"),
                    ("Topic", f"$SYS/STREAM/{STOCK}/Orders/#"),
                    ("QName", "SUB.RFH2"),
                ],
                reply_to_q="REPLY.Q",
                msg_type=MsgType.REQUEST,
            ),
        )
        await wait_for_queue(gw.qm, "REPLY.Q", 1)
        big = b"x" * 6000
        await produce(
            kafka_broker.bootstrap,
            source_topic,
            [(None, b"before", []), (None, big, [("usr.Colour", b"Red")]), (None, b"small", [])],
        )
        got = await wait_for_queue(gw.qm, "SUB.RFH2", 2, timeout=30)
        await produce(kafka_broker.bootstrap, source_topic, [(None, b"after", [])])
        got += await wait_for_queue(gw.qm, "SUB.RFH2", 1, timeout=30)
        dead = await consume(kafka_broker.bootstrap, dlq, 1, timeout=30)
        instance = gw.instance
        assert isinstance(instance, KafkaInstance)
        stats = instance.stats()
        exposition = GatewayMetrics(gw.service, gw.host, lambda: {}).exposition().decode()
    finally:
        await gw.close()
    assert [m.payload for m in got] == [b"before", b"small", b"after"]
    assert len(dead) == 1
    record = dead[0]
    assert record.value == big
    headers = headers_of(record)
    assert headers["mq.dlh.reason"] == b"2030"
    assert headers["kafka.topic"] == source_topic.encode()
    assert headers["kafka.partition"] == b"0"
    assert headers["kafka.offset"] == b"1"
    assert headers["usr.Colour"] == b"Red"
    assert b"MAXMSGL" in headers["mqgw.error"]
    assert stats["inbound_dead_lettered"] == 1
    assert stats["inbound_published"] == 3
    assert (
        'mqgw_inbound_refused_total{plugin="kafka",reason="MQRC_MSG_TOO_BIG_FOR_Q"} 1.0'
        in exposition
    ), exposition
    await asyncio.sleep(0)
