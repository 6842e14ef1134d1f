"""Reading a legacy broker's stream set for ``mqgw migrate --from-broker QM`` from its
retained ``MQ/<QM padded to 48>/StreamSupport`` publication on
``SYSTEM.BROKER.ADMIN.STREAM``: a Register Subscriber on that metatopic (the broker sends
the retained publication at registration), the publication read with
:func:`gateway.runtime.neighbours.stream_support.read_stream_support` (the neighbour
links' reader: PCF decoded by ``decode_admin_publication``), then a Deregister
Subscriber. The same documented exchange a joining broker uses to learn its neighbour's
streams, so a real broker can stand on the other side.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from gateway.mq.port import Connection, MQError
from gateway.pubsub.admin_messages import admin_topic
from gateway.pubsub.deliveries import escape_char_topic
from gateway.pubsub.streams import ADMIN_STREAM
from gateway.runtime.neighbours.stream_support import read_stream_support
from gateway.runtime.streams.broker_query import ask_broker, send_command

__all__ = ["StreamSupport", "StreamSupportError", "ask_stream_support"]


@dataclass(frozen=True, slots=True)
class StreamSupport:
    """The broker's streams (without the admin stream, which every broker has), and
    what went wrong after they were read (the DeregSub), if anything."""

    streams: list[str]
    warning: str | None = None


class StreamSupportError(Exception):
    """The broker's stream set could not be read; ``answered`` is False when nothing
    came back at all (check the channels and transmission queues)."""

    def __init__(self, message: str, *, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


async def ask_stream_support(conn: Connection, broker: str, *, timeout: float) -> StreamSupport:
    """The streams ``broker`` publishes in its StreamSupport metatopic, sorted (the
    migration queue must exist on ``conn``'s queue manager). StreamSupportError when
    the broker does not answer, refuses, or has no such publication."""
    topic = admin_topic("StreamSupport", broker)
    pattern = escape_char_topic(topic)
    try:
        answer = await ask_broker(conn, broker, "RegSub", ADMIN_STREAM, pattern, timeout)
    except MQError:
        with contextlib.suppress(MQError):
            await conn.backout()
        raise
    streams: list[str] | None = None
    for msg in answer.messages:
        read = read_stream_support(msg.md, msg.body)
        if read is not None and read[0] == broker:  # else: consumed with the unit of work
            streams = sorted(set(read[1]) - {ADMIN_STREAM})
    if answer.error is not None and not answer.answered:
        # the RegSub may still arrive (it expires after twice the timeout): a DeregSub
        # behind it on the same route withdraws it then, expiring with it otherwise
        await send_command(conn, broker, "DeregSub", ADMIN_STREAM, pattern, timeout * 2)
    await conn.commit()
    if answer.error is not None:
        raise StreamSupportError(answer.error, answered=answer.answered)
    deregistered = await ask_broker(conn, broker, "DeregSub", ADMIN_STREAM, pattern, timeout)
    await conn.commit()
    if streams is None:
        raise StreamSupportError(
            f"broker {broker} accepted the subscription to {topic.rstrip()!r} but sent no "
            "retained StreamSupport publication (does it publish one?)",
            answered=True,
        )
    warning = None
    if deregistered.error is not None:
        warning = (
            f"the subscription to {topic.rstrip()!r} at {broker} may be left: {deregistered.error}"
        )
    return StreamSupport(streams, warning)
