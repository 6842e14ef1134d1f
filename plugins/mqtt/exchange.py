"""Request/reply exchanges over MQTT: the instance's :class:`gateway.plugin_api.Exchanges`.

Each route's sources (topic filters) join the instance's persistent session as QoS 1
subscriptions; a message on one of them goes to that route's handler — never to the
publish/subscribe source, even when an inbound filter matches it too (the exchange
wins) — and is acknowledged (PUBACK) only after the handler returned, exactly as the
source acknowledges after the MQ commit. Replies are published at QoS 1 and ``produce``
returns after their PUBACKs.

MQTT 5 carries the reply information as protocol properties (Response Topic,
Correlation Data, Message Expiry Interval, user properties); MQTT 3.1.1 has none, so
requests arrive without it (the runtime's route ``reply_topic`` template applies) and
replies go out as bare payloads. docs/mqtt-plugin.md, "Request/reply".

MQTT 5 messages produced that ask for no answer (replies, error replies, datagrams)
carry the gateway's origin (user property ``mqgw-origin`` = the gateway id): its
inbound filters skip them, and a route's source refuses one (dead-lettered, reason
2035) instead of taking it as a request or a reply, so a reply published where a
requester chose never comes back in. A request forwarded to a responder (with a
Response Topic) is not marked: it goes to a topic of the gateway's configuration, and a
responder that copies the request's user properties into its reply (as a Node-RED flow
passing ``msg`` through does) would otherwise have every reply refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import paho.mqtt.client as paho

from gateway.plugin_api import (
    DeliveryRefusedError,
    Envelope,
    ExchangeHandler,
    PluginError,
    PublishRefusedError,
)
from plugins.mqtt.connection import (
    MqttConnection,
    MqttConnectionError,
    Outgoing,
    PublicationRefusedError,
    Received,
)
from plugins.mqtt.mapping import (
    ORIGIN_PROPERTY,
    MappingError,
    check_topic_name,
    expiry_interval,
    has_origin,
    mq_expiry,
    mq_properties,
    user_properties,
)
from plugins.mqtt.source import RETRY_MAX_DELAY, RETRY_MIN_DELAY, park, user_pairs

log = logging.getLogger(__name__)

#: QoS of every exchange subscription and reply (acknowledged both ways).
EXCHANGE_QOS = 1
#: MQ reason codes carried by a refused reply: MQRC_TOPIC_STRING_ERROR for a topic MQTT
#: cannot publish to; MQTT 5 PUBACK refusals (0x90 topic name invalid, 0x99 payload
#: format invalid) map to it and to MQRC_FORMAT_ERROR.
TOPIC_REFUSED = 2425
_PUBACK_REASONS = {0x87: 2035, 0x90: TOPIC_REFUSED, 0x99: 2110}
#: PUBACK "not authorised" (0x87): the broker's ACL keeps the gateway off the topic a
#: requester named. For the plugin's stream publications it may be a passing state (an
#: ACL being changed); for one reply it is the requester's topic: that envelope is
#: refused (its MQ reply dead-lettered), not retried while every other reply waits.
_REPLY_REFUSALS = frozenset({0x87})
#: MQRC_NOT_AUTHORIZED: the reason of a message of this gateway's own origin on a
#: route's source (the gateway published it; it is no request or reply to take).
OWN_ORIGIN_REASON = 2035


def _unique_id() -> bytes:
    """The receive identity (``msg_id``) of a request without correlation data."""
    return os.urandom(24)


@dataclass(slots=True)
class ExchangeCounters:
    received: int = 0
    handled: int = 0
    handler_failures: int = 0
    dead_lettered: int = 0
    produced: int = 0
    #: received on a connection that went down before the handler returned (redelivered)
    abandoned: int = 0
    dropped_properties: int = 0
    #: messages of this gateway's own origin on a source, dead-lettered (also counted
    #: in dead_lettered)
    own_origin_refused: int = 0


def to_exchange_envelope(message: paho.MQTTMessage, origin: str) -> tuple[Envelope, int]:
    """The exchange envelope of one received message, and how many user properties MQ
    could not carry (dropped). Payloads are taken as UTF-8 text (MQSTR, CCSID 1208), the
    inbound filters' default."""
    props = message.properties
    properties: dict[str, str] = {}
    dropped = 0
    reply_topic = ""
    correlation = b""
    interval: int | None = None
    if props is not None:
        properties, dropped = mq_properties(getattr(props, "UserProperty", None) or [])
        reply_topic = getattr(props, "ResponseTopic", None) or ""
        data = getattr(props, "CorrelationData", None)
        correlation = bytes(data) if isinstance(data, bytes | bytearray) else b""
        interval = getattr(props, "MessageExpiryInterval", None)
    envelope = Envelope(
        stream="",
        topic=message.topic,
        payload=bytes(message.payload),
        properties=properties,
        persistent=message.qos > 0,
        expiry=mq_expiry(interval),
        origin=origin,
        reply_topic=reply_topic,
        correlation_data=correlation,
    )
    return envelope, dropped


def to_reply_outgoing(envelope: Envelope, *, v5: bool, origin: str) -> Outgoing:
    """The QoS 1 MQTT message for one produced envelope (raises MappingError for a topic
    MQTT cannot publish to), marked with ``origin`` (the gateway id) after the
    envelope's properties unless it asks for an answer (module docstring). MQTT 3.1.1:
    the payload only (no properties, no marker)."""
    e = envelope
    topic = check_topic_name(e.topic)
    if not v5:
        return Outgoing(topic, e.payload, EXCHANGE_QOS, False)
    properties = user_properties(e)
    if origin and not e.reply_topic:
        properties.append((ORIGIN_PROPERTY, origin))
    return Outgoing(
        topic,
        e.payload,
        EXCHANGE_QOS,
        False,
        properties,
        expiry_interval(e.expiry),
        utf8=e.is_text and e.ccsid in (1208, 1209),
        response_topic=e.reply_topic,
        correlation_data=e.correlation_data,
    )


@dataclass(slots=True)
class _Route:
    name: str
    sources: tuple[str, ...]
    handler: ExchangeHandler
    queue: asyncio.Queue[Received] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    busy: bool = False


def _refuses_one(exc: Exception) -> bool:
    """A PUBACK refusal of one reply (not a lost connection): permanent, or not
    authorised (:data:`_REPLY_REFUSALS`)."""
    if isinstance(exc, PublicationRefusedError):
        return True
    return isinstance(exc, MqttConnectionError) and exc.reason in _REPLY_REFUSALS


class MqttExchanges:
    """The request/reply routes of one instance over its connection (module docstring)."""

    def __init__(
        self,
        connection: MqttConnection,
        *,
        origin: str,
        dead_letter_topic: str,
        ack_timeout: float,
        gateway_id: str = "",
    ) -> None:
        self.connection = connection
        self.origin = origin
        #: marks what ``produce`` publishes; a received message marked so is refused
        self.gateway_id = gateway_id
        self.dead_letter_topic = dead_letter_topic
        self.ack_timeout = ack_timeout
        self.counters = ExchangeCounters()
        self._routes: dict[str, _Route] = {}
        self._stopping = False

    def subscriptions(self) -> list[tuple[str, int]]:
        return [(s, EXCHANGE_QOS) for r in self._routes.values() for s in r.sources]

    def route_for(self, topic: str) -> str | None:
        """The route whose source matches ``topic`` (first registered wins), or None."""
        for route in self._routes.values():
            if any(paho.topic_matches_sub(s, topic) for s in route.sources):
                return route.name
        return None

    def offer(self, received: Received) -> bool:
        """Take a received message when a route's source matches it (True)."""
        name = self.route_for(received.message.topic)
        if name is None:
            return False
        self.counters.received += 1
        self._routes[name].queue.put_nowait(received)
        return True

    async def consume(self, route: str, sources: Sequence[str], handler: ExchangeHandler) -> None:
        """Register ``route`` and subscribe its sources (idempotent per route)."""
        if self._stopping:
            raise PluginError(f"mqtt instance {self.origin!r} is stopping", retriable=True)
        r = self._routes.get(route)
        if r is None:
            r = _Route(route, tuple(dict.fromkeys(sources)), handler)
            self._routes[route] = r
            r.task = asyncio.create_task(self._run(r), name=f"mqtt-exchange-{self.origin}-{route}")
        # Again for a known route too: a SUBSCRIBE that failed before is retried (a
        # no-op once the broker granted it).
        try:
            await self.connection.subscribe_added()
        except (MqttConnectionError, TimeoutError) as exc:
            # Refused (ACL, bad filter) or no SUBACK: the route stays registered and the
            # next connection subscribes it; a refusal is a config problem to report.
            refused = isinstance(exc, MqttConnectionError) and exc.reason >= 0x80
            raise PluginError(
                f"mqtt instance {self.origin!r}: cannot subscribe route {route!r} "
                f"sources {list(r.sources)}: {exc or 'no SUBACK'}",
                retriable=not refused,
            ) from exc

    async def produce(self, envelopes: Sequence[Envelope]) -> None:
        if not envelopes:
            return
        v5 = self.connection.v5
        messages: list[Outgoing] = []
        for index, envelope in enumerate(envelopes):
            try:
                messages.append(to_reply_outgoing(envelope, v5=v5, origin=self.gateway_id))
            except MappingError as exc:
                raise DeliveryRefusedError(
                    f"mqtt instance {self.origin!r}: {exc} ({envelope.topic!r})",
                    index=index,
                    reason=TOPIC_REFUSED,
                ) from exc
        try:
            await self._publish(messages)
        except MqttConnectionError as exc:
            raise PluginError(f"mqtt instance {self.origin!r}: {exc}", retriable=True) from exc
        self.counters.produced += len(messages)

    async def _publish(self, messages: list[Outgoing]) -> None:
        try:
            await self.connection.publish_all(messages, self.ack_timeout)
        except (PublicationRefusedError, MqttConnectionError) as first:
            if not _refuses_one(first):
                raise
            # Which one? Publish them one by one (those before it again: at-least-once).
            for index, message in enumerate(messages):
                try:
                    await self.connection.publish_all([message], self.ack_timeout)
                except (PublicationRefusedError, MqttConnectionError) as exc:
                    if not _refuses_one(exc):
                        raise
                    raise DeliveryRefusedError(
                        f"mqtt instance {self.origin!r}: {exc}",
                        index=index,
                        reason=_PUBACK_REASONS.get(exc.reason, TOPIC_REFUSED),
                    ) from exc
            raise

    async def stop(self, timeout: float = 30.0) -> None:
        """Let each route finish the batch its handler holds (so it is acknowledged),
        then stop; messages not handed over stay unacknowledged and are redelivered."""
        self._stopping = True
        for route in self._routes.values():
            task, route.task = route.task, None
            if task is None:
                continue
            if not route.busy:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(task, timeout)

    async def _run(self, route: _Route) -> None:
        while not self._stopping:
            batch = [await route.queue.get()]
            while not route.queue.empty():
                batch.append(route.queue.get_nowait())
            route.busy = True
            try:
                await self._handle(route, batch)
            finally:
                route.busy = False

    async def _handle(self, route: _Route, batch: list[Received]) -> None:
        items = await self._refuse_own(batch)
        attempt = 0
        ids: dict[int, bytes] = {}
        while items and not self._stopping:
            # QoS 1 messages of a lost connection are redelivered by the broker: drop them.
            live = [
                r for r in items if r.message.qos != 1 or r.generation == self.connection.generation
            ]
            self.counters.abandoned += len(items) - len(live)
            items = live
            if not items:
                return
            envelopes = []
            for rec in items:
                envelope, dropped = to_exchange_envelope(rec.message, self.origin)
                self.counters.dropped_properties += dropped
                if not envelope.correlation_data:
                    # nothing names this request: a receive identity of its own, the
                    # same while this batch is offered again (docs/mqtt-plugin.md)
                    envelope = replace(envelope, msg_id=ids.setdefault(id(rec), _unique_id()))
                envelopes.append(envelope)
            try:
                await route.handler(envelopes)
            except PublishRefusedError as exc:
                index = exc.index if 0 <= exc.index < len(items) else 0
                self._ack(items[:index])
                refused = items[index]
                self.counters.dead_lettered += 1
                if not await park(
                    self.connection,
                    self.dead_letter_topic,
                    refused.message,
                    str(exc),
                    exc.reason,
                    stopping=lambda: self._stopping,
                    origin=self.gateway_id,
                ):
                    return  # stopping: left unacknowledged, redelivered
                self._ack([refused])
                items, attempt = items[index + 1 :], 0
            except Exception as exc:  # retriable or not: never acknowledge, offer again
                self.counters.handler_failures += 1
                delay = min(RETRY_MAX_DELAY, RETRY_MIN_DELAY * 2**attempt)
                attempt += 1
                log.warning(
                    "mqtt instance %r route %r: handler failed (%s); retrying in %.1f s",
                    self.origin,
                    route.name,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
            else:
                self._ack(items)
                self.counters.handled += len(items)
                return

    async def _refuse_own(self, batch: list[Received]) -> list[Received]:
        """Dead-letter and acknowledge the messages of this gateway's own origin (a reply
        it published on a topic this source matches); the others, to be handled. Empty
        when stopping before one was parked (it stays unacknowledged: redelivered)."""
        rest: list[Received] = []
        for rec in batch:
            if not has_origin(user_pairs(rec.message), self.gateway_id):
                rest.append(rec)
                continue
            self.counters.own_origin_refused += 1
            self.counters.dead_lettered += 1
            why = (
                f"message carries this gateway's own origin ({ORIGIN_PROPERTY} "
                f"{self.gateway_id!r}): the gateway published it (a reply or a request it "
                "produced), so it is taken as neither a request nor a reply"
            )
            if not await park(
                self.connection,
                self.dead_letter_topic,
                rec.message,
                why,
                OWN_ORIGIN_REASON,
                stopping=lambda: self._stopping,
                origin=self.gateway_id,
            ):
                return []
            self._ack([rec])
        return rest

    def _ack(self, items: Sequence[Received]) -> None:
        for rec in items:
            self.connection.ack(rec)
