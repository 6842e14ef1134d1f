"""The plugin contract suite (``tests/plugins/contract.py``) against the mqtt plugin and
the real Mosquitto broker."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gateway.devstack import MosquittoBroker
from plugins.mqtt import MqttConfig, MqttInstance, plugin
from tests.plugins.contract import OUT_FILTER, PluginContract, Seen
from tests.plugins.mqtt.mqtt_harness import client, collect, user_props
from tests.support.gateway import STOCK
from tests.support.names import unique

pytestmark = [pytest.mark.mqtt]


class MqttDriver:
    """Mosquitto is the target: the instance publishes under ``<base>-out`` and consumes
    ``<base>/#``; a plain client watches the one and publishes to the other."""

    def __init__(self, broker: MosquittoBroker, watcher: aiomqtt.Client) -> None:
        self.broker = broker
        self.base = unique("contract")
        self.watcher = watcher

    def instance(self, name: str) -> MqttInstance:
        config = MqttConfig.model_validate(
            {
                "host": self.broker.host,
                "port": self.broker.port,
                "protocol": "5",
                "client_id": unique("gw-"),
                "outbound": {"topics": [OUT_FILTER], "prefix": f"{self.base}-out"},
                "inbound": {
                    "filters": [
                        {
                            "filter": f"{self.base}/#",
                            "strip_prefix": f"{self.base}/",
                            "stream": STOCK,
                        }
                    ]
                },
            }
        )
        instance = plugin.create(name, config)
        assert isinstance(instance, MqttInstance)
        return instance

    async def read_outbound(self, count: int) -> list[Seen]:
        messages = await collect(self.watcher, count, quiet=0.5 if count else 2.0)
        out: list[Seen] = []
        for m in messages:
            # <base>-out/<stream>/<topic within the stream> (docs/mqtt-plugin.md)
            _, stream, topic = str(m.topic).split("/", 2)
            out.append(Seen(stream, topic, bytes(m.payload), dict(user_props(m))))  # type: ignore[arg-type]
        return out

    async def inject(self, topic: str, payload: bytes, properties: dict[str, str]) -> None:
        p = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        p.UserProperty = list(properties.items())
        async with client(self.broker.host, self.broker.port) as pub:
            await pub.publish(f"{self.base}/{topic}", payload, qos=1, properties=p)


class TestMqttContract(PluginContract):
    @pytest.fixture
    async def driver(self, mqtt_broker: MosquittoBroker) -> AsyncIterator[MqttDriver]:
        async with contextlib.AsyncExitStack() as stack:
            watcher = await stack.enter_async_context(client(mqtt_broker.host, mqtt_broker.port))
            driver = MqttDriver(mqtt_broker, watcher)
            await watcher.subscribe(f"{driver.base}-out/#", qos=1)
            yield driver
