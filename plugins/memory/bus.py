"""The in-process bus a ``memory`` instance talks to: the stand-in for a remote broker.

Tests and the demo reach it by name (:func:`get_bus`): they read what arrived
(``records``), inject inbound publications (:meth:`MemoryBus.inject`, which resolves once
the MQ unit of work carrying them committed) and simulate an outage (``down``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway.plugin_api import Envelope
from plugins.memory.exchange import ExchangeLog
from plugins.memory.mapping import Record


@dataclass(slots=True)
class Pending:
    publication: Envelope
    done: asyncio.Future[None]


@dataclass
class MemoryBus:
    name: str
    records: list[Record] = field(default_factory=list)
    #: While True, outbound sends fail retriably (the "broker" is unreachable).
    down: bool = False
    #: Outbound sends attempted while down (to observe back-pressure).
    refused_sends: int = 0
    inbox: asyncio.Queue[Pending] | None = None
    changed: asyncio.Event | None = None
    #: request/reply traffic (``Exchanges``): a durable log with consumer offsets
    exchanges: ExchangeLog = field(default_factory=ExchangeLog)

    def inbound_queue(self) -> asyncio.Queue[Pending]:
        if self.inbox is None:
            self.inbox = asyncio.Queue()
        return self.inbox

    def _event(self) -> asyncio.Event:
        if self.changed is None:
            self.changed = asyncio.Event()
        return self.changed

    def record(self, items: list[Record]) -> None:
        self.records.extend(items)
        self._event().set()

    def inject(self, publication: Envelope) -> asyncio.Future[None]:
        """Queue an inbound publication; the future resolves after its MQ commit."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.inbound_queue().put_nowait(Pending(publication, fut))
        return fut

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[Record]:
        """Wait until at least ``count`` records arrived; TimeoutError otherwise."""
        async with asyncio.timeout(timeout):
            while len(self.records) < count:
                ev = self._event()
                ev.clear()
                await ev.wait()
        return list(self.records)


_BUSES: dict[str, MemoryBus] = {}


def get_bus(name: str = "default") -> MemoryBus:
    bus = _BUSES.get(name)
    if bus is None:
        bus = _BUSES[name] = MemoryBus(name)
    return bus


def reset_buses() -> None:
    """Forget every bus (tests call this between cases)."""
    _BUSES.clear()
