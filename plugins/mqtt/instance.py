"""One configured ``mqtt`` plugin instance: a connection, its sink, its source and its
request/reply exchanges."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import asdict

from gateway.plugin_api import (
    DEFAULT_STREAM,
    Envelope,
    ExchangeHandler,
    PluginContext,
    PluginError,
    RouteTarget,
    Scheme,
    split_unified_topic,
)
from plugins.mqtt.config import MqttConfig
from plugins.mqtt.connection import MqttConnection, MqttConnectionError, Received
from plugins.mqtt.exchange import MqttExchanges
from plugins.mqtt.mapping import echo_filters, escape_topic_text
from plugins.mqtt.namespace import MqttNamespace
from plugins.mqtt.sink import MqttSink
from plugins.mqtt.source import MqttSource, find_filter

log = logging.getLogger(__name__)


def default_client_id(gateway_id: str, instance_name: str) -> str:
    """Stable across restarts, unique per gateway and instance (persistent session)."""
    return f"mqgw-{gateway_id}-{instance_name}"


#: Seconds after start during which a message that matches neither an inbound filter
#: nor a registered exchange source is held (unacknowledged) for a route the runtime has
#: yet to register: the persistent session hands over queued requests right behind the
#: CONNACK, before ``consume`` is called. Unclaimed after that: the source's rule.
CLAIM_GRACE = 5.0


#: Which keys to look at, by :attr:`MqttConnectionError.kind`.
_HINTS = {
    "tls": "tls (ca_file, cert_file, key_file) and host",
    "auth": "username/password",
    "refused": "client_id/protocol and the broker's ACLs",
}


class MqttInstance:
    """Implements :class:`gateway.plugin_api.PluginInstance` for MQTT (and
    ``OwnsTopics``: the topics it keeps for itself, plugins.mqtt.namespace)."""

    def __init__(self, name: str, config: MqttConfig) -> None:
        self._name = name
        self.config = config
        self.namespace = MqttNamespace(config, name)
        self.connection: MqttConnection | None = None
        self.sink: MqttSink | None = None
        self.source: MqttSource | None = None
        self.exchanges: MqttExchanges | None = None
        self._held: list[Received] = []
        self._hold_until = 0.0
        self._release: asyncio.TimerHandle | None = None
        #: failed connection attempts by kind (tls, auth, connect, refused), for metrics:
        #: kept across start retries so a wrong CA or password shows as a rising count.
        self.failures: dict[str, int] = {"tls": 0, "auth": 0, "connect": 0, "refused": 0}

    @property
    def name(self) -> str:
        return self._name

    def own_topic(self, topic: str) -> str:
        """Why ``topic`` is one of this instance's own topics, "" when it is not
        (``OwnsTopics``: the runtime publishes no reply there)."""
        return self.namespace.own_topic(topic)

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

    def route_targets(self) -> list[RouteTarget]:
        """Each outbound topic's MQTT name and each inbound filter's stream
        (``DescribesRoutes``, for the dashboard)."""
        ob = self.config.outbound
        out: list[RouteTarget] = []
        for topic in ob.topics:
            stream, within = split_unified_topic(topic)
            level = (
                ob.default_stream_level
                if stream == DEFAULT_STREAM
                else escape_topic_text(ob.stream_levels.get(stream, stream))
            )
            name = "/".join(part for part in (ob.prefix, level, within) if part)
            out.append(RouteTarget("out", stream, name))
        out += [RouteTarget("in", f.stream, f.filter) for f in self.config.inbound.filters]
        return out

    async def start(self, context: PluginContext) -> None:
        self.check_config()
        cfg = self.config
        client_id = cfg.client_id or default_client_id(context.gateway_id, self._name)
        self.source = None
        connection = MqttConnection(
            cfg,
            client_id,
            on_message=self._on_message,
            subscriptions=self._subscriptions,
            name=self._name,
            on_failure=self._count_failure,
        )
        self.source = MqttSource(
            cfg.inbound, connection, context.publisher, self._name, gateway_id=context.gateway_id
        )
        self.exchanges = MqttExchanges(
            connection,
            origin=self._name,
            dead_letter_topic=cfg.inbound.dead_letter_topic,
            ack_timeout=cfg.outbound.ack_timeout,
            gateway_id=context.gateway_id,
        )
        loop = asyncio.get_running_loop()
        self._held = []
        self._hold_until = loop.time() + CLAIM_GRACE
        self._release = loop.call_later(CLAIM_GRACE, self._release_held)
        try:
            await connection.start()
        except MqttConnectionError as exc:
            self._cancel_release()
            await connection.close()
            keys = _HINTS.get(exc.kind, "host/port/credentials/ACLs")
            raise PluginError(
                f"mqtt plugin {self._name!r}: {exc} (check {keys} under "
                f"plugins.{self._name}.config)",
                retriable=exc.retriable,
            ) from None
        except BaseException:
            self._cancel_release()
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
            self._cancel_release()
            await connection.close()
            raise

    def _count_failure(self, exc: MqttConnectionError) -> None:
        self.failures[exc.kind] = self.failures.get(exc.kind, 0) + 1

    def _cancel_release(self) -> None:
        if self._release is not None:
            self._release.cancel()
            self._release = None
        self._held = []

    def _subscriptions(self) -> list[tuple[str, int]]:
        subs = self.source.subscriptions() if self.source is not None else []
        if self.exchanges is not None:
            subs.extend(self.exchanges.subscriptions())
        return subs

    def _on_message(self, received: Received) -> None:
        """An exchange source wins over an inbound filter matching the same topic (a
        message goes to one of them, never both)."""
        if self.exchanges is not None and self.exchanges.offer(received):
            return
        if self.source is None:
            return
        loop = asyncio.get_running_loop()
        if (
            find_filter(received.message.topic, self.source.config.filters) is None
            and loop.time() < self._hold_until
        ):
            self._held.append(received)
            return
        self.source.on_message(received)

    def _release_held(self) -> None:
        held, self._held = self._held, []
        self._hold_until = 0.0
        for received in held:
            self._on_message(received)

    async def consume(self, route: str, sources: Sequence[str], handler: ExchangeHandler) -> None:
        """:meth:`gateway.plugin_api.Exchanges.consume` (module plugins.mqtt.exchange)."""
        if self.exchanges is None or self.connection is None:
            raise PluginError(f"mqtt instance {self._name!r} is not started", retriable=True)
        await self.exchanges.consume(route, sources, handler)
        held, self._held = self._held, []
        for received in held:
            if not self.exchanges.offer(received):
                self._held.append(received)

    async def produce(self, envelopes: Sequence[Envelope]) -> None:
        """:meth:`gateway.plugin_api.Exchanges.produce`: QoS 1, returns after PUBACKs."""
        if self.exchanges is None or self.connection is None:
            raise PluginError(f"mqtt instance {self._name!r} is not started", retriable=True)
        await self.exchanges.produce(envelopes)

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
        self._cancel_release()  # held messages stay unacknowledged: redelivered
        if self.exchanges is not None:
            await self.exchanges.stop()
        if self.source is not None:
            await self.source.stop()
        if self.connection is not None:
            await self.connection.close()
        self.sink = None
        self.exchanges = None

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
        if self.exchanges is not None:
            for key, value in asdict(self.exchanges.counters).items():
                out[f"exchange_{key}"] = value
        out["connected"] = int(self.connection is not None and self.connection.connected)
        for kind, n in self.failures.items():
            out[f"{kind}_failures"] = n
        return out

    def healthy(self) -> bool:
        conn = self.connection
        return (
            conn is not None
            and conn.connected
            and not (self.source is not None and self.source.stalled)
        )
