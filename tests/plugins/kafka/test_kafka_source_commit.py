"""KafkaSource batch handling without a broker: a record MQ refuses is skipped (never
retried for ever), and an offset-commit failure after MQ committed never rewinds the
consumer (which would publish the batch into MQ twice)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaConnectionError

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.plugin_api import InboundPublication
from gateway.runtime.plugin_host import MQPublisher
from plugins.kafka.config import KafkaPluginConfig
from plugins.kafka.errors import KafkaPluginError
from plugins.kafka.source import COMMIT_ATTEMPTS, KafkaSource

TP = TopicPartition("ticks", 0)
STREAM_Q = "SYSTEM.BROKER.DEFAULT.STREAM"


@pytest.fixture
async def qm(tmp_path: Path) -> AsyncIterator[EmbeddedQueueManager]:
    qmgr = EmbeddedQueueManager("QM1", tmp_path / "qm")
    qmgr.run_mqsc(f"DEFINE QLOCAL('{STREAM_Q}') REPLACE", stop_on_error=True)
    try:
        yield qmgr
    finally:
        await qmgr.close()


def _record(offset: int, headers: list[tuple[str, bytes]]) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic=TP.topic,
        partition=TP.partition,
        offset=offset,
        timestamp=0,
        timestamp_type=0,
        key=b"k",
        value=b"v",
        checksum=None,
        serialized_key_size=1,
        serialized_value_size=1,
        headers=[("mq.topic", b"Price/X"), *headers],
    )


class FakeConsumer:
    """Records commits and seeks; fails the first ``fail_commits`` commits."""

    def __init__(self, fail_commits: int = 0) -> None:
        self.fail_commits = fail_commits
        self.commits: list[dict[TopicPartition, int]] = []
        self.seeks: list[tuple[TopicPartition, int]] = []

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.fail_commits:
            self.fail_commits -= 1
            raise KafkaConnectionError("coordinator gone")
        self.commits.append(dict(offsets))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))


class CountingPublisher:
    def __init__(self, inner: MQPublisher) -> None:
        self.inner = inner
        self.calls: list[int] = []

    async def publish(self, publications: Sequence[InboundPublication]) -> None:
        self.calls.append(len(publications))
        await self.inner.publish(publications)


def _source(publisher: CountingPublisher) -> KafkaSource:
    config = KafkaPluginConfig.model_validate(
        {
            "inbound": {
                "topics": [{"kafka_topic": "ticks", "stream": "SYSTEM.BROKER.DEFAULT.STREAM"}],
                "retry_initial_s": 0.001,
                "retry_max_s": 0.002,
                "dead_letter_topic": "",  # no broker here: refused records are dropped
            }
        }
    )
    return KafkaSource(config, publisher, instance="k1", gateway_id="gw")


async def test_record_with_bad_format_is_skipped_and_the_rest_committed(
    qm: EmbeddedQueueManager,
) -> None:
    publisher = CountingPublisher(MQPublisher(qm))
    source = _source(publisher)
    consumer = FakeConsumer()
    batch = {
        TP: [
            _record(10, []),
            _record(11, [("mq.format", b"FAR_TOO_LONG")]),
            _record(12, [("mq.ccsid", str(2**40).encode())]),
            _record(13, []),
        ]
    }
    await source._deliver(cast(AIOKafkaConsumer, consumer), cast(Any, batch))
    assert consumer.commits == [{TP: 14}]
    assert consumer.seeks == []
    assert source.counters.skipped_invalid == 2
    assert source.counters.published == 2
    assert qm.queue_depth(STREAM_Q) == 2
    await publisher.inner.close()


async def test_commit_failure_after_publish_retries_commit_not_publish(
    qm: EmbeddedQueueManager,
) -> None:
    publisher = CountingPublisher(MQPublisher(qm))
    source = _source(publisher)
    consumer = FakeConsumer(fail_commits=2)
    batch = {TP: [_record(5, []), _record(6, [])]}
    await source._deliver(cast(AIOKafkaConsumer, consumer), cast(Any, batch))
    assert publisher.calls == [2]  # published exactly once
    assert consumer.commits == [{TP: 7}]
    assert consumer.seeks == []
    assert source.counters.commit_failures == 2
    assert qm.queue_depth(STREAM_Q) == 2
    await publisher.inner.close()


async def test_commit_failing_for_good_moves_on_without_republishing(
    qm: EmbeddedQueueManager,
) -> None:
    publisher = CountingPublisher(MQPublisher(qm))
    source = _source(publisher)
    consumer = FakeConsumer(fail_commits=COMMIT_ATTEMPTS + 10)
    await source._deliver(cast(AIOKafkaConsumer, consumer), cast(Any, {TP: [_record(1, [])]}))
    assert publisher.calls == [1]
    assert consumer.commits == []
    assert source.counters.commit_failures == COMMIT_ATTEMPTS
    await publisher.inner.close()


class FakeProducer:
    instances: ClassVar[list[FakeProducer]] = []

    def __init__(self, **_: object) -> None:
        self.started = False
        self.stopped = False
        FakeProducer.instances.append(self)

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True


async def test_sink_start_stops_its_producer_when_topic_creation_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import plugins.kafka.clients.aiokafka_client as client_module
    import plugins.kafka.sink as sink_module

    config = KafkaPluginConfig.model_validate({})
    router = config.outbound.router()
    sink = sink_module.KafkaSink(config, router, instance="k1", gateway_id="gw")

    async def refuse(_: object) -> None:
        raise KafkaPluginError("topic creation not authorised")

    FakeProducer.instances.clear()
    monkeypatch.setattr(client_module, "AIOKafkaProducer", FakeProducer)
    monkeypatch.setattr(sink.topics, "ensure", refuse)
    with pytest.raises(KafkaPluginError, match="not authorised"):
        await sink.start()
    assert len(FakeProducer.instances) == 1
    assert FakeProducer.instances[0].started
    assert FakeProducer.instances[0].stopped
    assert sink.producer is None


class PollingConsumer(FakeConsumer):
    """Hands out ``batches`` one poll at a time, then nothing; its offset commits wait
    for ``released`` (a slow group coordinator)."""

    def __init__(self, batches: list[dict[TopicPartition, list[Any]]]) -> None:
        super().__init__()
        self.batches = batches
        self.released = asyncio.Event()
        self.committing = 0

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> Any:
        if self.batches:
            return self.batches.pop(0)
        await asyncio.sleep(timeout_ms / 1000)
        return {}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.committing += 1
        await self.released.wait()
        await super().commit(offsets)


async def test_next_batch_goes_into_mq_while_the_offsets_before_are_committed(
    qm: EmbeddedQueueManager,
) -> None:
    """The offset commit after a batch's MQ commit is a broker round trip: the next
    batch is polled and handed over meanwhile, and the offsets are committed in order."""
    publisher = CountingPublisher(MQPublisher(qm))
    source = _source(publisher)
    consumer = PollingConsumer([{TP: [_record(1, [])]}, {TP: [_record(2, []), _record(3, [])]}])
    running = asyncio.create_task(source._run(cast(Any, consumer)))
    try:
        async with asyncio.timeout(10):
            while publisher.calls != [1, 2]:  # the second batch, the first's commit waiting
                await asyncio.sleep(0.005)
        assert consumer.commits == [] and consumer.committing == 1
        consumer.released.set()
        async with asyncio.timeout(10):
            while len(consumer.commits) < 2:
                await asyncio.sleep(0.005)
    finally:
        source._stop.set()
        consumer.released.set()
        await running
        await publisher.inner.close()
    assert consumer.commits == [{TP: 2}, {TP: 4}]
    assert consumer.seeks == []
    assert qm.queue_depth(STREAM_Q) == 3
