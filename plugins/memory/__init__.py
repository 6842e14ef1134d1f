"""The ``memory`` plugin: an in-process bus standing in for a remote broker.

It implements ``Exchanges`` (request/reply, plugins/memory/exchange.py) too.

A real plugin with both directions (outbound records, inbound injection, outage
simulation) used as the fake in tests, by the plugin contract suite and for trying a
configuration without Kafka or MQTT. Its bus is reached with
:func:`plugins.memory.bus.get_bus`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from gateway.plugin_api import (
    Envelope,
    ExchangeHandler,
    PluginContext,
    PluginError,
    RouteTarget,
    Scheme,
    split_unified_topic,
)
from plugins.memory.bus import MemoryBus, get_bus, reset_buses
from plugins.memory.config import MemoryConfig
from plugins.memory.exchange import ExchangeLog, MemoryExchanges
from plugins.memory.mapping import Record
from plugins.memory.sink import MemorySink
from plugins.memory.source import MemorySource

__all__ = [
    "ExchangeLog",
    "MemoryBus",
    "MemoryConfig",
    "MemoryInstance",
    "Record",
    "get_bus",
    "plugin",
    "reset_buses",
]


class MemoryInstance:
    """One configured ``memory`` instance."""

    def __init__(self, name: str, config: MemoryConfig) -> None:
        self._name = name
        self.config = config
        self.bus = get_bus(config.bus)
        self._sink = MemorySink(self.bus, config.record_file, config.refuse_larger_than)
        self._source: MemorySource | None = None
        self._exchanges = MemoryExchanges(
            self.bus.exchanges, lambda: self.bus.down, config.refuse_larger_than, config.batch_size
        )
        #: Set at the start of start(): subscribing already sends retained publications.
        self._started = False

    @property
    def name(self) -> str:
        return self._name

    def planned_subscriptions(self) -> list[tuple[str, Scheme]]:
        """What start() subscribes, for the runtime to register before the first get
        (``DeclaresSubscriptions``)."""
        return [(topic, Scheme.TOPIC) for topic in self.config.subscribe]

    def route_targets(self) -> list[RouteTarget]:
        """Each subscription's stream, towards the in-process bus (``DescribesRoutes``,
        for the dashboard); anything injected may enter any stream, so no ``in``."""
        out: list[RouteTarget] = []
        for topic in self.config.subscribe:
            stream, within = split_unified_topic(topic)
            out.append(RouteTarget("out", stream, f"bus {self.config.bus}: {within}"))
        return out

    async def start(self, context: PluginContext) -> None:
        self._started = True
        for topic in self.config.subscribe:
            await context.subscribe(topic)
        self._source = MemorySource(self.bus, context.publisher, self.config.batch_size)
        self._source.start()

    async def send(self, envelopes: Sequence[Envelope]) -> None:
        if not self._started:
            # The plugin contract: a send before start (or after stop) fails retriably.
            raise PluginError(f"memory instance {self._name!r} is not started", retriable=True)
        await self._sink.send(envelopes)

    async def flush(self) -> None:
        return None  # send() returns only once recorded: nothing is in flight

    async def consume(self, route: str, sources: Sequence[str], handler: ExchangeHandler) -> None:
        """``Exchanges``: read ``sources`` on the bus's exchange log as consumer ``route``."""
        await self._exchanges.consume(route, sources, handler)

    async def produce(self, envelopes: Sequence[Envelope]) -> None:
        """``Exchanges``: returns once the envelopes are on the bus's exchange log."""
        if not self._started:
            raise PluginError(f"memory instance {self._name!r} is not started", retriable=True)
        await self._exchanges.produce(envelopes)

    async def stop(self) -> None:
        self._started = False
        await self._exchanges.stop()
        if self._source is not None:
            await self._source.stop()
            self._source = None

    def healthy(self) -> bool:
        return self._source is not None and not self.bus.down


class MemoryPlugin:
    name = "memory"
    config_model: type[BaseModel] = MemoryConfig

    def create(self, instance_name: str, config: BaseModel) -> MemoryInstance:
        if not isinstance(config, MemoryConfig):
            raise PluginError(f"memory plugin got a {type(config).__name__}, not MemoryConfig")
        return MemoryInstance(instance_name, config)


plugin = MemoryPlugin()
