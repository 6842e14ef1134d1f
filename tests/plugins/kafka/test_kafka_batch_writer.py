"""The aiokafka backend's BatchWriter (plugins.kafka.clients.aiokafka_client): the sink
hands aiokafka whole record batches, and the records must land where ``send`` would put
them, in the same order per partition, one Kafka batch per writer batch, with ``send``'s
size refusal (real broker)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import MessageSizeTooLargeError

from gateway.devstack import KafkaBroker
from plugins.kafka import KafkaPluginConfig
from plugins.kafka.clients import new_producer
from plugins.kafka.clients.aiokafka_client import BatchWriter, batch_writer
from tests.plugins.kafka.kafka_harness import create_topic

PARTITIONS = 4
HEADERS = [("mq.h", b"x")]


async def _read(bootstrap: str, topic: str, n: int) -> dict[int, list[tuple[bytes, bytes]]]:
    """(key, value) per partition, in offset order, once ``n`` records were read."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        got: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in range(PARTITIONS)}
        async with asyncio.timeout(30):
            while sum(len(v) for v in got.values()) < n:
                for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                    got[tp.partition] += [(r.key or b"", r.value or b"") for r in records]
        return got
    finally:
        await consumer.stop()


@contextlib.asynccontextmanager
async def _writer(bootstrap: str, **config: Any) -> AsyncIterator[BatchWriter]:
    """A started aiokafka producer of the plugin's settings (``config`` on top) and its
    writer; the producer is stopped after."""
    producer: Any = new_producer(
        KafkaPluginConfig(bootstrap_servers=bootstrap, **config), "bw-test"
    )
    await producer.start()
    try:
        writer = batch_writer(producer)
        assert writer is not None
        yield writer
    finally:
        await producer.stop()


def _records() -> list[tuple[bytes, bytes]]:
    """60 keyed records: ten keys, mostly small, one bigger than the batch size."""
    out = [(f"k{i % 10}".encode(), f"v{i:03d}".encode() * 50) for i in range(60)]
    out[31] = (b"k3", b"B" * 6_000)
    return out


@pytest.mark.asyncio
async def test_batches_land_where_send_puts_them_in_order(kafka_broker: KafkaBroker) -> None:
    bootstrap = kafka_broker.bootstrap
    config = KafkaPluginConfig(bootstrap_servers=bootstrap, max_batch_size=4_096)
    by_batch, by_send = await create_topic(bootstrap, "bw-", PARTITIONS), await create_topic(
        bootstrap, "bw-", PARTITIONS
    )
    producer: Any = new_producer(config, "bw-test")
    await producer.start()
    try:
        writer = batch_writer(producer)
        assert isinstance(writer, BatchWriter)
        batches = [await writer.add(writer.check(by_batch, v, k, HEADERS)) for k, v in _records()]
        await writer.flush()
        offsets: dict[int, list[tuple[int, int]]] = {}  # partition -> (base offset, count)
        for b in {id(b): b for b in batches}.values():
            assert b.future is not None
            acked = await b.future
            assert acked.partition == b.partition
            offsets.setdefault(b.partition, []).append((acked.offset, b.count))
        futures = [await producer.send(by_send, v, key=k, headers=HEADERS) for k, v in _records()]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    # several batches: the 4 KiB batch size was honoured, the big record went alone
    distinct = {id(b): b for b in batches}
    assert len(distinct) > PARTITIONS
    assert sum(b.count for b in distinct.values()) == 60
    assert batches[31].count == 1
    assert all(b.count > 1 for i, b in enumerate(batches) if i != 31)
    # each writer batch was one batch on Kafka: on a partition, a batch's records start
    # where the batch before it ended
    for runs in offsets.values():
        runs.sort()
        assert runs[0][0] == 0
        for (base, count), (next_base, _) in itertools.pairwise(runs):
            assert next_base == base + count
    written = await _read(bootstrap, by_batch, 60)
    sent = await _read(bootstrap, by_send, 60)
    # the same partition for every record as send chose, in the order given
    assert written == sent
    assert sum(1 for v in written.values() if v) > 1
    for part in written.values():
        assert part == [r for r in _records() if r in part]


@pytest.mark.asyncio
async def test_a_record_over_max_request_size_is_refused_before_it_is_handed_over(
    kafka_broker: KafkaBroker,
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic = await create_topic(bootstrap, "bw-", PARTITIONS)
    async with _writer(bootstrap, max_request_size=3_000) as writer:
        first = await writer.add(writer.check(topic, b"a" * 100, b"k1", HEADERS))
        with pytest.raises(MessageSizeTooLargeError):
            writer.check(topic, b"b" * 3_000, b"k1", HEADERS)
        last = await writer.add(writer.check(topic, b"c" * 100, b"k1", HEADERS))
        assert first is last and last.count == 2  # the refused record took no place
        await writer.flush()
        assert last.future is not None
        await last.future
    written = await _read(bootstrap, topic, 2)
    assert [v for part in written.values() for _, v in part] == [b"a" * 100, b"c" * 100]


@pytest.mark.asyncio
async def test_a_batch_handed_over_is_closed_and_does_not_wait_for_the_linger(
    kafka_broker: KafkaBroker,
) -> None:
    """A unit of work is complete when it is handed over: its batches go at once even
    with a long ``linger_ms`` (an open batch would wait for it, or take in records sent
    after it)."""
    topic = await create_topic(kafka_broker.bootstrap, "bw-", PARTITIONS)
    async with _writer(kafka_broker.bootstrap, linger_ms=20_000) as writer:
        batch = await writer.add(writer.check(topic, b"a" * 100, b"k1", HEADERS))
        await writer.flush()
        assert batch.future is not None
        async with asyncio.timeout(10):  # well under the 20 s linger
            await batch.future
        assert batch.builder.append(key=b"k1", value=b"late", timestamp=None, headers=[]) is None


def test_other_producers_get_no_writer() -> None:
    """The confluent backend and test doubles are sent a record at a time."""
    assert batch_writer(object()) is None
