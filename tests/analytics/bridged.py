"""Produce Kafka records in the exact shape of docs/kafka-contract.md (version 1).

The Kafka plugin that will write these for real comes later; until then the analytics
tests produce them here, header by header as the contract lists them, so the jobs are
tested against the contract rather than against the plugin's implementation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from analytics import contract as c

ORIGIN = "tests-analytics"


def msg_id(n: int, tag: bytes = b"AMQ TEST") -> bytes:
    """A 24-byte MQ MsgId, distinct per ``n``."""
    return (tag + n.to_bytes(16, "big"))[:24].ljust(24, b"\0")


def hour_start_ms(hours_ago: int = 1) -> int:
    """A recent whole hour (ms): windows are predictable and retention never bites."""
    now = int(time.time() * 1000)
    return (now // 3_600_000 - hours_ago) * 3_600_000


def unique(prefix: str) -> str:
    """A Kafka-safe name unique to this run (topics, streams)."""
    return f"{prefix}{uuid.uuid4().hex[:10].upper()}"


@dataclass
class Publication:
    """One bridged publication (or tombstone when ``value`` is None)."""

    stream: str
    topic: str
    value: bytes | None
    put_ms: int
    kafka_ms: int | None = None
    msg_id: bytes = field(default_factory=lambda: uuid.uuid4().bytes + b"\0" * 8)
    correl_id: bytes = b"\0" * 24
    retain: bool = False
    extra: list[tuple[str, bytes]] = field(default_factory=list)
    drop: tuple[str, ...] = ()  # contract headers to leave out (violations)
    override: dict[str, bytes] = field(default_factory=dict)  # contract headers to break
    key: str | None = None  # defaults to the topic

    def headers(self) -> list[tuple[str, bytes]]:
        """Headers exactly as the contract's table orders and encodes them."""
        hs: list[tuple[str, bytes]] = [
            (c.H_CONTRACT, b"1"),
            (c.H_STREAM, self.stream.encode()),
            (c.H_TOPIC, self.topic.encode()),
        ]
        if self.value is not None:
            hs += [
                (c.H_MSG_ID, self.msg_id),
                (c.H_CORREL_ID, self.correl_id),
                (c.H_PUT_TIME, str(self.put_ms).encode()),
                (c.H_USER_ID, b"app"),
                (c.H_FORMAT, b"MQSTR"),
                (c.H_ENCODING, b"546"),
                (c.H_CCSID, b"1208"),
                (c.H_PERSISTENCE, b"1"),
                (c.H_PUB_HEADER, b"MQRFH2"),
            ]
            if self.retain:
                hs.append((c.H_RETAIN, b"1"))
        hs.append((c.H_ORIGIN, ORIGIN.encode()))
        hs = [(k, self.override.get(k, v)) for k, v in hs if k not in self.drop]
        return hs + self.extra


async def create_topics(bootstrap: str, names: list[str], partitions: int = 1) -> None:
    """Create topics up front (one partition: the tests rely on one offset order)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        with contextlib.suppress(TopicAlreadyExistsError):
            await admin.create_topics([NewTopic(n, partitions, 1) for n in names])
    finally:
        await admin.close()


async def _produce(bootstrap: str, kafka_topic: str, pubs: list[Publication]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    await producer.start()
    try:
        for p in pubs:
            key = (p.key if p.key is not None else p.topic).encode()
            # Sent one by one and awaited: the tests rely on this exact offset order.
            await producer.send_and_wait(kafka_topic, value=p.value, key=key,
                                         headers=p.headers(),
                                         timestamp_ms=p.kafka_ms if p.kafka_ms else p.put_ms)
    finally:
        await producer.stop()


def produce(bootstrap: str, kafka_topic: str, pubs: list[Publication]) -> None:
    """Create ``kafka_topic`` (one partition) and produce ``pubs`` to it, in order."""
    asyncio.run(_create_and_produce(bootstrap, kafka_topic, pubs))


async def _create_and_produce(bootstrap: str, kafka_topic: str,
                              pubs: list[Publication]) -> None:
    await create_topics(bootstrap, [kafka_topic])
    await _produce(bootstrap, kafka_topic, pubs)


def produce_raw(bootstrap: str, kafka_topic: str,
                records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int]]
                ) -> None:
    """Produce (key, value, headers, timestamp_ms) records as given (dead letters)."""
    async def run() -> None:
        await create_topics(bootstrap, [kafka_topic])
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for key, value, headers, ts in records:
                await producer.send_and_wait(kafka_topic, value=value, key=key,
                                             headers=headers, timestamp_ms=ts)
        finally:
            await producer.stop()
    asyncio.run(run())


def consume_all(bootstrap: str, kafka_topic: str, expected: int,
                timeout: float = 30.0) -> list[object]:
    """Read ``kafka_topic`` from the start until ``expected`` records or ``timeout``."""
    from aiokafka import AIOKafkaConsumer

    async def run() -> list[object]:
        consumer = AIOKafkaConsumer(kafka_topic, bootstrap_servers=bootstrap,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        got: list[object] = []
        try:
            deadline = time.monotonic() + timeout
            while len(got) < expected and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for msgs in batch.values():
                    got.extend(msgs)
            # a short extra poll so that records beyond ``expected`` are seen too
            batch = await consumer.getmany(timeout_ms=1000)
            for msgs in batch.values():
                got.extend(msgs)
        finally:
            await consumer.stop()
        return got
    return asyncio.run(run())
