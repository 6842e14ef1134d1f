"""One configured ``mqtt`` plugin instance: a connection, its sink and its source."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict

from gateway.plugin_api import Envelope, PluginContext, PluginError, Scheme
from plugins.mqtt.config import MqttConfig
from plugins.mqtt.connection import MqttConnection, MqttConnectionError, Received
from plugins.mqtt.mapping import echo_filters
from plugins.mqtt.sink import MqttSink
from plugins.mqtt.source import MqttSource

log = logging.getLogger(__name__)


def default_client_id(gateway_id: str, instance_name: str) -> str:
    """Stable across restarts, unique per gateway and instance (persistent session)."""
    return f"mqgw-{gateway_id}-{instance_name}"


class MqttInstance:
    """Implements :class:`gateway.plugin_api.PluginInstance` for MQTT."""

    def __init__(self, name: str, config: MqttConfig) -> None:
        self._name = name
        self.config = config
        self.connection: MqttConnection | None = None
        self.sink: MqttSink | None = None
        self.source: MqttSource | None = None

    @property
    def name(self) -> str:
        return self._name

    def check_config(self) -> None:
        """Refuse what cannot work, naming the key and the fix."""
        cfg = self.config
        if cfg.protocol == "3.1.1" and cfg.outbound.topics and not cfg.allow_echo:
            echoing = echo_filters(cfg.inbound.filters, cfg.outbound.prefix)
            if echoing:
                raise PluginError(
                    f"mqtt instance {self._name!r}: inbound.filters {list(echoing)} match the "
                    f"outbound topics under prefix {cfg.outbound.prefix!r}; MQTT 3.1.1 has no "
                    "No Local option, so every forwarded publication would come back into MQ. "
                    "Fix: narrow the filters, change outbound.prefix, use protocol '5', or set "
                    "allow_echo: true"
                )

    def planned_subscriptions(self) -> list[tuple[str, Scheme]]:
        """The outbound topics (what start() subscribes), for the runtime to register
        before the first get (``DeclaresSubscriptions``)."""
        return [(topic, Scheme.TOPIC) for topic in self.config.outbound.topics]

    async def start(self, context: PluginContext) -> None:
        self.check_config()
        cfg = self.config
        client_id = cfg.client_id or default_client_id(context.gateway_id, self._name)
        self.source = None
        connection = MqttConnection(
            cfg, client_id, on_message=self._on_message, subscriptions=self._subscriptions
        )
        self.source = MqttSource(cfg.inbound, connection, context.publisher, self._name)
        try:
            await connection.start()
        except MqttConnectionError as exc:
            await connection.close()
            raise PluginError(
                f"mqtt instance {self._name!r}: {exc} (check host/port/credentials/ACLs "
                f"under plugins.{self._name}.config)",
                retriable=exc.reason == 0,
            ) from exc
        except BaseException:
            await connection.close()
            raise
        try:
            self.connection = connection
            self.sink = MqttSink(cfg.outbound, connection)
            for topic in cfg.outbound.topics:
                await context.subscribe(topic)
            self.source.start()
        except BaseException:
            # Never leave a connected client (socket, tasks) behind a failed start.
            self.sink = None
            self.connection = None
            await connection.close()
            raise

    def _subscriptions(self) -> list[tuple[str, int]]:
        return self.source.subscriptions() if self.source is not None else []

    def _on_message(self, received: Received) -> None:
        if self.source is not None:
            self.source.on_message(received)

    async def send(self, envelopes: Sequence[Envelope]) -> None:
        if self.sink is None:
            raise PluginError(f"mqtt instance {self._name!r} is not started", retriable=True)
        try:
            await self.sink.send(envelopes)
        except MqttConnectionError as exc:
            # Transient: the broker service holds the MQ unit of work and retries.
            raise PluginError(f"mqtt instance {self._name!r}: {exc}", retriable=True) from exc

    async def flush(self) -> None:
        """Nothing to do: ``send`` returns only once the broker acknowledged."""

    async def stop(self) -> None:
        if self.source is not None:
            await self.source.stop()
        if self.connection is not None:
            await self.connection.close()
        self.sink = None

    def stats(self) -> dict[str, int]:
        """Counters for metrics (``outbound_*`` from the sink, ``inbound_*`` from the
        source); no per-message logging happens anywhere."""
        out: dict[str, int] = {}
        if self.sink is not None:
            for key, value in asdict(self.sink.counters).items():
                out[f"outbound_{key}"] = value
        if self.source is not None:
            for key, value in asdict(self.source.counters).items():
                out[f"inbound_{key}"] = value
        out["connected"] = int(self.connection is not None and self.connection.connected)
        return out

    def healthy(self) -> bool:
        conn = self.connection
        return (
            conn is not None
            and conn.connected
            and not (self.source is not None and self.source.stalled)
        )
