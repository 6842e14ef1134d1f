"""The plugin object, its entry point, start-up errors and QoS 2 outbound."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest

from gateway.devstack import MosquittoBroker
from gateway.devstack.ports import free_port
from gateway.plugin_api import Plugin, PluginError, PluginInstance
from plugins.mqtt import MqttConfig, plugin
from tests.plugins.mqtt.mqtt_harness import (
    STOCK,
    client,
    collect,
    publish_rfh,
    start_gateway,
    unique,
)


def test_entry_point_names_the_plugin() -> None:
    (ep,) = [e for e in entry_points(group="mqgw.plugins") if e.name == "mqtt"]
    loaded = ep.load()
    assert loaded is plugin
    assert isinstance(loaded, Plugin)
    assert loaded.config_model is MqttConfig
    instance = loaded.create("m1", MqttConfig())
    assert isinstance(instance, PluginInstance)
    assert instance.name == "m1"
    assert not instance.healthy()


async def test_unreachable_broker_fails_start_with_a_clear_error(tmp_path: Path) -> None:
    cfg = MqttConfig(port=free_port(), connect_timeout=2)
    with pytest.raises(PluginError, match=r"cannot connect to 127\.0\.0\.1:\d+") as info:
        await start_gateway(tmp_path, cfg)
    assert info.value.retriable


@pytest.mark.mqtt
async def test_qos2_outbound_returns_after_pubcomp(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    prefix = unique("q2")
    cfg = MqttConfig.model_validate(
        {
            "host": mqtt_broker.host,
            "port": mqtt_broker.port,
            "client_id": unique("gw-"),
            "outbound": {
                "prefix": prefix,
                "topics": [f"$SYS/STREAM/{STOCK}/#"],
                "qos_persistent": 2,
            },
        }
    )
    gw = await start_gateway(tmp_path, cfg)
    try:
        assert gw.instance.healthy()
        async with client(mqtt_broker.host, mqtt_broker.port) as sub:
            await sub.subscribe(f"{prefix}/#", qos=2)
            for i in range(20):
                await publish_rfh(gw.qm, STOCK, "x", str(i).encode())
            got = await collect(sub, 20)
        sink = gw.instance.sink
        assert sink is not None and sink.counters.published == 20
    finally:
        await gw.close()
    assert [(m.qos, int(m.payload)) for m in got] == [(2, i) for i in range(20)]  # type: ignore[arg-type]
