"""Kafka -> MQ with the real broker: records reach MQRFH and MQRFH2 subscribers, own
records are not echoed, offsets are committed only after the MQ unit of work, and a
failed publish commits nothing and re-delivers the records."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import TopicPartition

from gateway.devstack import KafkaBroker
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.plugin_api import InboundPublication, PluginError
from gateway.runtime.plugin_host import MQPublisher
from gateway.wire.constants import MsgType
from plugins.kafka import KafkaPluginConfig
from plugins.kafka.source import KafkaSource
from tests.plugins.kafka.kafka_harness import (
    CONTROL,
    STOCK,
    consume,
    produce,
    send_command,
    start_gateway,
    unique,
    wait_for_queue,
)
from tests.support.pubsub_messages import rfh2_message, rfh_message

pytestmark = [pytest.mark.kafka]


async def _committed(bootstrap: str, group: str, topic: str) -> int | None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    meta = offsets.get(TopicPartition(topic, 0))
    return None if meta is None or meta.offset < 0 else meta.offset


async def _wait_committed(bootstrap: str, group: str, topic: str, offset: int) -> None:
    async with asyncio.timeout(20):
        while await _committed(bootstrap, group, topic) != offset:
            await asyncio.sleep(0.1)


async def _create_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_kafka_records_reach_mqrfh_and_mqrfh2_subscribers(
    kafka_broker: KafkaBroker, tmp_path: Path, backend: str
) -> None:
    source_topic, group = unique("in"), unique("g")
    # The topic does not exist yet: the plugin creates it before consuming, so records
    # produced after start-up are seen at once (not at the next metadata refresh).
    cfg = KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": kafka_broker.bootstrap,
            "backend": backend,
            "outbound": {"enabled": False},
            "inbound": {
                "group_id": group,
                "topics": [{"kafka_topic": source_topic, "stream": STOCK, "topic": "Orders/X"}],
            },
        }
    )
    gw = await start_gateway(tmp_path, cfg)
    try:
        await send_command(
            gw.qm,
            rfh_message(
                CONTROL,
                [
                    ("MQPSCommand", "RegSub"),
                    ("MQPSStreamName", STOCK),
                    ("MQPSTopic", "Orders/*"),
                    ("MQPSQName", "SUB.RFH"),
                ],
                reply_to_q="REPLY.Q",
                msg_type=MsgType.REQUEST,
            ),
        )
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
        replies = await wait_for_queue(gw.qm, "REPLY.Q", 2)
        assert all(r.get("MQPSCompCode") in (None, "0") for r in replies)
        await produce(
            kafka_broker.bootstrap,
            source_topic,
            [
                (b"Orders/1", b"one", [("usr.Colour", b"Blue")]),
                (None, b"two", [("mq.stream", STOCK.encode()), ("mq.topic", b"Orders/2")]),
                (b"Orders/echo", b"own", [("mq.origin", b"gw-test")]),  # this gateway's own
                (None, b"three", []),  # no key, no headers: the configured topic
            ],
        )
        rfh = await wait_for_queue(gw.qm, "SUB.RFH", 3)
        rfh2 = await wait_for_queue(gw.qm, "SUB.RFH2", 3)
        await _wait_committed(kafka_broker.bootstrap, group, source_topic, 4)
        await asyncio.sleep(0.3)
        extra = await wait_for_queue(gw.qm, "SUB.RFH", 0)
    finally:
        await gw.close()
    assert [m.payload for m in rfh] == [b"one", b"two", b"three"]
    assert [m.topic for m in rfh] == ["Orders/1", "Orders/2", "Orders/X"]
    assert rfh[0].get("Colour") == "Blue"
    assert [m.payload for m in rfh2] == [b"one", b"two", b"three"]
    assert [m.topic for m in rfh2] == [f"$SYS/STREAM/{STOCK}/Orders/{t}" for t in ("1", "2", "X")]
    assert rfh2[0].get("usr/Colour") == "Blue"
    assert extra == []


class FlakyPublisher:
    """A real MQ publisher that refuses the first ``failures`` units of work."""

    def __init__(self, inner: MQPublisher, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.calls = 0

    async def publish(self, publications: Sequence[InboundPublication]) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise PluginError("queue manager unavailable (test)", retriable=True)
        await self.inner.publish(publications)


def _source_config(
    bootstrap: str, topic: str, group: str, backend: str = "aiokafka"
) -> KafkaPluginConfig:
    return KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": bootstrap,
            "backend": backend,
            "outbound": {"enabled": False},
            "inbound": {
                "group_id": group,
                "retry_initial_s": 0.05,
                "retry_max_s": 0.2,
                "topics": [{"kafka_topic": topic, "stream": STOCK}],
            },
        }
    )


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_failed_publish_commits_no_offset_and_records_are_redelivered(
    kafka_broker: KafkaBroker, tmp_path: Path, backend: str
) -> None:
    topic, group = unique("redeliver"), unique("g")
    await _create_topic(kafka_broker.bootstrap, topic)
    n = 5
    await produce(
        kafka_broker.bootstrap,
        topic,
        [(f"T/{i}".encode(), f"v{i}".encode(), []) for i in range(n)],
    )
    cfg = _source_config(kafka_broker.bootstrap, topic, group, backend)
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    qm.run_mqsc(f"DEFINE QLOCAL('{STOCK}') REPLACE", stop_on_error=True)
    publisher = MQPublisher(qm, origin="kafka", serviced_queues={STOCK})
    try:
        # 1. MQ refuses every unit of work: retried, nothing committed, nothing put.
        down = FlakyPublisher(publisher, failures=10_000)
        source = KafkaSource(cfg, down, instance="kafka", gateway_id="gw-test")
        await source.start()
        async with asyncio.timeout(20):
            while down.calls < 3:
                await asyncio.sleep(0.05)
        assert not source.healthy
        await source.stop()
        assert await _committed(kafka_broker.bootstrap, group, topic) is None
        assert qm.queue_depth(STOCK) == 0

        # 2. A new consumer in the same group gets the same records again; MQ fails
        #    twice more, then commits: every record is put exactly once, then committed.
        flaky = FlakyPublisher(publisher, failures=2)
        source = KafkaSource(cfg, flaky, instance="kafka", gateway_id="gw-test")
        await source.start()
        await _wait_committed(kafka_broker.bootstrap, group, topic, n)
        assert source.healthy
        await source.stop()
        assert flaky.calls >= 3
        assert qm.queue_depth(STOCK) == n
        assert source.counters.published == n
    finally:
        await publisher.close()
        await qm.close()


async def test_outbound_and_inbound_together_do_not_loop(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """The gateway consumes the very topic it produces to: a publication made in MQ
    appears once on Kafka and is not published back into MQ."""
    p, group = unique("loop"), unique("g")
    stock_topic = f"{p}.STOCK.STREAM"
    cfg = KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": kafka_broker.bootstrap,
            "outbound": {"topic_template": p + ".{stream}", "routes": [{"stream": STOCK}]},
            "inbound": {"group_id": group, "topics": [{"kafka_topic": stock_topic}]},
        }
    )
    await _create_topic(kafka_broker.bootstrap, stock_topic)
    gw = await start_gateway(tmp_path, cfg)
    try:
        await send_command(
            gw.qm,
            rfh2_message(
                STOCK, [("Command", "Publish"), ("Topic", f"$SYS/STREAM/{STOCK}/A")], b"once"
            ),
        )
        await _wait_committed(kafka_broker.bootstrap, group, stock_topic, 1)
        await asyncio.sleep(1.0)
        records = await consume(kafka_broker.bootstrap, stock_topic, 1)
        source = gw.instance.source
        assert source is not None
        assert source.counters.skipped_own == 1
        assert source.counters.published == 0
    finally:
        await gw.close()
    assert [r.value for r in records] == [b"once"]


async def test_a_record_mq_refuses_for_good_is_skipped_not_retried_for_ever(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = unique("refused"), unique("g")
    await _create_topic(kafka_broker.bootstrap, topic)
    await produce(
        kafka_broker.bootstrap,
        topic,
        [
            (b"T/1", b"one", []),
            (b"T/2", b"bad", [("mq.stream", b"NOT A STREAM!")]),
            (b"T/3", b"three", []),
        ],
    )
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    qm.run_mqsc(f"DEFINE QLOCAL('{STOCK}') REPLACE", stop_on_error=True)
    publisher = MQPublisher(qm, origin="kafka", serviced_queues={STOCK})
    source = KafkaSource(
        _source_config(kafka_broker.bootstrap, topic, group),
        publisher,
        instance="kafka",
        gateway_id="gw-test",
    )
    try:
        await source.start()
        await _wait_committed(kafka_broker.bootstrap, group, topic, 3)
        await source.stop()
        assert source.counters.skipped_invalid == 1
        assert source.counters.published == 2
        assert qm.queue_depth(STOCK) == 2
    finally:
        await source.stop()
        await publisher.close()
        await qm.close()


async def test_compacted_topic_records_become_retained_and_tombstones_delete_them(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = unique("retin"), unique("g")
    cfg = KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": kafka_broker.bootstrap,
            "outbound": {"enabled": False},
            "inbound": {
                "group_id": group,
                "topics": [{"kafka_topic": topic, "stream": STOCK, "retain": True}],
            },
        }
    )
    gw = await start_gateway(tmp_path, cfg)

    def retained() -> dict[str, bytes]:
        return {r.topic: r.publication.payload for r in gw.service.engine.retained(STOCK)}

    try:
        await produce(kafka_broker.bootstrap, topic, [(b"IBM/Latest", b"118.50", [])])
        async with asyncio.timeout(20):
            while retained() != {"IBM/Latest": b"118.50"}:
                await asyncio.sleep(0.05)
        await produce(kafka_broker.bootstrap, topic, [(b"IBM/Latest", None, [])])
        async with asyncio.timeout(20):
            while retained():
                await asyncio.sleep(0.05)
        await _wait_committed(kafka_broker.bootstrap, group, topic, 2)
    finally:
        await gw.close()
