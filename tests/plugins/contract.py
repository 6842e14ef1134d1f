"""The plugin contract (``gateway.plugin_api``), written once and run against every
plugin: the memory plugin (``test_memory_plugin.py``), Kafka (``kafka/test_kafka_contract.py``)
and MQTT (``mqtt/test_mqtt_contract.py``).

A plugin's test module subclasses :class:`PluginContract` and gives a ``driver`` fixture:
a :class:`PluginDriver` that builds an instance wired to its target (outbound: the
instance subscribes to ``OUT_FILTER``; inbound: what is injected into the target becomes a
publication on ``STOCK`` under ``IN_TOPIC``), reads what the target received and injects
into it. Every test runs the instance in the shared in-process gateway
(``tests.support.gateway``) beside an observer instance that records the envelopes it gets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pytest

from gateway.plugin_api import Envelope, PluginContext, PluginInstance, unified_topic
from gateway.wire.folder import Element
from tests.support.gateway import STOCK, InProcessGateway, start_gateway
from tests.support.pubsub_messages import rfh2_message
from tests.support.service_client import put, settle

#: What the instance under test subscribes to (outbound); it covers IN_TOPIC as well, so
#: a publication that came in through the instance would go back out if the engine let it.
OUT_FILTER = unified_topic(STOCK, "contract/#")
#: Topics (within STOCK) of what the instance brings in from its target (inbound).
IN_TOPIC = "contract/in"


@dataclass
class Seen:
    """A publication as the target received it."""

    stream: str
    topic: str
    payload: bytes
    properties: dict[str, str] = field(default_factory=dict)


class PluginDriver(Protocol):
    def instance(self, name: str) -> PluginInstance:
        """A new instance wired to the target (not started)."""
        ...

    async def read_outbound(self, count: int) -> list[Seen]:
        """The next ``count`` publications the target received from the instance, plus
        whatever else arrives shortly after (so an unwanted extra one is seen)."""
        ...

    async def inject(self, topic: str, payload: bytes, properties: dict[str, str]) -> None:
        """Put a message into the target that the instance consumes (``topic`` is the
        MQ topic within STOCK it must arrive on)."""
        ...


class ObserverInstance:
    """A minimal instance recording every envelope the gateway sends it."""

    def __init__(self, name: str = "observer", topic: str = unified_topic(STOCK, "#")) -> None:
        self._name = name
        self.topic = topic
        self.envelopes: list[Envelope] = []
        self.arrived = asyncio.Event()

    @property
    def name(self) -> str:
        return self._name

    async def start(self, context: PluginContext) -> None:
        await context.subscribe(self.topic)

    async def send(self, envelopes: Sequence[Envelope]) -> None:
        self.envelopes.extend(envelopes)
        self.arrived.set()

    async def flush(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def healthy(self) -> bool:
        return True

    async def wait_for(self, count: int, timeout: float = 30) -> list[Envelope]:
        async with asyncio.timeout(timeout):
            while len(self.envelopes) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return self.envelopes


class PluginContract:
    """The contract tests; subclasses provide the ``driver`` fixture."""

    @pytest.fixture
    async def gateway(
        self, driver: PluginDriver, tmp_path: Path
    ) -> AsyncIterator[tuple[InProcessGateway, ObserverInstance]]:
        observer = ObserverInstance()
        gw = await start_gateway(tmp_path, driver.instance("under-test"), observer)
        try:
            yield gw, observer
        finally:
            await gw.close()

    async def test_send_returns_once_the_target_has_the_envelope(
        self, driver: PluginDriver, gateway: tuple[InProcessGateway, ObserverInstance]
    ) -> None:
        gw, _ = gateway
        envelope = Envelope(
            stream=STOCK,
            topic="contract/out/direct",
            payload=b"direct",
            properties={"Colour": "Blue"},
            subscription_stream=STOCK,
            subscription_filter="contract/#",
        )
        await gw.instance.send([envelope])
        [seen] = await driver.read_outbound(1)
        assert (seen.stream, seen.topic, seen.payload) == (STOCK, "contract/out/direct", b"direct")
        assert seen.properties.get("Colour") == "Blue"

    async def test_mq_publication_reaches_the_target_with_stream_topic_and_properties(
        self, driver: PluginDriver, gateway: tuple[InProcessGateway, ObserverInstance]
    ) -> None:
        gw, _ = gateway
        await put(
            gw.qm,
            rfh2_message(
                STOCK,
                [("Command", "Publish"), ("Topic", unified_topic(STOCK, "contract/out/mq"))],
                b"from-mq",
                folders=[Element.from_pairs("usr", {"Colour": "Red"})],
            ),
        )
        [seen] = await driver.read_outbound(1)
        assert (seen.stream, seen.topic, seen.payload) == (STOCK, "contract/out/mq", b"from-mq")
        assert seen.properties.get("Colour") == "Red"
        await settle(gw.qm, gw.service)  # committed only after the target acknowledged

    async def test_send_to_an_unstarted_instance_fails_retriably(
        self, driver: PluginDriver
    ) -> None:
        instance = driver.instance("never-started")
        envelope = Envelope(stream=STOCK, topic="contract/out/early", payload=b"x")
        with pytest.raises(Exception) as info:
            await instance.send([envelope])
        assert getattr(info.value, "retriable", False) is True

    async def test_inbound_carries_stream_topic_properties_and_origin_and_never_loops(
        self, driver: PluginDriver, gateway: tuple[InProcessGateway, ObserverInstance]
    ) -> None:
        gw, observer = gateway
        await driver.inject(f"{IN_TOPIC}/1", b"inbound", {"Colour": "Green"})
        [got] = await observer.wait_for(1)
        assert (got.stream, got.topic, got.payload) == (STOCK, f"{IN_TOPIC}/1", b"inbound")
        assert got.properties.get("Colour") == "Green"
        assert got.origin == "under-test"
        # Published into MQ (committed: the observer got it from the engine), and never
        # sent back to the instance it came from, although its subscription matches.
        await settle(gw.qm, gw.service)
        assert await driver.read_outbound(0) == []
