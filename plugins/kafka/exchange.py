"""Request/reply exchanges on Kafka: records ↔ exchange envelopes (docs/kafka-contract.md
"Request/reply records").

Reply information travels as record headers: ``mq.reply.topic`` (where the answer goes),
``mq.correlation`` (the requester's bytes, returned unchanged; the record key stands in
when the header is absent) and ``mq.expiry`` (tenths of a second, MQ's unit). Every
other header not starting with ``mq.`` is a property by name. Consuming and producing
reuse the plugin's one source loop (commit after the handler, dead-letter topic for
refused records) and one producer (acks=all, refusals as DeliveryRefusedError).

Every record produced that asks for no answer (a reply, an error reply, a datagram)
carries ``mq.origin`` = the gateway id, as publication records do: the gateway's inbound
routes skip it and its request/reply sources refuse it (dead-lettered, reason 2035), so
a reply written where a requester chose never comes back in as a publication, a request
or a reply. A request forwarded to a responder (``mq.reply.topic`` set) goes to a topic
of the gateway's configuration, not one an outsider chose, and responders often copy a
request's headers into their reply (Kafka Streams forwards them by default): marked, the
route would refuse every such reply, so it is not.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from collections.abc import Callable, Sequence

from aiokafka import ConsumerRecord
from aiokafka.errors import KafkaError

from gateway.plugin_api import DeliveryRefusedError, Envelope, ExchangeHandler
from plugins.kafka.config import KafkaPluginConfig
from plugins.kafka.errors import (
    MQRC_UNKNOWN_OBJECT_NAME,
    KafkaPluginError,
    KafkaSendError,
    TopicNameError,
)
from plugins.kafka.mapping import (
    ORIGIN_HEADER,
    OWN_ORIGIN_REASON,
    OutboundRecord,
    SkippedRecord,
    check_topic_name,
)
from plugins.kafka.sink import KafkaSink
from plugins.kafka.source import KafkaSource

log = logging.getLogger(__name__)

#: The reply-information headers (everything else not starting with ``mq.`` is a property).
REPLY_TOPIC_HEADER = "mq.reply.topic"
CORRELATION_HEADER = "mq.correlation"
EXPIRY_HEADER = "mq.expiry"
#: Headers of the plugin's namespace are never properties.
RESERVED_PREFIX = "mq."


def exchange_group(gateway_id: str, route: str) -> str:
    """The durable consumer group of one request/reply route."""
    return f"{gateway_id}.rr.{route}"


def receive_id(topic: str, partition: int, offset: int) -> bytes:
    """24 bytes that name one record for good (the envelope's ``msg_id``), so a record
    delivered again after a crash is recognised as the same request."""
    return hashlib.sha256(f"{topic}:{partition}:{offset}".encode()).digest()[:24]


def _text(name: str, value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SkippedRecord(f"header {name!r} is not UTF-8 text") from exc


def exchange_envelope(
    record: ConsumerRecord[bytes, bytes], *, origin: str, gateway_id: str = ""
) -> Envelope:
    """The exchange envelope of a consumed record; SkippedRecord when a header cannot be
    read or the record is ``gateway_id``'s own (``mq.origin``: the gateway wrote it),
    and the record is then dead-lettered like any refused inbound record."""
    headers = record.headers or ()
    if gateway_id and any(
        name == ORIGIN_HEADER and bytes(raw) == gateway_id.encode() for name, raw in headers
    ):
        raise SkippedRecord(
            f"record carries this gateway's own origin ({ORIGIN_HEADER} {gateway_id!r}): "
            "the gateway wrote it (a reply or a request it produced), so it is taken as "
            "neither a request nor a reply",
            OWN_ORIGIN_REASON,
        )
    properties: list[tuple[str, str]] = []
    reply_topic = ""
    correlation: bytes | None = None
    expiry = -1
    for name, raw in headers:
        value = bytes(raw)
        if name == REPLY_TOPIC_HEADER:
            reply_topic = _text(name, value)
        elif name == CORRELATION_HEADER:
            correlation = value
        elif name == EXPIRY_HEADER:
            text = _text(name, value).strip()
            try:
                expiry = int(text)
            except ValueError as exc:
                raise SkippedRecord(f"header {name!r} is not a whole number: {text!r}") from exc
            if expiry <= 0:
                expiry = -1
        elif not name.startswith(RESERVED_PREFIX):
            properties.append((name, _text(name, value)))
    if correlation is None:
        correlation = record.key or b""
    return Envelope(
        stream="",
        topic=record.topic,
        payload=record.value or b"",
        properties=dict(properties),
        property_list=tuple(properties),
        persistent=True,
        expiry=expiry,
        origin=origin,
        msg_id=receive_id(record.topic, record.partition, record.offset),
        put_time_ms=record.timestamp if record.timestamp >= 0 else None,
        text_codec="utf-8",
        reply_topic=reply_topic,
        correlation_data=correlation,
    )


def exchange_record(envelope: Envelope, *, origin: str) -> OutboundRecord:
    """The record an exchange envelope is produced as (key = its correlation data),
    marked with ``origin`` (the gateway id) unless it asks for an answer (module
    docstring). A property named like the origin header (an MQ ``usr`` element
    ``<mq><origin>``) is left out: only the gateway sets it."""
    e = envelope
    headers = [
        (name, value.encode("utf-8")) for name, value in e.property_items() if name != ORIGIN_HEADER
    ]
    if e.reply_topic:
        headers.append((REPLY_TOPIC_HEADER, e.reply_topic.encode("utf-8")))
    if e.correlation_data:
        headers.append((CORRELATION_HEADER, e.correlation_data))
    if e.expiry > 0:
        headers.append((EXPIRY_HEADER, str(e.expiry).encode()))
    if not e.reply_topic:
        headers.append((ORIGIN_HEADER, origin.encode()))
    return OutboundRecord(
        topic=e.topic, key=e.correlation_data or None, value=e.payload, headers=headers
    )


class HandlerPublisher:
    """An exchange handler in the place of the source's publisher: the consumer loop
    commits a batch's offsets only once the handler returned for it."""

    def __init__(self, handler: ExchangeHandler) -> None:
        self.handler = handler

    async def publish(self, publications: Sequence[Envelope]) -> None:
        await self.handler(publications)


class KafkaExchanges:
    """The request/reply side of one instance: a durable consumer per route and the
    instance's producer (its outbound sink's, or one of its own when it has none)."""

    def __init__(
        self,
        config: KafkaPluginConfig,
        *,
        instance: str,
        gateway_id: str,
        sink: Callable[[], KafkaSink | None],
    ) -> None:
        self.config = config
        self.instance = instance
        self.gateway_id = gateway_id
        self._outbound_sink = sink
        #: The exchanges' own producer when the outbound sink's cannot be shared.
        self.own_sink: KafkaSink | None = None
        self.consumers: dict[str, KafkaSource] = {}
        self.produced = 0
        self.refused = 0

    async def consume(self, route: str, sources: Sequence[str], handler: ExchangeHandler) -> None:
        if route in self.consumers:
            return  # idempotent: the route's consumer runs already
        group = exchange_group(self.gateway_id, route)
        consumer = KafkaSource(
            self.config,
            HandlerPublisher(handler),
            instance=self.instance,
            gateway_id=self.gateway_id,
            topics=list(dict.fromkeys(sources)),
            group_id=group,
            # the group is this gateway's route's alone: as a static member, a restart
            # after a crash consumes at once, not after the dead member's session timeout
            group_instance_id=group,
            mapper=functools.partial(
                exchange_envelope, origin=self.instance, gateway_id=self.gateway_id
            ),
            auto_offset_reset="earliest",
            handled_before_refusal=True,
        )
        await consumer.start()
        self.consumers[route] = consumer
        log.info(
            "kafka instance %r: request/reply route %r consumes %s",
            self.instance,
            route,
            sorted(consumer.routes),
        )

    async def produce(self, envelopes: Sequence[Envelope]) -> None:
        """Produce ``envelopes``; a topic Kafka refuses (an illegal name such as a
        reply topic with "/", or one the cluster will not create) raises
        DeliveryRefusedError for its first envelope, before anything is sent."""
        for index, e in enumerate(envelopes):
            try:
                check_topic_name(e.topic, "reply topic")
            except TopicNameError as exc:
                self.refused += 1
                raise DeliveryRefusedError(
                    f"kafka instance {self.instance!r}: {exc}",
                    index=index,
                    reason=MQRC_UNKNOWN_OBJECT_NAME,
                ) from exc
        sink = await self._sink()
        for topic in dict.fromkeys(e.topic for e in envelopes):
            try:
                async with asyncio.timeout(self.config.send_timeout_s):
                    await sink.topics.ensure({topic: False})
            except (KafkaError, TimeoutError) as exc:
                raise KafkaSendError(
                    f"kafka instance {self.instance!r}: cannot make sure topic {topic!r} "
                    f"exists: {exc!r}"
                ) from exc
            except KafkaPluginError as exc:
                if exc.retriable:
                    raise
                self.refused += 1
                raise DeliveryRefusedError(
                    f"kafka instance {self.instance!r}: {exc}",
                    index=next(i for i, e in enumerate(envelopes) if e.topic == topic),
                    reason=MQRC_UNKNOWN_OBJECT_NAME,
                ) from exc
        records = [
            (index, exchange_record(e, origin=self.gateway_id)) for index, e in enumerate(envelopes)
        ]
        refused_before = sink.refused
        try:
            await sink.deliver(envelopes, records)
        finally:
            self.refused += sink.refused - refused_before
        self.produced += len(records)

    async def _sink(self) -> KafkaSink:
        """The outbound sink when it has a plain producer; else (no outbound routes, or
        exactly-once, whose transactions may not interleave with exchange records) a
        producer of the exchanges' own, never transactional: the runtime filters
        duplicate exchange records itself."""
        outbound = self._outbound_sink()
        if outbound is not None and outbound.ledger is None:
            return outbound
        sink = self.own_sink
        if sink is None:
            sink = KafkaSink(
                self.config.model_copy(update={"delivery": "at_least_once"}),
                None,
                instance=self.instance,
                gateway_id=self.gateway_id,
            )
            await sink.start()
            self.own_sink = sink
        return sink

    @property
    def healthy(self) -> bool:
        return all(c.healthy for c in self.consumers.values())

    def stats(self) -> dict[str, int]:
        out = {"exchange_produced": self.produced, "exchange_refused": self.refused}
        for consumer in self.consumers.values():
            for key, value in (
                ("consumed", consumer.counters.consumed),
                ("handled", consumer.counters.published),
                ("handler_failures", consumer.counters.publish_failures),
                ("dead_lettered", consumer.counters.dead_lettered),
                ("own_origin_refused", consumer.counters.own_origin_refused),
                ("commit_failures", consumer.counters.commit_failures),
            ):
                out[f"exchange_{key}"] = out.get(f"exchange_{key}", 0) + value
        return out

    async def stop(self) -> None:
        consumers, self.consumers = self.consumers, {}
        for consumer in consumers.values():
            await consumer.stop()
        sink, self.own_sink = self.own_sink, None
        if sink is not None:
            await sink.stop()
