"""The plugin's small internal port to a Kafka client library (``backend:`` in the config).

Sink, source, exchanges and the dead-letter producer talk to a :class:`Producer` and a
:class:`Consumer` with aiokafka's shape (``send`` returns a future of the ack,
``getmany``/``seek``/``commit``) and see aiokafka's error classes and record types,
whatever the backend: ``aiokafka`` (the default, plugins.kafka.clients.aiokafka_client)
or ``confluent`` (librdkafka through confluent-kafka, the optional ``rdkafka`` extra,
plugins.kafka.clients.confluent_client, which translates librdkafka's errors and
messages). The admin work (topic creation) and the security pre-flight stay on aiokafka
for both backends: neither is on the message path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from aiokafka import ConsumerRecord, TopicPartition

from plugins.kafka.config import KafkaPluginConfig

__all__ = [
    "Consumer",
    "Producer",
    "RoundSend",
    "new_consumer",
    "new_producer",
    "outcome_seen",
    "round_sender",
]


def outcome_seen(future: asyncio.Future[Any]) -> None:
    """Done-callback for an acknowledgement nobody awaits any more (a send given up):
    reads its outcome, so asyncio does not log "Future exception was never retrieved"."""
    if not future.cancelled():
        future.exception()


class Producer(Protocol):
    """An idempotent acks=all producer (transactional when given a transactional id)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Any]: ...

    async def flush(self) -> None: ...

    async def begin_transaction(self) -> None: ...

    async def commit_transaction(self) -> None: ...

    async def abort_transaction(self) -> None: ...


class Consumer(Protocol):
    """A consumer in a group, read_committed, offsets committed by hand."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]: ...

    def seek(self, partition: TopicPartition, offset: int) -> None: ...

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None: ...


#: A producer's ``send_round``: (topic, value, key, headers) records in, the ack future
#: of each record produced and the error of the one the client refused (None: none).
RoundSend = Callable[
    [Sequence[tuple[str, bytes | None, bytes | None, Sequence[tuple[str, bytes]]]]],
    Awaitable[tuple[list[asyncio.Future[Any]], Exception | None]],
]


def round_sender(producer: object) -> RoundSend | None:
    """The producer's ``send_round`` (the ``confluent`` backend's: a sink round's records
    in one call, acknowledged together); None for a producer without one."""
    send_round: RoundSend | None = getattr(producer, "send_round", None)
    return send_round


def new_producer(
    config: KafkaPluginConfig,
    client_id: str,
    *,
    transactional_id: str | None = None,
    dead_letter: bool = False,
    batch_bytes: int | None = None,
) -> Producer:
    """The configured backend's producer (not started): idempotent, acks=all, the
    config's linger, size limit, batch size (``batch_bytes`` when given: the sink's,
    capped by its topics' limits) and compression (the dead-letter producer keeps the
    library's default linger, batch size and no compression)."""
    if config.backend == "confluent":
        from plugins.kafka.clients.confluent_client import ConfluentProducer

        return ConfluentProducer(
            config, client_id, transactional_id=transactional_id, dead_letter=dead_letter,
            batch_bytes=batch_bytes,
        )
    from plugins.kafka.clients.aiokafka_client import aiokafka_producer

    producer: Producer = aiokafka_producer(
        config, client_id, transactional_id=transactional_id, dead_letter=dead_letter,
        batch_bytes=batch_bytes,
    )
    return producer


def new_consumer(
    config: KafkaPluginConfig,
    topics: Sequence[str],
    client_id: str,
    *,
    group_id: str,
    auto_offset_reset: str,
    group_instance_id: str | None = None,
) -> Consumer:
    """The configured backend's consumer of ``topics`` in ``group_id`` (not started);
    with ``group_instance_id`` a static member (KIP-345), which a restart after a crash
    takes over at once instead of waiting out the dead member's session."""
    if config.backend == "confluent":
        from plugins.kafka.clients.confluent_client import ConfluentConsumer

        return ConfluentConsumer(
            config, topics, client_id, group_id=group_id, auto_offset_reset=auto_offset_reset,
            group_instance_id=group_instance_id,
        )
    from plugins.kafka.clients.aiokafka_client import aiokafka_consumer

    consumer: Consumer = aiokafka_consumer(
        config, topics, client_id, group_id=group_id, auto_offset_reset=auto_offset_reset,
        group_instance_id=group_instance_id,
    )
    return consumer
