"""The ``aiokafka`` backend (the default): aiokafka's own producer and consumer, which
already have the shape of the port (plugins.kafka.clients)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

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
) -> Any:
    return AIOKafkaConsumer(
        *topics,
        **client_args(config, client_id),
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset=auto_offset_reset,
        isolation_level="read_committed",
    )
