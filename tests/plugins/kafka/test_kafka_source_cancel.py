"""A source whose start is cancelled (the gateway stops while it waits on Kafka) closes
the consumer it made: nothing left behind to warn "Unclosed AIOKafkaConsumer"."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from gateway.plugin_api import InboundPublication
from plugins.kafka import source as source_module
from plugins.kafka.config import KafkaPluginConfig
from plugins.kafka.source import KafkaSource


class _Nobody:
    async def publish(self, publications: Sequence[InboundPublication]) -> None:
        raise AssertionError("nothing is consumed here")


async def test_a_cancelled_start_closes_its_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    real_new_consumer = source_module.new_consumer

    def new_consumer(*args: Any, **kwargs: Any) -> Any:
        made.append(real_new_consumer(*args, **kwargs))
        return made[-1]

    waiting = asyncio.Event()

    async def ensure(self: Any, topics: Any) -> None:  # Kafka does not answer
        waiting.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(source_module, "new_consumer", new_consumer)
    monkeypatch.setattr(source_module.TopicCreator, "ensure", ensure)
    config = KafkaPluginConfig.model_validate({"inbound": {"topics": [
        {"kafka_topic": "ticks", "stream": "SYSTEM.BROKER.DEFAULT.STREAM"}]}})
    src = KafkaSource(config, _Nobody(), instance="k1", gateway_id="gw")
    start = asyncio.create_task(src.start())
    await asyncio.wait_for(waiting.wait(), 10)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    (consumer,) = made
    assert consumer._closed is True
