"""Delivery guarantees of the MQ -> Kafka path with the real broker: a graceful stop in
the middle of a stream and a restart lose and duplicate nothing; while Kafka does not
answer, MQ messages wait (back-pressure) and arrive once it answers again."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from gateway.devstack import KafkaBroker
from gateway.pubsub.outcome import InboundMessage
from gateway.wire.dlh import unwrap_from_dlq
from plugins.kafka import KafkaPluginConfig
from tests.plugins.kafka.kafka_harness import STOCK, consume, send_command, start_gateway, unique
from tests.support.pubsub_messages import rfh2_message
from tests.support.service_client import drain_raw, put_at_once

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _config(bootstrap: str, prefix: str, backend: str = "aiokafka") -> KafkaPluginConfig:
    return KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": bootstrap,
            "backend": backend,
            "request_timeout_ms": 3000,
            "send_timeout_s": 10,
            "outbound": {"topic_template": prefix + ".{stream}", "routes": [{"stream": STOCK}]},
        }
    )


def _publication(i: int) -> InboundMessage:
    return rfh2_message(
        STOCK,
        [("Command", "Publish"), ("Topic", f"$SYS/STREAM/{STOCK}/T{i % 3}")],
        str(i).encode(),
    )


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_graceful_stop_mid_stream_and_restart_lose_and_duplicate_nothing(
    kafka_broker: KafkaBroker, tmp_path: Path, backend: str
) -> None:
    p = unique("restart")
    n = 600
    # batches of 32: the stream lasts long enough for the stop to land in it (with the
    # default cap of 256 the 600 are three units of work)
    gw = await start_gateway(tmp_path, _config(kafka_broker.bootstrap, p, backend), batch_size=32)
    try:
        await put_at_once(gw.qm, [_publication(i) for i in range(n)])
        # Stop while the service is still working through the queue.
        async with asyncio.timeout(30):
            while gw.host.sink_counters["kafka"].deliveries < 50:
                await asyncio.sleep(0.005)
    finally:
        await gw.close()
    bridged_before = gw.host.sink_counters["kafka"].deliveries
    assert 50 <= bridged_before < n, f"the stop did not land mid-stream ({bridged_before} of {n})"
    gw = await start_gateway(tmp_path, _config(kafka_broker.bootstrap, p, backend))
    try:
        records = await consume(kafka_broker.bootstrap, f"{p}.STOCK.STREAM", n, timeout=60)
    finally:
        await gw.close()
    values = [int(r.value) for r in records]
    assert sorted(values) == list(range(n))  # every one, exactly once
    for k in range(3):
        per_key = [int(r.value) for r in records if r.key == f"T{k}".encode()]
        assert per_key == list(range(k, n, 3))


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_mq_messages_wait_while_kafka_is_unresponsive(
    kafka_broker: KafkaBroker, tmp_path: Path, backend: str
) -> None:
    assert kafka_broker.process is not None
    pgid = kafka_broker.process.pid
    p = unique("bp")
    n = 30
    gw = await start_gateway(tmp_path, _config(kafka_broker.bootstrap, p, backend))
    try:
        await send_command(gw.qm, _publication(0))
        await consume(kafka_broker.bootstrap, f"{p}.STOCK.STREAM", 1)
        os.killpg(pgid, signal.SIGSTOP)
        try:
            for i in range(1, n):
                await send_command(gw.qm, _publication(i))
            async with asyncio.timeout(30):
                while gw.service.counters.sink_retries < 2:
                    await asyncio.sleep(0.1)
            assert not gw.instance.healthy()
            assert gw.host.sink_counters["kafka"].deliveries == 1
        finally:
            os.killpg(pgid, signal.SIGCONT)
        records = await consume(kafka_broker.bootstrap, f"{p}.STOCK.STREAM", n, timeout=90)
        async with asyncio.timeout(30):
            while not gw.instance.healthy():
                await asyncio.sleep(0.1)
        counters = gw.service.counters
        assert counters.dead_lettered == 0 and counters.moved_to_backout_queue == 0
        assert gw.qm.queue_depth("SYSTEM.DEAD.LETTER.QUEUE") == 0
    finally:
        await gw.close()
    values = [int(r.value) for r in records]
    # Nothing lost; a batch Kafka took in just as it stalled may appear twice
    # (at-least-once), but the first copies keep the order per topic.
    assert set(values) == set(range(n))
    for k in range(3):
        firsts: list[int] = []
        for r in records:
            v = int(r.value)
            if r.key == f"T{k}".encode() and v not in firsts:
                firsts.append(v)
        assert firsts == list(range(k, n, 3))


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_mq_messages_wait_while_kafka_is_stopped_and_restarted(
    tmp_path: Path, backend: str
) -> None:
    """A real outage: the broker's JVM is stopped, publications wait on their MQ queue
    (no backouts counted, nothing dead-lettered), and all of them arrive in order per
    topic once the broker is back on the same address."""
    broker = KafkaBroker(tmp_path / "kafka").start()
    try:
        p = unique("outage")
        n = 30
        gw = await start_gateway(tmp_path / "gw", _config(broker.bootstrap, p, backend))
        try:
            await send_command(gw.qm, _publication(0))
            await consume(broker.bootstrap, f"{p}.STOCK.STREAM", 1)
            await asyncio.to_thread(broker.stop)
            for i in range(1, n):
                await send_command(gw.qm, _publication(i))
            async with asyncio.timeout(30):
                while gw.service.counters.sink_retries < 2:
                    await asyncio.sleep(0.1)
            assert not gw.instance.healthy()
            backlog = "SYSTEM.MQGW.SINK.kafka"  # the sink's backlog queue (docs/operations.md)
            assert gw.qm.queue_depth(backlog) > 0, "publications must wait on the backlog"
            await asyncio.to_thread(broker.restart)
            records = await consume(broker.bootstrap, f"{p}.STOCK.STREAM", n, timeout=90)
            counters = gw.service.counters
            assert counters.dead_lettered == 0 and counters.moved_to_backout_queue == 0
            assert gw.qm.queue_depth("SYSTEM.DEAD.LETTER.QUEUE") == 0
        finally:
            await gw.close()
    finally:
        broker.stop()
    values = [int(r.value) for r in records]
    assert set(values) == set(range(n))
    for k in range(3):
        firsts: list[int] = []
        for r in records:
            v = int(r.value)
            if r.key == f"T{k}".encode() and v not in firsts:
                firsts.append(v)
        assert firsts == list(range(k, n, 3))


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_a_record_kafka_refuses_does_not_block_the_stream(
    kafka_broker: KafkaBroker, tmp_path: Path, backend: str
) -> None:
    """Too large for max_request_size: the Kafka sink refuses that envelope for good, so
    its copy goes to the dead-letter queue with reason 2030 (not held for ever, not a
    backout), and later publications flow."""
    p = unique("big")
    gw = await start_gateway(tmp_path, _config(kafka_broker.bootstrap, p, backend))
    try:
        await send_command(
            gw.qm,
            rfh2_message(
                STOCK,
                [("Command", "Publish"), ("Topic", f"$SYS/STREAM/{STOCK}/Big")],
                b"x" * 1_200_000,
            ),
        )
        async with asyncio.timeout(60):
            while not gw.service.forwarder_counters()["kafka"].dead_lettered:
                await asyncio.sleep(0.05)
        await send_command(gw.qm, _publication(1))
        records = await consume(kafka_broker.bootstrap, f"{p}.STOCK.STREAM", 1)
        [dead] = await drain_raw(gw.qm, "SYSTEM.DEAD.LETTER.QUEUE")  # kept, not dropped
        dlh, _md, _body = unwrap_from_dlq(dead.md, dead.body)
    finally:
        await gw.close()
    assert [r.value for r in records] == [b"1"]
    assert dlh.reason == 2030  # MQRC_MSG_TOO_BIG_FOR_Q, the sink's reason
    assert gw.service.counters.moved_to_backout_queue == 0
