"""Streams: how a message's stream is chosen and how streams map onto topics.

The rule is WebSphere Message Broker's (the seed ``streams.en.txt``; reference §5.8):
a stream other than ``SYSTEM.BROKER.DEFAULT.STREAM`` makes every topic behave as if it
were prefixed with ``$SYS/STREAM/<stream>/``. Internally every topic is therefore a pair
``(stream, topic within the stream)``; subscriptions and retained publications are
partitioned by stream, so wildcards never match across streams.

* MQRFH (v1) commands name a stream with ``MQPSStreamName`` on any serviced queue; a
  publication without one takes the queue's own name when the queue's *Implicit Stream
  Naming* is on (the default), the default stream when it is off. Control-queue commands
  without a stream name mean the default stream.
* MQRFH2 applications cannot name a stream; they write the prefix into the topic.
* MQRFH subscribers receive topics without the prefix and the stream in MQPSStreamName;
  MQRFH2 subscribers receive the full prefixed topic.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.pubsub.errors import CommandError
from gateway.pubsub.topics import Scheme, check_topic_pattern, compile_char_pattern
from gateway.wire.reasons import Reason

DEFAULT_STREAM = "SYSTEM.BROKER.DEFAULT.STREAM"
CONTROL_QUEUE = "SYSTEM.BROKER.CONTROL.QUEUE"
ADMIN_STREAM = "SYSTEM.BROKER.ADMIN.STREAM"
INTER_BROKER_QUEUE = "SYSTEM.BROKER.INTER.BROKER.COMMUNICATIONS"
STREAM_PREFIX = "$SYS/STREAM/"
#: MQ object names are at most 48 characters (MQ_Q_NAME_LENGTH).
MAX_STREAM_NAME = 48
_STREAM_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%")


@dataclass(frozen=True, slots=True)
class StreamTopic:
    """A topic inside one stream: the unit that subscriptions and retained pubs key on."""

    stream: str
    topic: str

    @property
    def full_topic(self) -> str:
        """The topic as an MQRFH2 application sees it (prefixed unless default stream)."""
        return prefixed_topic(self.stream, self.topic)


def validate_stream_name(name: str, parm_id: str = "MQPSStreamName") -> str:
    """A stream name is a queue name: 1-48 characters of A-Z a-z 0-9 . _ %."""
    if not name or len(name) > MAX_STREAM_NAME or not set(name) <= _STREAM_CHARS:
        raise CommandError(
            Reason.STREAM_ERROR, f"invalid stream name {name!r}", parm_id=parm_id, value=name
        )
    return name


def prefixed_topic(stream: str, topic: str) -> str:
    """``$SYS/STREAM/<stream>/<topic>`` for a named stream; the topic itself otherwise."""
    if stream == DEFAULT_STREAM:
        return topic
    return f"{STREAM_PREFIX}{stream}/{topic}"


def split_topic(full_topic: str) -> StreamTopic:
    """Split a topic of the unified space into its stream and the topic within it.

    A topic belongs to stream ``S`` exactly when it starts with ``$SYS/STREAM/S/``;
    anything else is a topic of the default stream. ``$SYS/STREAM/SYSTEM.BROKER.DEFAULT.
    STREAM/T`` is the default stream's ``T``.
    """
    if not full_topic.startswith(STREAM_PREFIX):
        return StreamTopic(DEFAULT_STREAM, full_topic)
    rest = full_topic[len(STREAM_PREFIX) :]
    slash = rest.find("/")
    if slash <= 0:
        return StreamTopic(DEFAULT_STREAM, full_topic)
    stream = rest[:slash]
    if len(stream) > MAX_STREAM_NAME or not set(stream) <= _STREAM_CHARS:
        # Not a stream name (a wildcard, a blank...): the caller decides whether that is
        # an error (subscriptions) or a literal topic of the default stream.
        return StreamTopic(DEFAULT_STREAM, full_topic)
    return StreamTopic(stream, rest[slash + 1 :])


def stream_segment(full_topic: str) -> str | None:
    """The raw text where a stream name would be (``$SYS/STREAM/<this>/``), if any."""
    if not full_topic.startswith(STREAM_PREFIX):
        return None
    rest = full_topic[len(STREAM_PREFIX) :]
    slash = rest.find("/")
    return rest if slash < 0 else rest[:slash]


def split_subscription_topic(full_topic: str, scheme: Scheme, parm: str) -> StreamTopic:
    """Validate a subscription pattern of the unified topic space and split off its
    stream; a wildcard where the stream name would be is refused (``parm`` names the
    command parameter in the error): wildcards never match across streams."""
    if scheme is Scheme.TOPIC:
        check_topic_pattern(full_topic, parm)
    else:
        compile_char_pattern(full_topic, parm)
    segment = stream_segment(full_topic)
    st = split_topic(full_topic)
    if (
        segment is not None
        and st.stream == DEFAULT_STREAM
        and "/" in full_topic[len(STREAM_PREFIX) :]
    ):
        wild = segment in ("#", "+") if scheme is Scheme.TOPIC else any(c in segment for c in "*?%")
        if wild:
            raise CommandError(
                Reason.STREAM_ERROR,
                "wildcards cannot match across streams",
                parm_id=parm,
                value=full_topic,
            )
    return st


def resolve_stream(
    command_stream: str | None,
    arrived_on: str,
    implicit_stream_naming: bool,
    *,
    is_stream_command: bool,
) -> str:
    """The stream of an MQRFH (v1) command, per the seed's notes P1/P2 and S1/S2.

    ``command_stream`` is the MQPSStreamName value (None when absent). Publish and
    DeletePub (``is_stream_command``) without one take the queue they arrived on when
    its Implicit Stream Naming is on, else the default stream; other commands default
    to the default stream. Arriving on the control queue never names a stream.
    """
    if command_stream is not None:
        return validate_stream_name(command_stream)
    if is_stream_command and implicit_stream_naming and arrived_on != CONTROL_QUEUE:
        # The queue name becomes a stream name: one with '/' would publish into another
        # stream's topic space, so it is refused like a bad MQPSStreamName.
        return validate_stream_name(arrived_on)
    return DEFAULT_STREAM
