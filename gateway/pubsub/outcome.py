"""What the engine hands the I/O layer: the message it got and the outcome of handling it.

Kept apart from :mod:`gateway.pubsub.engine` so the runtime and the plugin contract can
name these types without importing the engine's state machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.pubsub.commands import Command
from gateway.pubsub.records import Destination, Publication, SubKey
from gateway.pubsub.responses import ResponseDetail
from gateway.pubsub.store import Mutation
from gateway.wire.constants import CompCode
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

__all__ = [
    "Counters",
    "DeadLetter",
    "Delivery",
    "InboundMessage",
    "OutboundMessage",
    "Outcome",
]


@dataclass(slots=True)
class InboundMessage:
    """A message got from a serviced queue."""

    queue: str
    md: MQMD
    body: bytes
    implicit_stream_naming: bool = True


@dataclass(slots=True)
class OutboundMessage:
    """A message to put: ``queue`` at ``q_mgr`` (blank = resolve locally)."""

    q_mgr: str
    queue: str
    md: MQMD
    body: bytes


@dataclass(slots=True)
class Delivery:
    """One publication for one subscriber.

    For an MQ subscriber ``md``/``body`` are the message to put on
    ``destination.queue`` at ``destination.q_mgr``; for a sink they are the forwarded
    MQMD and the bare payload, and ``publication``/``topic`` carry everything parsed.
    ``topic`` is as the subscriber sees it (prefixed for MQRFH2 and sinks).

    ``deleted`` (sinks only): a DeletePublication removed the retained publication on
    ``topic``; ``body`` is empty and ``publication`` describes what was deleted. Sinks
    mirror it (Kafka tombstone, MQTT empty retained message).
    """

    destination: Destination
    subscription: SubKey
    md: MQMD
    body: bytes
    publication: Publication
    topic: str
    retained: bool
    deleted: bool = False


@dataclass(slots=True)
class DeadLetter:
    """Send the inbound message to the dead-letter queue with this MQDLH reason."""

    reason: int
    detail: str


@dataclass(slots=True)
class Outcome:
    """What handling one inbound message produced.

    ``forwards`` are command messages for neighbour brokers (a propagated DeletePub):
    the service puts them in the same unit of work as the deliveries.
    """

    command: Command | None = None
    comp_code: int = CompCode.OK
    reason: int = Reason.NONE
    detail: ResponseDetail = field(default_factory=ResponseDetail)
    deliveries: list[Delivery] = field(default_factory=list)
    response: OutboundMessage | None = None
    dead_letter: DeadLetter | None = None
    mutations: list[Mutation] = field(default_factory=list)
    forwards: list[OutboundMessage] = field(default_factory=list)


@dataclass(slots=True)
class Counters:
    """The engine's monotonic counters (the service exports them as metrics)."""

    commands: int = 0
    publications: int = 0
    deliveries: int = 0
    responses: int = 0
    dead_letters: int = 0
    refused: int = 0
