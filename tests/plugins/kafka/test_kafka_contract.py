"""The plugin contract suite (``tests/plugins/contract.py``) against the kafka plugin and
the real Kafka broker, once per client backend (aiokafka, confluent/librdkafka)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.devstack import KafkaBroker
from plugins.kafka import KafkaInstance, KafkaPluginConfig, plugin
from tests.plugins.contract import OUT_FILTER, PluginContract, Seen
from tests.plugins.kafka.kafka_harness import consume, headers_of, produce
from tests.support.gateway import STOCK
from tests.support.names import unique

pytestmark = [pytest.mark.kafka]


class KafkaDriver:
    """Kafka is the target: one outbound topic for STOCK, one inbound topic."""

    def __init__(self, bootstrap: str, backend: str = "aiokafka") -> None:
        self.bootstrap = bootstrap
        self.backend = backend
        self.prefix = unique("contract")
        self.outbound_topic = f"{self.prefix}.{STOCK}"
        self.inbound_topic = unique("contract-in")
        self.taken = 0

    def instance(self, name: str) -> KafkaInstance:
        stream, _, topic_filter = OUT_FILTER.removeprefix("$SYS/STREAM/").partition("/")
        config = KafkaPluginConfig.model_validate(
            {
                "bootstrap_servers": self.bootstrap,
                "backend": self.backend,
                "outbound": {
                    "topic_template": self.prefix + ".{stream}",
                    "retained_topic_template": self.prefix + "-retained.{stream}",
                    "routes": [{"stream": stream, "topic": topic_filter}],
                },
                "inbound": {
                    "group_id": unique("g"),
                    "topics": [{"kafka_topic": self.inbound_topic, "stream": STOCK}],
                },
            }
        )
        instance = plugin.create(name, config)
        assert isinstance(instance, KafkaInstance)
        return instance

    async def read_outbound(self, count: int) -> list[Seen]:
        records: list[Any] = await consume(
            self.bootstrap,
            self.outbound_topic,
            self.taken + count,
            extra_wait_ms=500 if count else 2000,
        )
        fresh, self.taken = records[self.taken :], len(records)
        out: list[Seen] = []
        for r in fresh:
            h = headers_of(r)
            props = {k[4:]: v.decode() for k, v in h.items() if k.startswith("usr.")}
            out.append(Seen(h["mq.stream"].decode(), r.key.decode(), r.value, props))
        return out

    async def inject(self, topic: str, payload: bytes, properties: dict[str, str]) -> None:
        headers = [(f"usr.{k}", v.encode()) for k, v in properties.items()]
        await produce(self.bootstrap, self.inbound_topic, [(topic.encode(), payload, headers)])


class TestKafkaContract(PluginContract):
    @pytest.fixture(params=["aiokafka", "confluent"])
    async def driver(
        self, kafka_broker: KafkaBroker, request: pytest.FixtureRequest
    ) -> AsyncIterator[KafkaDriver]:
        yield KafkaDriver(kafka_broker.bootstrap, request.param)
