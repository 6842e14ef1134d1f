"""Inbound: MQTT messages → MQ publications (the instance's source half).

Received messages are batched (up to ``inbound.batch_size``, never waiting to fill a
batch), published into MQ in one unit of work and only acknowledged to the MQTT broker
(PUBACK / PUBCOMP through paho's manual acknowledgement) once that unit has committed.
The next batch is put while a unit's commit completes (``begin_publish``); units
commit in order, and a failed one takes the units after it with it. A crash before
the acknowledgement makes the broker redeliver the message into our persistent
session: at-least-once.

A message carrying this gateway's origin (user property ``mqgw-origin``: a reply or
dead letter the gateway published itself) is acknowledged and counted, never published
into MQ, as the Kafka source skips records of its own ``mq.origin``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import paho.mqtt.client as paho

from gateway.log_summary import SummarisedLog
from gateway.plugin_api import (
    Envelope,
    PluginError,
    Publisher,
    PublishRefusedError,
    begin_publish,
)
from plugins.mqtt.config import InboundConfig, InboundFilter
from plugins.mqtt.connection import MqttConnection, MqttConnectionError, Outgoing, Received
from plugins.mqtt.mapping import (
    ORIGIN_PROPERTY,
    MappingError,
    has_origin,
    mq_expiry,
    mq_properties,
    mq_topic,
)

log = logging.getLogger(__name__)
#: Messages dead-lettered: whoever publishes decides how many, so one line per reason a
#: minute, then a count.
_PARKED = SummarisedLog(log)

RETRY_MIN_DELAY = 0.2
RETRY_MAX_DELAY = 10.0


@dataclass(slots=True)
class SourceCounters:
    received: int = 0
    published: int = 0
    units_of_work: int = 0
    publish_failures: int = 0
    dead_lettered: int = 0
    dropped_properties: int = 0
    #: received on a connection that went down before the commit (the broker redelivers)
    abandoned: int = 0
    #: this gateway's own messages (``mqgw-origin``), acknowledged, not published
    skipped_own: int = 0


def find_filter(topic: str, filters: Sequence[InboundFilter]) -> InboundFilter | None:
    """The first configured filter matching ``topic`` (config order)."""
    for f in filters:
        if paho.topic_matches_sub(f.filter, topic):
            return f
    return None


def to_inbound(
    message: paho.MQTTMessage, inbound: InboundFilter, origin: str, counters: SourceCounters
) -> Envelope:
    """The MQ publication of one MQTT message (raises MappingError)."""
    topic = mq_topic(message.topic, inbound)
    props = message.properties
    properties: dict[str, str] = {}
    expiry: int | None = None
    utf8 = False
    correl = b""
    if props is not None:
        properties, dropped = mq_properties(getattr(props, "UserProperty", None) or [])
        counters.dropped_properties += dropped
        expiry = getattr(props, "MessageExpiryInterval", None)
        utf8 = getattr(props, "PayloadFormatIndicator", 0) == 1
        data = getattr(props, "CorrelationData", None)
        if isinstance(data, bytes) and len(data) <= 24:
            correl = data
    payload = bytes(message.payload)
    return Envelope(
        stream=inbound.stream,
        topic=topic,
        payload=payload,
        payload_format="MQSTR" if utf8 else inbound.payload_format,
        ccsid=1208 if utf8 else inbound.ccsid,
        properties=properties,
        persistent=message.qos > 0,
        retain=bool(message.retain),
        delete=bool(message.retain) and not payload,
        expiry=mq_expiry(expiry),
        correl_id=correl,
        origin=origin,
    )


def user_pairs(message: paho.MQTTMessage) -> list[tuple[str, str]]:
    """The MQTT 5 user properties of ``message`` (none under MQTT 3.1.1)."""
    props = message.properties
    return list(getattr(props, "UserProperty", None) or []) if props is not None else []


@dataclass(slots=True)
class _Item:
    received: Received
    publication: Envelope | None
    error: str = ""
    #: MQ reason code of a refusal (0: the message could not be mapped or encoded)
    reason: int = 0
    #: the gateway's own message: acknowledged without being published or parked
    own: bool = False


@dataclass(slots=True)
class _Committing:
    """A unit of work whose commit has begun: its messages wait for its end."""

    items: list[_Item]
    ends: Awaitable[None]


class MqttSource:
    """Feeds received MQTT messages into MQ, acknowledging after the commit."""

    def __init__(
        self,
        config: InboundConfig,
        connection: MqttConnection,
        publisher: Publisher,
        origin: str,
        *,
        gateway_id: str = "",
    ) -> None:
        self.config = config
        self.connection = connection
        self.publisher = publisher
        self.origin = origin
        #: messages whose ``mqgw-origin`` names it are skipped ("": none is)
        self.gateway_id = gateway_id
        self.counters = SourceCounters()
        self._queue: asyncio.Queue[Received] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._busy = False
        self._stopping = False
        self.stalled = False

    def subscriptions(self) -> list[tuple[str, int]]:
        return [(f.filter, f.qos) for f in self.config.filters]

    def on_message(self, received: Received) -> None:
        """Called by the connection on the event loop thread for each PUBLISH."""
        self.counters.received += 1
        self._queue.put_nowait(received)

    def start(self) -> None:
        if self.config.filters and self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"mqtt-source-{self.origin}")

    async def stop(self, timeout: float = 30.0) -> None:
        """Finish the unit of work in progress (so its messages are acknowledged), then
        stop; messages not yet published stay unacknowledged and are redelivered."""
        self._stopping = True
        task, self._task = self._task, None
        if task is None:
            return
        if not self._busy:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(task, timeout)

    async def _run(self) -> None:
        """Take what has arrived (up to ``batch_size``) as a unit of work; while its MQ
        commit completes, the next unit is put if a full batch is waiting
        (``begin_publish``; otherwise the batch grows until that commit has ended), and
        each unit's messages are acknowledged once its own commit has ended."""
        committing: _Committing | None = None
        try:
            while not self._stopping:
                if committing is not None and self._queue.qsize() < self.config.batch_size:
                    # less than a full batch waiting: let it grow while the unit in
                    # front commits (a unit per commit, not one per few messages)
                    self._busy = True
                    try:
                        await self._settle(committing)
                    finally:
                        committing = None
                        self._busy = False
                    continue
                first = await self._queue.get()
                batch = [first]
                while len(batch) < self.config.batch_size and not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                self._busy = True
                try:
                    front, committing = committing, None
                    committing = await self._begin(self._map(batch), front)
                finally:
                    self._busy = False
        finally:
            if committing is not None:
                await asyncio.shield(self._settle(committing))

    async def _begin(self, items: list[_Item], front: _Committing | None) -> _Committing | None:
        """Put ``items`` and begin their commit, the unit ``front`` (begun before)
        committing meanwhile; settles ``front``. What is left to settle, if anything.

        Only a unit whose every message is published goes this way; anything else (a
        message to dead-letter or skip, a failure) settles ``front`` first and takes
        the one-unit-at-a-time path (:meth:`_handle`), so order and retries are as ever."""
        plain = all(
            it.publication is not None
            and (
                it.received.message.qos != 1
                or it.received.generation == self.connection.generation
            )
            for it in items
        )
        if not plain:
            if front is not None:
                await self._settle(front)
            await self._handle_items(items)
            return None
        try:
            ends = await begin_publish(
                self.publisher, [it.publication for it in items if it.publication]
            )
        except Exception as exc:
            # nothing of this unit committed (a refusal, MQ unavailable, or the unit in
            # front failed and took this one with it): in order, one at a time, this
            # failure being the unit's first attempt (unless it was the front's)
            if front is not None and not await self._settle(front):
                await self._handle_items(items)
                return None
            await self._handle_items(items, failed=exc)
            return None
        if front is not None:
            await self._settle(front)  # its commit has ended: this one's has begun
        return _Committing(items, ends)

    async def _settle(self, unit: _Committing) -> bool:
        """Wait for ``unit``'s commit, then acknowledge its messages; a failed commit
        (nothing of it in MQ) publishes them again, one unit at a time (False)."""
        try:
            await unit.ends
        except Exception as exc:
            await self._handle_items(unit.items, failed=exc)
            return False
        self.counters.units_of_work += 1
        self.counters.published += len(unit.items)
        for it in unit.items:
            self.connection.ack(it.received)
        return True

    def _map(self, batch: list[Received]) -> list[_Item]:
        items: list[_Item] = []
        for rec in batch:
            msg = rec.message
            if has_origin(user_pairs(msg), self.gateway_id):
                self.counters.skipped_own += 1
                items.append(_Item(rec, None, own=True))
                continue
            inbound = find_filter(msg.topic, self.config.filters)
            if inbound is None:  # a subscription left in the session from an older config
                items.append(_Item(rec, None, f"no inbound filter matches {msg.topic!r}"))
                continue
            try:
                items.append(_Item(rec, to_inbound(msg, inbound, self.origin, self.counters)))
            except MappingError as exc:
                items.append(_Item(rec, None, str(exc)))
        return items

    async def _handle(self, batch: list[Received]) -> None:
        await self._handle_items(self._map(batch))

    async def _handle_items(self, items: list[_Item], failed: Exception | None = None) -> None:
        """Publish ``items`` (retrying), dead-letter what MQ can never take, and
        acknowledge them, one unit of work at a time. ``failed``: how publishing all of
        them (:meth:`_begin`) failed already, taken as the first attempt."""
        attempt = 0
        begun = len(items)
        #: most messages per unit of work; halved after each failure, so a batch larger
        #: than the room left on a nearly full queue still gets through (back-pressure)
        limit = len(items)
        while True:
            # QoS 1 messages of a lost connection will be redelivered: do not publish them
            # now. QoS 2 ones will NOT be (paho sent PUBREC on arrival and delivered them
            # after PUBREL; the broker now only waits for PUBCOMP): keep them, and ack()
            # sends PUBCOMP on the current link.
            live = [
                it
                for it in items
                if it.received.message.qos != 1
                or it.received.generation == self.connection.generation
            ]
            self.counters.abandoned += len(items) - len(live)
            items = live
            to_publish = [it for it in items if it.publication is not None][:limit]
            if not to_publish:
                break
            try:
                if failed is not None:
                    first, failed = failed, None
                    if len(to_publish) == begun:  # the same list: its failure stands
                        raise first
                await self.publisher.publish(
                    [it.publication for it in to_publish if it.publication]
                )
            except PublishRefusedError as exc:
                if not 0 <= exc.index < len(to_publish):
                    # Unattributable refusal: none of them can be published as a batch.
                    for it in to_publish:
                        it.publication = None
                        it.error = str(exc)
                        it.reason = exc.reason
                    continue
                # MQ can never take this one (e.g. 2031 too big): dead-letter it, and
                # publish the others; never retry it (it would block the source).
                to_publish[exc.index].publication = None
                to_publish[exc.index].error = str(exc)
                to_publish[exc.index].reason = exc.reason
                continue
            except PluginError as exc:
                await self._pause(attempt, exc)
            except Exception as exc:  # any failure: retry, never ack
                await self._pause(attempt, exc)
            else:
                self.counters.units_of_work += 1
                self.counters.published += len(to_publish)
                # Committed in MQ: acknowledge now (a stop before the rest is published
                # must not make the broker hand these back).
                for it in to_publish:
                    self.connection.ack(it.received)
                done = {id(it) for it in to_publish}
                items = [it for it in items if id(it) not in done]
                attempt, limit = 0, limit * 2
                continue
            attempt += 1
            limit = max(1, limit // 2)
            if self._stopping:
                return  # unacknowledged: the broker redelivers after a restart
        self.stalled = False
        for it in items:
            if it.publication is None and not it.own:
                await self._dead_letter(it)
        for it in items:
            if it.error or it.own:
                self.connection.ack(it.received)

    async def _pause(self, attempt: int, exc: BaseException) -> None:
        self.counters.publish_failures += 1
        self.stalled = True
        delay = min(RETRY_MAX_DELAY, RETRY_MIN_DELAY * 2**attempt)
        log.warning("publishing MQTT messages into MQ failed (%s); retrying in %.1f s", exc, delay)
        await asyncio.sleep(delay)

    async def _dead_letter(self, item: _Item) -> None:
        """Park a message MQ can never take on the dead-letter topic, then ack it."""
        self.counters.dead_lettered += 1
        parked = await park(
            self.connection,
            self.config.dead_letter_topic,
            item.received.message,
            item.error,
            item.reason,
            stopping=lambda: self._stopping,
            origin=self.gateway_id,
        )
        if not parked:
            item.error = ""  # not parked: leave it unacknowledged for redelivery


async def park(
    connection: MqttConnection,
    dead_letter_topic: str,
    msg: paho.MQTTMessage,
    error: str,
    reason: int,
    *,
    stopping: Callable[[], bool],
    origin: str = "",
) -> bool:
    """The plugin's one dead-letter rule (docs/mqtt-plugin.md): publish ``msg`` to
    ``<dead_letter_topic>/<its topic>`` with user properties ``mqgw-error``,
    ``mqgw-topic``, ``mqgw-reason`` and ``mqgw-origin`` (``origin``, the gateway id,
    when given) (QoS 1, retried until PUBACK), or drop it when no dead-letter topic is
    configured. True: the caller may acknowledge the message; False: ``stopping``
    became true first, leave it unacknowledged."""
    if not dead_letter_topic:
        _PARKED.log(logging.ERROR, f"dropped {reason}", "dropping MQTT message on %r: %s",
                    msg.topic, error)
        return True
    _PARKED.log(logging.ERROR, f"{dead_letter_topic} {reason}", "MQTT message on %r goes to %r: %s",
                msg.topic, dead_letter_topic, error)
    properties = [("mqgw-error", error), ("mqgw-topic", msg.topic), ("mqgw-reason", str(reason))]
    if origin:
        properties.append((ORIGIN_PROPERTY, origin))
    out = Outgoing(f"{dead_letter_topic}/{msg.topic}", bytes(msg.payload), 1, False, properties)
    attempt = 0
    while not stopping():
        with contextlib.suppress(MqttConnectionError):
            await connection.publish_all([out], 30.0)
            return True
        attempt += 1
        await asyncio.sleep(min(RETRY_MAX_DELAY, RETRY_MIN_DELAY * 2**attempt))
    return False
