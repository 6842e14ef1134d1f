"""The ``mqtt`` plugin: MQ publish/subscribe streams ↔ an MQTT 5 / 3.1.1 broker.

The entry point ``mqtt = "plugins.mqtt:plugin"`` names :data:`plugin`. See
docs/mqtt-plugin.md for the configuration, the topic mapping and the guarantees.
"""

from __future__ import annotations

from pydantic import BaseModel

from plugins.mqtt.config import MqttConfig
from plugins.mqtt.instance import MqttInstance

__all__ = ["MqttConfig", "MqttInstance", "MqttPlugin", "plugin"]


class MqttPlugin:
    """Implements :class:`gateway.plugin_api.Plugin`."""

    @property
    def name(self) -> str:
        return "mqtt"

    @property
    def config_model(self) -> type[BaseModel]:
        return MqttConfig

    def create(self, instance_name: str, config: BaseModel) -> MqttInstance:
        if not isinstance(config, MqttConfig):
            config = MqttConfig.model_validate(config.model_dump())
        return MqttInstance(instance_name, config)


plugin = MqttPlugin()
