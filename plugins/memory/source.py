"""Inbound side of the memory plugin: what is injected on the bus is published into MQ,
in batches of one unit of work; each injector learns when its publication committed."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gateway.plugin_api import PluginError, Publisher, PublishRefusedError
from plugins.memory.bus import MemoryBus, Pending

log = logging.getLogger(__name__)


class MemorySource:
    def __init__(self, bus: MemoryBus, publisher: Publisher, batch_size: int) -> None:
        self.bus = bus
        self.publisher = publisher
        self.batch_size = batch_size
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"memory-source:{self.bus.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        inbox = self.bus.inbound_queue()
        while True:
            batch = [await inbox.get()]
            while len(batch) < self.batch_size and not inbox.empty():
                batch.append(inbox.get_nowait())
            await self._publish(batch)

    async def _publish(self, batch: list[Pending]) -> None:
        delay = 0.05
        while batch:
            try:
                await self.publisher.publish([p.publication for p in batch])
            except PublishRefusedError as exc:
                if not 0 <= exc.index < len(batch):
                    _fail(batch, exc)
                    return
                # Only this publication can never be published: refuse it, keep the rest.
                _fail([batch.pop(exc.index)], exc)
                continue
            except PluginError as exc:
                if exc.retriable:
                    log.warning("memory bus %s: publish failed, retrying: %s", self.bus.name, exc)
                    await asyncio.sleep(delay)
                    delay = min(2.0, delay * 2)
                    continue
                _fail(batch, exc)
                return
            except asyncio.CancelledError:
                for p in batch:  # not committed: the injector may retry
                    if not p.done.done():
                        p.done.cancel()
                raise
            except Exception as exc:
                # A bug must neither kill the source task nor leave injectors waiting.
                log.exception("memory bus %s: publish failed", self.bus.name)
                _fail(batch, exc)
                return
            for p in batch:
                if not p.done.done():
                    p.done.set_result(None)
            return


def _fail(batch: list[Pending], exc: BaseException) -> None:
    for p in batch:
        if not p.done.done():
            p.done.set_exception(exc)
