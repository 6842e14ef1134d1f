"""A reply topic is refused when it is any Kafka (or MQTT) instance's own, not only the
requester route's instance: two instances may write one cluster or broker (issue 29)."""

from __future__ import annotations

from pathlib import Path

from gateway.runtime.app import _own_topics
from gateway.runtime.config import parse_config
from gateway.runtime.registry import PluginRegistry


def test_every_instance_of_the_plugin_is_asked(tmp_path: Path) -> None:
    registry = PluginRegistry.from_entry_points()
    loaded = parse_config(
        {
            "queue_manager": {"name": "QM1", "data_dir": "qm"},
            "metrics": {"enabled": False},
            "broker": {"streams": [{"name": "S1"}, {"name": "S2"}]},
            "plugins": [
                {"name": "k1", "plugin": "kafka", "config": {
                    "outbound": {"routes": [{"stream": "S1", "kafka_topic": "one.{stream}"}]}}},
                {"name": "k2", "plugin": "kafka", "config": {
                    "outbound": {"routes": [{"stream": "S2", "kafka_topic": "two.{stream}"}]}}},
                {"name": "m1", "plugin": "mqtt", "config": {"outbound": {"prefix": "mq"}}},
            ],
        },
        registry,
        base_dir=tmp_path,
    )
    instances = [
        registry.get(p.plugin).create(p.name, loaded.plugin_configs[p.name])
        for p in loaded.gateway.plugins
    ]
    own = _own_topics(instances, loaded.gateway)
    assert own("k1", "one.S1")
    assert "plugin instance 'k2'" in own("k1", "two.S2")  # the other instance's topic
    assert own("k1", "replies.x") == ""
    assert own("k1", "mq/S1/x") == ""  # an MQTT name is not a Kafka instance's
    assert own("m1", "mq/S1/x")
