"""Request/reply side of the memory plugin (``Exchanges``): a durable topic log on the
bus, read by named consumers with committed offsets, as a Kafka topic and consumer group
are.

Why a log with offsets rather than queues: it keeps the semantics the runtime relies on
honest — ``produce`` returns once the envelope is on the log (the "broker" has it), a
consumer's offset moves only after its handler returned (an exception or a stop before
that redelivers the batch), and what is produced while no consumer runs is read when it
starts. Tests act as requesters/responders through :class:`ExchangeLog` on the bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from gateway.plugin_api import (
    DeliveryRefusedError,
    Envelope,
    ExchangeHandler,
    PluginError,
    PublishRefusedError,
)

log = logging.getLogger(__name__)

#: MQRC_MSG_TOO_BIG_FOR_Q, as the sink refuses a too large publication.
MSG_TOO_BIG = 2030


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT-style match (``+`` one level, ``#`` the rest); a plain name matches itself,
    so Kafka-like topic names work too."""
    f_parts, t_parts = topic_filter.split("/"), topic.split("/")
    for i, part in enumerate(f_parts):
        if part == "#":
            return True
        if i >= len(t_parts) or (part != "+" and part != t_parts[i]):
            return False
    return len(f_parts) == len(t_parts)


def receive_id(position: int) -> bytes:
    """24 bytes naming the log entry at ``position`` (as Kafka's topic/partition/offset)."""
    return hashlib.sha256(f"memory:{position}".encode()).digest()[:24]


@dataclass
class ExchangeLog:
    """Everything produced on one bus, in order, and each consumer's committed offset."""

    entries: list[Envelope] = field(default_factory=list)
    offsets: dict[str, int] = field(default_factory=dict)
    #: envelopes a consumer's handler refused (PublishRefusedError): the plugin's DLQ
    refused: list[tuple[str, Envelope]] = field(default_factory=list)
    changed: asyncio.Condition | None = None

    def _cond(self) -> asyncio.Condition:
        if self.changed is None:
            self.changed = asyncio.Condition()
        return self.changed

    async def append(self, envelopes: Sequence[Envelope]) -> None:
        """Put envelopes on the log (what a requester/responder outside the gateway does)."""
        cond = self._cond()
        async with cond:
            self.entries.extend(envelopes)
            cond.notify_all()

    def on(self, topic: str) -> list[Envelope]:
        return [e for e in self.entries if topic_matches(topic, e.topic)]

    async def wait_on(self, topic: str, count: int, timeout: float = 10.0) -> list[Envelope]:
        """The envelopes on ``topic`` once there are at least ``count``."""
        cond = self._cond()
        async with asyncio.timeout(timeout), cond:
            await cond.wait_for(lambda: len(self.on(topic)) >= count)
        return self.on(topic)

    async def next_batch(
        self, group: str, sources: Sequence[str], limit: int
    ) -> tuple[list[Envelope], int]:
        """The next envelopes matching ``sources`` after the group's offset, and the
        offset to commit once they are handled. Each carries a ``msg_id`` naming its
        place in the log (:func:`receive_id`) unless it had one: the same entry offered
        again is the same request, two equal entries are two requests."""
        cond = self._cond()
        async with cond:
            while True:
                start = self.offsets.get(group, 0)
                batch: list[Envelope] = []
                end = start
                for i in range(start, len(self.entries)):
                    end = i + 1
                    env = self.entries[i]
                    if any(topic_matches(s, env.topic) for s in sources):
                        batch.append(env if env.msg_id else replace(env, msg_id=receive_id(i)))
                        if len(batch) >= limit:
                            break
                if batch:
                    return batch, end
                self.offsets[group] = end  # skip entries no source matches
                await cond.wait()

    def commit(self, group: str, offset: int) -> None:
        self.offsets[group] = max(self.offsets.get(group, 0), offset)


class MemoryExchanges:
    """``consume``/``produce`` of one memory instance over its bus's :class:`ExchangeLog`."""

    def __init__(
        self,
        log_: ExchangeLog,
        is_down: Callable[[], bool],
        refuse_larger_than: int | None,
        batch_size: int,
    ) -> None:
        self.log = log_
        self._is_down = is_down
        self.refuse_larger_than = refuse_larger_than
        self.batch_size = batch_size
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def consume(
        self, route: str, sources: Sequence[str], handler: ExchangeHandler
    ) -> None:
        task = self._tasks.get(route)
        if task is not None and not task.done():
            return
        self._tasks[route] = asyncio.create_task(
            self._run(route, list(sources), handler), name=f"memory-exchange:{route}"
        )

    async def _run(self, group: str, sources: list[str], handler: ExchangeHandler) -> None:
        delay = 0.05
        while True:
            batch, end = await self.log.next_batch(group, sources, self.batch_size)
            try:
                await handler(batch)
            except PublishRefusedError as exc:
                if 0 <= exc.index < len(batch):
                    entry = self._entry_of(group, batch[exc.index])
                    self.log.refused.append((group, entry))
                    # those before it were handled, the refused one is acknowledged
                    self.log.commit(group, self._offset_after(group, entry))
                else:
                    log.error("exchange %s: refusal with bad index %d", group, exc.index)
                continue
            except PluginError as exc:
                if exc.retriable:
                    log.warning("exchange %s: handler failed, offering again: %s", group, exc)
                    await asyncio.sleep(delay)
                    delay = min(2.0, delay * 2)
                    continue
                log.error("exchange %s: handler refused the batch for good: %s", group, exc)
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)
                continue
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("exchange %s: handler failed (unexpected); offering again", group)
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)
                continue
            delay = 0.05
            self.log.commit(group, end)

    def _entry_of(self, group: str, env: Envelope) -> Envelope:
        """The log entry ``env`` was offered for (it may carry an added msg_id)."""
        start = self.log.offsets.get(group, 0)
        for i in range(start, len(self.log.entries)):
            entry = self.log.entries[i]
            if entry is env or (not entry.msg_id and env.msg_id == receive_id(i)):
                return entry
        return env

    def _offset_after(self, group: str, env: Envelope) -> int:
        start = self.log.offsets.get(group, 0)
        for i in range(start, len(self.log.entries)):
            if self.log.entries[i] is env:
                return i + 1
        return start

    async def produce(self, envelopes: Sequence[Envelope]) -> None:
        if self._is_down():
            raise PluginError("memory bus is down", retriable=True)
        limit = self.refuse_larger_than
        if limit is not None:
            for i, env in enumerate(envelopes):
                if len(env.payload) > limit:
                    raise DeliveryRefusedError(
                        f"payload of {len(env.payload)} bytes is over {limit}",
                        index=i,
                        reason=MSG_TOO_BIG,
                    )
        await self.log.append(envelopes)

    async def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
