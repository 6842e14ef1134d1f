"""The contract plugins import — and nothing deeper.

A plugin bridges the gateway's publish/subscribe engine to one modern broker (Kafka,
MQTT, ...). It is found through the ``mqgw.plugins`` entry-point group, which names an
object satisfying :class:`Plugin`; nothing registers on import. The runtime builds one
:class:`PluginInstance` per configured instance and gives it a :class:`PluginContext`.

Two directions, each with the acknowledgement travelling with the data (Redpanda
Connect's rule):

* **outbound** (MQ → plugin): the instance is a *sink* subscriber of the engine. Its
  :meth:`Sink.send` gets the envelopes of one MQ unit of work for it and returns
  only when the target broker has them safely (Kafka acks=all, MQTT PUBACK/PUBCOMP).
  Raising backs the MQ unit of work out, so the publications are offered again: outbound
  delivery is at-least-once and MQ messages wait on their queue while a plugin is down.
* **inbound** (plugin → MQ): the instance calls :meth:`Publisher.publish` with a batch of
  :class:`Envelope`; it returns only after the MQ unit of work carrying them has
  committed. Only then may the instance acknowledge upstream (commit Kafka offsets, send
  the MQTT PUBACK).

The data travels as one MQ-neutral type, :class:`Envelope`, in both directions: the
runtime turns each engine delivery into an envelope once (``gateway.runtime.envelopes``)
and turns each envelope a plugin publishes into an MQRFH2 Publish command
(``gateway.pubsub.command_encoding``). Plugins never see an MQMD, an MQRFH2 folder or a
``$SYS/STREAM/`` topic, so they import nothing but this module (and their client
libraries). ``InboundPublication`` is the same type under the name the inbound side
has always used.

Details every plugin relies on:

* ``Envelope.delete`` (outbound) is True when a DeletePublication removed the retained
  publication on ``topic``: ``payload`` is empty, ``retain`` is True. Mirror it (Kafka
  tombstone, MQTT empty retained message).
* ``Envelope.retain`` is True when the publication is (or replaces) the retained one of
  its topic; ``from_retained_store`` when it was handed over from the retained store on
  (re)subscription rather than published live just now.
* ``Envelope.origin`` names the instance a publication came in through; the engine never
  delivers it back to that instance (no bridging loops), retained ones included.
* ``send`` raising an exception with ``retriable = True`` (:class:`PluginError`
  ``retriable=True``; wrap connection errors in it) means "target down": the broker
  keeps the MQ unit of work open and calls ``send`` again with the same envelopes
  (jittered backoff up to ``broker.sink_retry_max_delay``), so MQ messages wait on their
  queue. Any other exception backs the unit of work out (BackoutCount + 1; after the
  queue's BOTHRESH the message is moved to the backout/dead-letter queue). Until
  ``start`` is called, sends to an instance fail retriably the same way; a ``subscribe``
  made while a batch for the same instance is held makes that batch back out (not counted
  against BOTHRESH) so ``start`` never deadlocks.
* :meth:`Publisher.publish` raises :class:`PluginError` ``retriable=True`` while MQ is
  unavailable (retry later, do not acknowledge), and
  :class:`PublishRefusedError` (a PluginError, ``retriable=False``, ``.index`` = position
  in the batch) for a publication that can never be published (bad stream name, property
  name not an XML name, wildcard delete, payload format/encoding/CCSID MQ cannot carry,
  or a put MQ refuses for good for that message, e.g. 2030/2031 too big; ``.reason`` is the
  MQ reason code): dead-letter it and acknowledge it, never retry it. A full or
  put-inhibited queue is back-pressure (retriable), never a refusal.
* :func:`begin_publish` (optional verb ``Publisher.begin_publish``) returns once the
  batch is put and its commit begun: an instance may put its next batch while that
  commit completes, acknowledging each batch only when its own commit has ended.
* The runtime implementation is ``gateway.runtime.plugin_host`` (``PluginHost``,
  ``HostedPluginContext``, ``MQPublisher``); tests may build those directly over an
  ``EmbeddedQueueManager`` and a ``BrokerService`` (``gateway.runtime.pubsub_service``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pydantic import BaseModel

from gateway.pubsub.command_encoding import USR_PROPERTY_NAME
from gateway.pubsub.streams import DEFAULT_STREAM, STREAM_PREFIX, prefixed_topic, split_topic
from gateway.pubsub.topics import Scheme

__all__ = [
    "DEFAULT_STREAM",
    "PROPERTY_NAME",
    "STREAM_PREFIX",
    "DeclaresSubscriptions",
    "DeliveryRefusedError",
    "DescribesRoutes",
    "Envelope",
    "ExchangeHandler",
    "Exchanges",
    "InboundPublication",
    "OwnsEveryTopic",
    "OwnsTopics",
    "Plugin",
    "PluginContext",
    "PluginError",
    "PluginInstance",
    "PublishRefusedError",
    "Publisher",
    "ReportsStats",
    "RouteTarget",
    "Scheme",
    "Sink",
    "begin_publish",
    "split_unified_topic",
    "unified_topic",
]


class PluginError(Exception):
    """A plugin cannot start or continue. ``retriable``: the runtime may restart it."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


class PublishRefusedError(PluginError):
    """An inbound publication can never be published (bad stream, topic, property name,
    payload format, encoding or CCSID). Not retriable: the plugin must dead-letter or
    skip it, not retry it."""

    def __init__(self, message: str, *, index: int = -1, reason: int = 0) -> None:
        super().__init__(message, retriable=False)
        #: Position of the offending publication in the batch given to publish().
        self.index = index
        #: MQ reason code of the refusal (e.g. 2031 MSG_TOO_BIG_FOR_Q_MGR); 0 when the
        #: publication could not even be encoded. Plugins carry it to their dead letters.
        self.reason = reason


class DeliveryRefusedError(PluginError):
    """The target will never accept one outbound envelope (e.g. larger than Kafka's
    ``max.request.size``, a topic the target refuses). Not retriable: the runtime moves
    that envelope to the sink's dead-letter destination with ``reason`` (an MQ reason
    code for the MQDLH) and goes on with the others; it is never sent again."""

    def __init__(self, message: str, *, index: int, reason: int) -> None:
        super().__init__(message, retriable=False)
        #: Position of the refused envelope in the batch given to send().
        self.index = index
        #: MQ reason code recorded with the dead-lettered envelope.
        self.reason = reason


#: What the runtime accepts as an :attr:`Envelope.properties` name on the way in: an
#: MQRFH2 ``usr`` element name (reference §4.3 MQRFH2 folders).
PROPERTY_NAME = USR_PROPERTY_NAME


def unified_topic(stream: str, topic: str) -> str:
    """The engine's unified form of ``topic`` in ``stream`` (``$SYS/STREAM/<s>/<topic>``
    for a named stream, the topic itself on the default stream): what
    :meth:`PluginContext.subscribe` takes."""
    return prefixed_topic(stream, topic)


def split_unified_topic(topic: str) -> tuple[str, str]:
    """(stream, topic within it) of a topic in unified form (inverse of
    :func:`unified_topic`)."""
    st = split_topic(topic)
    return st.stream, st.topic


@dataclass(frozen=True, slots=True)
class Envelope:
    """One publication as plugins see it, in either direction; nothing MQ-specific.

    Outbound the runtime fills every field once per delivery; inbound a plugin fills what
    it knows and the defaults do the rest (the outbound-only fields are ignored there).

    ``topic`` is the topic *within* ``stream`` (no ``$SYS/STREAM/`` prefix).
    ``properties`` are the MQRFH2 ``usr`` folder's properties (a nested group's elements
    as dotted names ``group.name``), in message order; ``property_types`` their ``dt``
    attributes where they have one; ``name_value_pairs`` the user name/value pairs of an
    MQRFH (v1) publisher. Inbound, ``properties`` become MQRFH2 ``usr`` properties (and
    MQRFH user pairs for MQRFH subscribers).
    """

    stream: str
    topic: str
    payload: bytes
    #: MQ format name of the payload ("MQSTR": text in ``ccsid``), its encoding and CCSID.
    payload_format: str = "MQSTR"
    encoding: int = 546
    ccsid: int = 1208
    properties: Mapping[str, str] = field(default_factory=dict)
    persistent: bool = True
    #: The publication is (or replaces) the retained one of its topic.
    retain: bool = False
    #: A DeletePublication of the retained publication on ``topic`` (``payload`` empty).
    delete: bool = False
    #: Lifetime in tenths of a second (-1: unlimited), MQ's unit.
    expiry: int = -1
    #: 24 raw bytes (empty: none / let MQ choose).
    correl_id: bytes = b""
    #: The plugin instance the publication came in through ("" for MQ publishers).
    origin: str = ""
    # ---- outbound only: filled by the runtime from the delivery ------------------------
    #: The same properties as ``properties`` in message order with repeated names kept
    #: (``properties`` keeps the last of a repeated name); sinks that can carry repeats
    #: (Kafka headers, MQTT 5 user properties) read :meth:`property_items`.
    property_list: tuple[tuple[str, str], ...] = ()
    property_types: Mapping[str, str] = field(default_factory=dict)
    name_value_pairs: tuple[tuple[str, str], ...] = ()
    #: Handed over from the retained store on (re)subscription, not published just now.
    from_retained_store: bool = False
    #: The publisher's message id (24 raw bytes) and user identifier.
    msg_id: bytes = b""
    user_identifier: str = ""
    #: When the publication entered MQ (milliseconds since the epoch, UTC), if known.
    put_time_ms: int | None = None
    #: The header the publisher used: "MQRFH" or "MQRFH2".
    publisher_header: str = "MQRFH2"
    priority: int = 0
    sequence_number: str = ""
    publish_timestamp: str = ""
    #: The sink subscription that matched: its stream and topic filter (within the stream).
    subscription_stream: str = ""
    subscription_filter: str = ""
    #: Request/reply information (reply queue and its queue manager, MQ message type and
    #: report options), for request/reply routes. A publish/subscribe delivery has none:
    #: MQ forwards a publication to its subscribers as a datagram from the broker, so these
    #: stay at their defaults there.
    reply_to_q: str = ""
    reply_to_q_mgr: str = ""
    msg_type: int = 8
    report: int = 0
    #: Python codec of ``ccsid`` (None when unknown), for :meth:`text`.
    text_codec: str | None = None
    # ---- request/reply exchanges (docs/request-reply.md) -------------------------------
    #: Where the answer to this message goes, in the plugin's own topic space (MQTT 5
    #: Response Topic, Kafka header ``mq.reply.topic``); "" when none.
    reply_topic: str = ""
    #: The requester's correlation data (MQTT 5 Correlation Data, Kafka header
    #: ``mq.correlation``), returned unchanged with the reply; b"" when none.
    correlation_data: bytes = b""

    def property_items(self) -> tuple[tuple[str, str], ...]:
        """Every property as (name, text) in message order, repeats kept: the runtime's
        ``property_list``, or ``properties`` for an envelope built without one."""
        return self.property_list or tuple(self.properties.items())

    @property
    def is_text(self) -> bool:
        """The payload is text in ``ccsid`` (MQ format MQSTR)."""
        return self.payload_format.strip() == "MQSTR"

    def text(self) -> str:
        """The payload decoded from its CCSID; ValueError when it cannot be."""
        if self.text_codec is None:
            raise ValueError(f"CCSID {self.ccsid} has no known text codec")
        return self.payload.decode(self.text_codec)


#: The inbound name of :class:`Envelope` (what :meth:`Publisher.publish` takes).
InboundPublication = Envelope


class Sink(Protocol):
    """The outbound half every sink subscriber of the engine has (plugin instances, the
    runtime's own wrappers, test doubles): the broker service's one sink protocol.

    ``send`` gets every envelope of one MQ unit of work for this sink and returns only
    once they are safely handed over (acknowledged); raising backs the unit of work out,
    so the publications are offered again later (at-least-once).
    """

    async def send(self, envelopes: Sequence[Envelope]) -> None: ...


class Publisher(Protocol):
    """The way into the engine for inbound data."""

    async def publish(self, publications: Sequence[Envelope]) -> None:
        """Publish all of ``publications`` in one MQ unit of work.

        Returns after the unit of work has committed; raises (nothing committed) when it
        cannot, e.g. while the queue manager is unreachable.
        """
        ...


async def begin_publish(
    publisher: Publisher, publications: Sequence[Envelope]
) -> Awaitable[None]:
    """Publish ``publications`` in one MQ unit of work, returning once the messages are
    in the unit and its commit has begun; what is returned ends when it has committed
    (or raises as :meth:`Publisher.publish` does: nothing committed).

    An instance may take its next batch and begin publishing it before awaiting what
    this returned (its commit overlaps that batch's puts); it acknowledges a batch
    upstream only once the batch's own awaitable has ended. Units commit in the order
    they were begun; when one fails, every unit begun after it fails too (backed out),
    so a retry in order loses and reorders nothing. A publisher without the optional
    verb ``begin_publish`` publishes (and commits) before this returns."""
    native = getattr(publisher, "begin_publish", None)
    if native is not None:
        begun: Awaitable[None] = await native(publications)
        return begun
    await publisher.publish(publications)
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    return done


class PluginContext(Protocol):
    """What the runtime gives a plugin instance."""

    @property
    def gateway_id(self) -> str:
        """This gateway's identity (stable across restarts; used for client ids/origins)."""
        ...

    @property
    def publisher(self) -> Publisher: ...

    async def subscribe(self, topic: str, *, scheme: Scheme = Scheme.TOPIC) -> None:
        """Subscribe this instance (as a sink) to ``topic`` in unified form
        (``$SYS/STREAM/<stream>/...`` for named streams). Durable and idempotent: the
        subscription survives restarts; subscribing again changes nothing."""
        ...

    async def unsubscribe(self, topic: str, *, scheme: Scheme = Scheme.TOPIC) -> bool:
        """Remove a subscription of this instance; False when there was none."""
        ...


@runtime_checkable
class DeclaresSubscriptions(Protocol):
    """An instance that can say, from its configuration alone (no I/O), which
    subscriptions its routes need. The runtime registers them before the broker service
    gets its first message, so nothing published before the plugin has started is lost
    (the deliveries wait for it)."""

    def planned_subscriptions(self) -> Sequence[tuple[str, Scheme]]:
        """(topic in unified form, scheme) of every outbound route."""
        ...


@runtime_checkable
class PluginInstance(Sink, Protocol):
    """One configured instance of a plugin (e.g. the ``kafka`` plugin towards one cluster):
    a :class:`Sink` of the engine with a lifetime."""

    @property
    def name(self) -> str:
        """The instance name from the config (also its sink name in the engine)."""
        ...

    async def start(self, context: PluginContext) -> None:
        """Connect, subscribe to what the config maps outbound, start inbound consumers.
        Raise PluginError with a clear message when the config cannot work."""
        ...

    async def flush(self) -> None:
        """Return once everything handed over so far is acknowledged by the target."""
        ...

    async def stop(self) -> None:
        """Stop consuming, finish in-flight units of work, flush, disconnect."""
        ...

    def healthy(self) -> bool:
        """True while connected and able to make progress (for /healthz)."""
        ...


@runtime_checkable
class ReportsStats(Protocol):
    """Optional for a :class:`PluginInstance`: its own counters (and 0/1 states), read at
    each ``/metrics`` scrape and exported as ``mqgw_plugin_stat{plugin, stat}``; e.g. the
    Kafka source's ``inbound_commit_failures``. Cheap: no I/O, no locking."""

    def stats(self) -> Mapping[str, int]: ...


@dataclass(frozen=True, slots=True)
class RouteTarget:
    """One configured route of a plugin instance as an operator reads it: the MQ stream
    it feeds (``direction="in"``) or is fed by (``"out"``) and the name in the plugin's
    own topic space (a Kafka topic, an MQTT topic or filter; ``{topic}`` marks a part
    taken from each publication's MQ topic)."""

    direction: str
    stream: str
    target: str


@runtime_checkable
class DescribesRoutes(Protocol):
    """Optional for a :class:`PluginInstance`: its routes from its configuration alone
    (no I/O), for the dashboard's network picture (docs/dashboard.md)."""

    def route_targets(self) -> Sequence[RouteTarget]: ...


@runtime_checkable
class OwnsTopics(Protocol):
    """Optional for a :class:`PluginInstance`: the names of its topic space it keeps for
    itself -- the topics its routes write (outbound stream and retained topics, its
    dead-letter topics, internal topics) and read (inbound topics and filters) -- so the
    runtime never writes there what an outside party named, e.g. the reply topic a
    requester chose (docs/security.md, "Destinations named from outside"). No I/O."""

    def own_topic(self, topic: str) -> str:
        """Why ``topic`` (a name the instance would publish to) is one of the instance's
        own, in one sentence for logs and dead letters; "" when it is not."""
        ...


@runtime_checkable
class OwnsEveryTopic(Protocol):
    """Optional for a :class:`Plugin`: whether an instance with ``config`` would keep
    every name of its topic space for itself (its :meth:`OwnsTopics.own_topic` never
    ""), from the configuration alone. Then no reply topic a request/reply requester
    route names can ever be written through that plugin's instances: ``mqgw run
    --check`` refuses such routes instead of every request being refused at run time."""

    def every_topic_own(self, instance_name: str, config: BaseModel) -> str:
        """Why every topic is the instance's own (one sentence), or "" when not."""
        ...


@runtime_checkable
class Plugin(Protocol):
    """What a ``mqgw.plugins`` entry point names."""

    @property
    def name(self) -> str: ...

    @property
    def config_model(self) -> type[BaseModel]:
        """The pydantic model of one instance's ``config:`` section."""
        ...

    def create(self, instance_name: str, config: BaseModel) -> PluginInstance:
        """Build an instance from its validated config (no I/O here)."""
        ...


#: What :meth:`Exchanges.consume` hands each batch of received messages to. It returns
#: only once the next hop has them (MQ unit of work committed, or the reply sent); then
#: the plugin acknowledges them upstream.
ExchangeHandler = Callable[[Sequence[Envelope]], Awaitable[None]]


@runtime_checkable
class Exchanges(Protocol):
    """Optional for a :class:`PluginInstance`: point-to-point request/reply traffic in
    the plugin's own topic space (docs/request-reply.md), next to its publish/subscribe
    routes. The runtime's request/reply routes use it; plugins stay MQ-free.

    Exchange envelopes have ``stream == ""`` and ``topic`` = the plugin-native topic
    (a Kafka topic, an MQTT topic). ``reply_topic``, ``correlation_data`` and ``expiry``
    travel as the protocol's own reply information (MQTT 5 Response Topic, Correlation
    Data, Message Expiry Interval; Kafka headers ``mq.reply.topic``, ``mq.correlation``,
    ``mq.expiry``), ``properties`` as MQTT 5 user properties / Kafka headers by name.
    """

    async def consume(self, route: str, sources: Sequence[str], handler: ExchangeHandler) -> None:
        """Start handing messages that arrive on ``sources`` (Kafka topics, MQTT topic
        filters) to ``handler`` in batches, in arrival order, until :meth:`stop`.

        ``route`` names a durable consumer (Kafka group ``<gateway_id>.rr.<route>``, MQTT
        the instance's persistent session), so nothing sent while the gateway is down is
        lost. A message is acknowledged upstream (offset committed, PUBACK) only after
        ``handler`` returned for its batch. ``handler`` raising :class:`PluginError`
        ``retriable=True``: the batch is offered again after a backoff.
        :class:`PublishRefusedError`: the message at ``.index`` is dead-lettered as the
        plugin does for refused inbound publications and acknowledged; those before it
        were handled, those after it are offered again. Called after :meth:`start`;
        calling it again for the same ``route`` changes nothing."""
        ...

    async def produce(self, envelopes: Sequence[Envelope]) -> None:
        """Send each envelope to its ``topic``; return once the target has acknowledged
        all of them (Kafka acks=all, MQTT QoS 1 PUBACK). Raises :class:`PluginError`
        ``retriable=True`` while the target is down (the caller retries), and
        :class:`DeliveryRefusedError` for one envelope that can never be sent."""
        ...
