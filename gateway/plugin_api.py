"""The contract plugins import — and nothing deeper.

A plugin bridges the gateway's publish/subscribe engine to one modern broker (Kafka,
MQTT, ...). It is found through the ``mqgw.plugins`` entry-point group, which names an
object satisfying :class:`Plugin`; nothing registers on import. The runtime builds one
:class:`PluginInstance` per configured instance and gives it a :class:`PluginContext`.

Two directions, each with the acknowledgement travelling with the data (Redpanda
Connect's rule):

* **outbound** (MQ → plugin): the instance is a *sink* subscriber of the engine. Its
  :meth:`PluginInstance.send` gets every delivery of one MQ unit of work for it and returns
  only when the target broker has them safely (Kafka acks=all, MQTT PUBACK/PUBCOMP).
  Raising backs the MQ unit of work out, so the publications are offered again: outbound
  delivery is at-least-once and MQ messages wait on their queue while a plugin is down.
* **inbound** (plugin → MQ): the instance calls :meth:`Publisher.publish` with a batch of
  :class:`InboundPublication`; it returns only after the MQ unit of work carrying them has
  committed. Only then may the instance acknowledge upstream (commit Kafka offsets, send
  the MQTT PUBACK).

Details every plugin relies on:

* ``Delivery.deleted`` is True when a DeletePublication removed the retained publication
  on ``Delivery.topic``: ``body`` is empty, ``publication`` describes what was deleted,
  ``retained`` is True. Mirror it (Kafka tombstone, MQTT empty retained message).
* ``Publication`` carries the publishing message's identity for sinks: ``msg_id``,
  ``correl_id`` (24 raw bytes), ``user_identifier``, ``put_date``/``put_time`` (MQMD
  PutDate/PutTime) and ``header`` (``"MQRFH"``/``"MQRFH2"``); a sink delivery's ``md``
  carries the same MsgId/CorrelId/UserIdentifier/PutDate/PutTime.
* ``Publication.origin`` names the instance a publication came in through; the engine
  never delivers it back to that instance (no bridging loops), retained ones included.
* ``send`` raising an exception with ``retriable = True`` (:class:`PluginError`
  ``retriable=True``; wrap connection errors in it) means "target down": the broker
  keeps the MQ unit of work open and calls ``send`` again with the same deliveries
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
  name not an XML name, wildcard delete, payload format/encoding/CCSID MQ cannot carry):
  skip or dead-letter it, never retry it.
* The runtime implementation is ``gateway.runtime.plugin_host`` (``PluginHost``,
  ``HostedPluginContext``, ``MQPublisher``); tests may build those directly over an
  ``EmbeddedQueueManager`` and a ``BrokerService``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pydantic import BaseModel

from gateway.pubsub.outcome import Delivery
from gateway.pubsub.records import Publication
from gateway.pubsub.streams import DEFAULT_STREAM
from gateway.pubsub.topics import Scheme

__all__ = [
    "DEFAULT_STREAM",
    "PROPERTY_NAME",
    "Delivery",
    "InboundPublication",
    "Plugin",
    "PluginContext",
    "PluginError",
    "PluginInstance",
    "Publication",
    "PublishRefusedError",
    "Publisher",
    "Scheme",
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

    def __init__(self, message: str, *, index: int = -1) -> None:
        super().__init__(message, retriable=False)
        #: Position of the offending publication in the batch given to publish().
        self.index = index


#: What the runtime accepts as an :attr:`InboundPublication.properties` name: an MQRFH2
#: ``usr`` element name (reference §4.3 MQRFH2 folders).
PROPERTY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


@dataclass(slots=True)
class InboundPublication:
    """One publication a plugin brings into the MQ publish/subscribe network.

    ``topic`` is the topic *within* ``stream`` (no ``$SYS/STREAM/`` prefix). ``delete``
    makes it a DeletePublication of the retained publication on ``topic`` (payload
    ignored). ``properties`` become MQRFH2 ``usr`` properties (and MQRFH user name/value
    pairs for MQRFH subscribers). ``origin`` names the plugin instance it came from, so
    that instance does not receive its own publication back (no bridging loops).
    """

    stream: str
    topic: str
    payload: bytes
    payload_format: str = "MQSTR"
    encoding: int = 546
    ccsid: int = 1208
    properties: Mapping[str, str] = field(default_factory=dict)
    persistent: bool = True
    retain: bool = False
    delete: bool = False
    expiry: int = -1
    correl_id: bytes = b""
    origin: str = ""


class Publisher(Protocol):
    """The way into the engine for inbound data."""

    async def publish(self, publications: Sequence[InboundPublication]) -> None:
        """Publish all of ``publications`` in one MQ unit of work.

        Returns after the unit of work has committed; raises (nothing committed) when it
        cannot, e.g. while the queue manager is unreachable.
        """
        ...


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
class PluginInstance(Protocol):
    """One configured instance of a plugin (e.g. the ``kafka`` plugin towards one cluster)."""

    @property
    def name(self) -> str:
        """The instance name from the config (also its sink name in the engine)."""
        ...

    async def start(self, context: PluginContext) -> None:
        """Connect, subscribe to what the config maps outbound, start inbound consumers.
        Raise PluginError with a clear message when the config cannot work."""
        ...

    async def send(self, deliveries: Sequence[Delivery]) -> None:
        """Outbound: hand over one MQ unit of work's deliveries; return once acknowledged."""
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
