"""Plugin discovery: entry points of the ``mqgw.plugins`` group, lazy loading, clear
errors — and a third-party plugin, defined here and installed as a distribution on
``sys.path``, running in the gateway without any change to ``gateway/``."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from gateway.mq.port import GetOptions, OpenOption, PutOptions
from gateway.plugin_api import Plugin
from gateway.runtime.app import GatewayApp
from gateway.runtime.config import parse_config
from gateway.runtime.errors import ConfigErrors, PluginLoadError
from gateway.runtime.registry import PluginRegistry
from gateway.wire.constants import MsgType
from gateway.wire.rfh2 import decode_rfh2
from tests.support.pubsub_messages import CONTROL, rfh2_message, rfh_message

THIRD_PARTY = '''
"""A plugin from another distribution: it records what it gets and can publish."""
from pydantic import BaseModel

from gateway.plugin_api import InboundPublication, unified_topic


class EchoConfig(BaseModel):
    topic: str
    greeting: str = "hello"


RECEIVED = []
INSTANCES = []


class EchoInstance:
    def __init__(self, name, config):
        self._name = name
        self.config = config
        self.context = None
        INSTANCES.append(self)

    @property
    def name(self):
        return self._name

    async def start(self, context):
        self.context = context
        await context.subscribe(self.config.topic)

    async def send(self, deliveries):
        RECEIVED.extend((d.stream, unified_topic(d.stream, d.topic), d.payload) for d in deliveries)

    async def flush(self):
        pass

    async def stop(self):
        pass

    def healthy(self):
        return self.context is not None

    async def greet(self):
        await self.context.publisher.publish(
            [InboundPublication("STOCK.STREAM", "Greetings", self.config.greeting.encode())]
        )


class EchoPlugin:
    name = "echo"
    config_model = EchoConfig

    def create(self, instance_name, config):
        return EchoInstance(instance_name, config)


plugin = EchoPlugin()
'''


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    """Install ``mqgw_echo`` as a distribution whose entry point is ``echo``."""
    site = tmp_path / "site"
    (site / "mqgw_echo").mkdir(parents=True)
    (site / "mqgw_echo" / "__init__.py").write_text(THIRD_PARTY)
    info = site / "mqgw_echo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mqgw-echo\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent(
            """\
            [mqgw.plugins]
            echo = mqgw_echo:plugin
            """
        )
    )
    monkeypatch.syspath_prepend(str(site))
    yield
    sys.modules.pop("mqgw_echo", None)


def test_shipped_plugins_are_found_by_entry_point() -> None:
    registry = PluginRegistry.from_entry_points()
    assert {"kafka", "mqtt", "memory"} <= set(registry.names())
    memory = registry.get("memory")
    assert isinstance(memory, Plugin)
    assert memory.name == "memory"


def test_loading_is_lazy_and_cached() -> None:
    calls: list[int] = []

    def load() -> Plugin:
        calls.append(1)
        from plugins.memory import plugin

        return plugin

    registry = PluginRegistry({"mem": load})
    assert calls == []  # nothing loaded until asked
    assert registry.get("mem") is registry.get("mem")
    assert calls == [1]


def test_unknown_plugin_names_the_installed_ones() -> None:
    registry = PluginRegistry.from_entry_points()
    with pytest.raises(PluginLoadError, match=r"'kafak'.*installed: .*kafka"):
        registry.get("kafak")


def test_object_without_the_protocol_is_refused() -> None:
    registry = PluginRegistry({"bad": lambda: object()})  # type: ignore[dict-item]
    with pytest.raises(PluginLoadError, match="lacks the Plugin protocol"):
        registry.get("bad")


def test_import_failure_is_reported_as_load_error() -> None:
    def broken() -> Plugin:
        raise ImportError("no module named 'confluent_kafka'")

    with pytest.raises(PluginLoadError, match=r"failed to load.*confluent_kafka"):
        PluginRegistry({"broken": broken}).get("broken")


def test_config_section_is_validated_by_the_third_party_model(third_party: object) -> None:
    registry = PluginRegistry.from_entry_points()
    assert "echo" in registry.names()
    data = {"plugins": [{"name": "e1", "plugin": "echo", "config": {"greeting": "hi"}}]}
    with pytest.raises(ConfigErrors) as info:
        parse_config(data, registry)
    [err] = info.value.errors
    assert err.key == "plugins[0].config.topic"
    assert "add it" in str(err)


async def test_third_party_plugin_runs_in_the_gateway(third_party: object, tmp_path: Path) -> None:
    registry = PluginRegistry.from_entry_points()
    (tmp_path / "queues.mqsc").write_text("DEFINE QLOCAL(ECHO.SUB) REPLACE\n")
    data = {
        "queue_manager": {"data_dir": "qm", "mqsc_file": "queues.mqsc"},
        "broker": {
            "store": str(tmp_path / "ps.db"),
            "streams": [{"name": "STOCK.STREAM"}],
            "wait_ms": 50,
        },
        "metrics": {"enabled": False},
        "plugins": [
            {"name": "e1", "plugin": "echo", "config": {"topic": "$SYS/STREAM/STOCK.STREAM/#"}}
        ],
    }
    app = GatewayApp(parse_config(data, registry, base_dir=tmp_path), registry)
    await app.start()
    try:
        import mqgw_echo  # the module the entry point loaded

        async with asyncio.timeout(10):
            while not app.health()[0]:
                await asyncio.sleep(0.02)
        assert app.qm is not None
        conn = await app.qm.connect()
        setup = [
            rfh_message(  # a legacy MQRFH publisher on STOCK.STREAM, explicit stream name
                "STOCK.STREAM",
                [
                    ("MQPSCommand", "Publish"),
                    ("MQPSStreamName", "STOCK.STREAM"),
                    ("MQPSTopic", "IBM/Latest"),
                ],
                b"141",
            ),
            rfh2_message(  # a legacy MQRFH2 subscriber of the stream
                CONTROL,
                [
                    ("Command", "RegSub"),
                    ("Topic", "$SYS/STREAM/STOCK.STREAM/Greetings"),
                    ("QName", "ECHO.SUB"),
                ],
                msg_type=MsgType.DATAGRAM,
            ),
        ]
        for m in setup:
            await conn.put1(m.queue, m.md, m.body, PutOptions())
        async with asyncio.timeout(10):
            while not mqgw_echo.RECEIVED:
                await asyncio.sleep(0.02)
        assert mqgw_echo.RECEIVED == [
            ("STOCK.STREAM", "$SYS/STREAM/STOCK.STREAM/IBM/Latest", b"141")
        ]
        # give the RegSub time to be served, then the plugin publishes inbound
        async with asyncio.timeout(10):
            while not any(s.destination.queue for s in app.service.engine.subscriptions):  # type: ignore[union-attr]
                await asyncio.sleep(0.02)
        await mqgw_echo.INSTANCES[-1].greet()
        handle = await conn.open("ECHO.SUB", OpenOption.INPUT_SHARED)
        got = await handle.get(GetOptions(wait_ms=5000))
        rfh2, used = decode_rfh2(got.body, got.md.encoding)
        assert rfh2.get("psc", "Topic") == "$SYS/STREAM/STOCK.STREAM/Greetings"
        assert got.body[used:] == b"hello"
        await handle.close()
        await conn.disconnect()
    finally:
        await app.shutdown()
