"""The ``aiokafka`` backend (the default): aiokafka's own producer and consumer, which
already have the shape of the port (plugins.kafka.clients)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from plugins.kafka.clients import outcome_seen
from plugins.kafka.config import KafkaPluginConfig
from plugins.kafka.security import security_args


def client_args(config: KafkaPluginConfig, client_id: str) -> dict[str, Any]:
    """Connection arguments shared by producer, consumer and admin client, with the
    ``security:`` block's TLS/SASL arguments (secrets read now, at connect time).
    ``client_options`` are aiokafka arguments only with the aiokafka backend (with
    ``confluent`` they are librdkafka properties; the admin client still uses aiokafka)."""
    args: dict[str, Any] = {
        "bootstrap_servers": config.bootstrap_servers,
        "client_id": config.client_id or client_id,
        "request_timeout_ms": config.request_timeout_ms,
    }
    if config.backend == "aiokafka":
        args.update(config.client_options)
    args.update(security_args(config.security, client_id))
    return args


def aiokafka_producer(
    config: KafkaPluginConfig,
    client_id: str,
    *,
    transactional_id: str | None = None,
    dead_letter: bool = False,
    batch_bytes: int | None = None,
) -> Any:
    if dead_letter:
        return AIOKafkaProducer(
            **client_args(config, client_id),
            acks="all",
            enable_idempotence=True,
            max_request_size=config.max_request_size,
        )
    return AIOKafkaProducer(
        **client_args(config, client_id),
        acks="all",
        enable_idempotence=True,
        transactional_id=transactional_id,
        linger_ms=config.linger_ms,
        max_request_size=config.max_request_size,
        max_batch_size=batch_bytes or config.producer_batch_bytes(),
        compression_type=config.compression_type,
    )


def aiokafka_consumer(
    config: KafkaPluginConfig,
    topics: Sequence[str],
    client_id: str,
    *,
    group_id: str,
    auto_offset_reset: str,
    group_instance_id: str | None = None,
) -> Any:
    return AIOKafkaConsumer(
        *topics,
        **client_args(config, client_id),
        group_id=group_id,
        group_instance_id=group_instance_id,
        enable_auto_commit=False,
        auto_offset_reset=auto_offset_reset,
        isolation_level="read_committed",
    )


@dataclass(slots=True)
class PartitionBatch:
    """Records sent together in one aiokafka record batch: one acknowledgement (the
    ``future``, set once the batch is handed to the producer) for all ``count``."""

    topic: str
    partition: int
    builder: Any
    count: int = 0
    future: asyncio.Future[Any] | None = None


@dataclass(frozen=True, slots=True)
class CheckedRecord:
    """A record :meth:`BatchWriter.check` accepted, with its serialized key and value."""

    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes]]
    key_bytes: bytes | None
    value_bytes: bytes | None


class BatchWriter:
    """Fills aiokafka record batches per partition and hands each to the producer whole
    (``create_batch``/``send_batch``), for the records of one sink round.

    Why: ``send`` costs about 10 us of the event loop a record (a metadata wait, the
    partitioner, a future and its result per record); a batch built here costs about 5.
    The records go where ``send`` would put them (the producer's own serializers, size
    check and partitioner: aiokafka's internal ``_serialize`` and ``_partition``, the
    package is pinned to 0.14.x), in the same order per partition, in batches of the
    producer's ``max_batch_size``. A batch is closed before it is handed over, so nothing
    else joins it and it does not linger.
    """

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer
        self._open: dict[tuple[str, int], PartitionBatch] = {}
        #: every batch in the order it was opened (what :meth:`flush` sends)
        self._batches: list[PartitionBatch] = []
        #: the default partitioner depends on the key alone: its choice is kept
        self._keyed = isinstance(getattr(producer, "_partitioner", None), DefaultPartitioner)
        self._partitions: dict[tuple[str, bytes], int] = {}
        self._known_topics: set[str] = set()

    def check(
        self, topic: str, value: bytes | None, key: bytes | None, headers: list[tuple[str, bytes]]
    ) -> CheckedRecord:
        """The record serialized; raises as ``send`` does for one it refuses before
        sending (MessageSizeTooLargeError over ``max_request_size``)."""
        key_bytes, value_bytes = self._producer._serialize(key, value, headers)
        return CheckedRecord(topic, value, key, headers, key_bytes, value_bytes)

    async def add(self, record: CheckedRecord) -> PartitionBatch:
        """Append a checked record; returns the batch it went in (its future is set by
        :meth:`flush`, or here when the batch filled up and was sent)."""
        topic, key = record.topic, record.key
        if topic not in self._known_topics:
            await self._producer.partitions_for(topic)  # metadata, as send waits for it
            self._known_topics.add(topic)
        partition = self._partitions.get((topic, key)) if self._keyed and key else None
        if partition is None:
            partition = self._producer._partition(
                topic, None, key, record.value, record.key_bytes, record.value_bytes
            )
            if self._keyed and key:  # without a key the partitioner may pick any
                self._partitions[(topic, key)] = partition
        batch = self._open.get((topic, partition))
        value, headers = record.value, record.headers
        if (
            batch is None
            or batch.builder.append(key=key, value=value, timestamp=None, headers=headers) is None
        ):
            if batch is not None:
                await self._send(batch)
            builder = self._producer.create_batch()
            batch = PartitionBatch(topic, partition, builder)
            self._open[(topic, partition)] = batch
            self._batches.append(batch)
            # an empty batch takes any record (one over max_batch_size goes alone)
            builder.append(key=key, value=value, timestamp=None, headers=headers)
        batch.count += 1
        return batch

    async def flush(self) -> None:
        """Hand every batch not sent yet to the producer, in the order opened."""
        for batch in self._batches:
            if batch.future is None:
                await self._send(batch)
        self._open.clear()

    def abandon(self) -> None:
        """The round failed part-way: the batches already handed over still end by
        themselves; their outcomes are marked seen (no "never retrieved" noise)."""
        for batch in self._batches:
            if batch.future is not None:
                batch.future.add_done_callback(outcome_seen)

    async def _send(self, batch: PartitionBatch) -> None:
        self._open.pop((batch.topic, batch.partition), None)
        batch.builder.close()
        batch.future = await self._producer.send_batch(
            batch.builder, batch.topic, partition=batch.partition
        )


def batch_writer(producer: object) -> BatchWriter | None:
    """A :class:`BatchWriter` for an aiokafka producer; None for any other producer
    (the ``confluent`` backend has ``send_round``; test doubles get a record at a time)."""
    if isinstance(producer, AIOKafkaProducer):
        return BatchWriter(producer)
    return None
