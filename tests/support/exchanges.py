"""A memory plugin instance started for request/reply tests without a whole gateway: its
``Exchanges`` side needs no broker service, so a context that refuses publications is
enough (the instance subscribes to nothing)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.plugin_api import InboundPublication, PluginError, Publisher, Scheme
from plugins.memory import MemoryConfig, MemoryInstance


class _NoPublisher:
    async def publish(self, publications: Sequence[InboundPublication]) -> None:
        raise PluginError("no broker in this test", retriable=False)


class ExchangeOnlyContext:
    """A PluginContext with no broker behind it."""

    def __init__(self, gateway_id: str = "test") -> None:
        self._gateway_id = gateway_id
        self._publisher: Publisher = _NoPublisher()

    @property
    def gateway_id(self) -> str:
        return self._gateway_id

    @property
    def publisher(self) -> Publisher:
        return self._publisher

    async def subscribe(self, topic: str, *, scheme: Scheme = Scheme.TOPIC) -> None:
        raise PluginError("no broker in this test", retriable=False)

    async def unsubscribe(self, topic: str, *, scheme: Scheme = Scheme.TOPIC) -> bool:
        return False


async def started_memory(name: str, bus: str, **config: object) -> MemoryInstance:
    """A started memory instance on ``bus`` (subscribing to nothing)."""
    inst = MemoryInstance(name, MemoryConfig(bus=bus, **config))  # type: ignore[arg-type]
    await inst.start(ExchangeOnlyContext())
    return inst
