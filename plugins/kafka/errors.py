"""Errors of the Kafka plugin: one root, each carrying the data needed to act on it."""

from __future__ import annotations

from gateway.plugin_api import PluginError

#: MQ reason codes given with an envelope Kafka refuses for good (DeliveryRefusedError):
#: larger than max_request_size / message.max.bytes, a topic name Kafka refuses, a topic
#: the credentials may not write.
MQRC_MSG_TOO_BIG_FOR_Q = 2030
MQRC_UNKNOWN_OBJECT_NAME = 2085
MQRC_NOT_AUTHORIZED = 2035


class KafkaPluginError(PluginError):
    """Root of the Kafka plugin's errors (a :class:`PluginError` for the runtime)."""


class TopicNameError(KafkaPluginError):
    """A template renders a name Kafka refuses (``name``: what it rendered, ``template``)."""

    def __init__(self, message: str, *, template: str, name: str = "") -> None:
        super().__init__(message)
        self.template = template
        self.name = name


class TopicCollisionError(KafkaPluginError):
    """Two mapping sources render Kafka topic names that collide.

    Kafka refuses (or silently merges the metrics of) names equal once ``.`` and ``_``
    are treated alike; merging two streams would also merge their key spaces, which on a
    compacted retained topic loses data. ``first``/``second`` describe the sources.
    """

    def __init__(self, first: str, second: str, first_name: str, second_name: str) -> None:
        if first_name == second_name:
            what = f"both map to Kafka topic {first_name!r}"
        else:
            what = (
                f"map to Kafka topics {first_name!r} and {second_name!r}, which collide "
                "(Kafka treats '.' and '_' alike in topic names)"
            )
        super().__init__(
            f"Kafka topic collision: {first} and {second} {what}; give one of them its own "
            "kafka_topic template (one that includes {stream}) in the kafka plugin config"
        )
        self.first = first
        self.second = second
        self.first_name = first_name
        self.second_name = second_name


class KafkaSendError(KafkaPluginError):
    """Kafka did not acknowledge a batch. ``retriable``: Kafka is unavailable, the broker
    service holds the MQ unit of work and retries. (A record Kafka refuses for good is a
    ``DeliveryRefusedError`` for its envelope instead.)"""

    def __init__(
        self, message: str, *, topic: str = "", failed: int = 0, retriable: bool = True
    ) -> None:
        super().__init__(message, retriable=retriable)
        self.topic = topic
        self.failed = failed


class KafkaSecurityError(KafkaPluginError):
    """TLS or SASL failed (``cause``: ``tls``, ``sasl`` or ``secret``): a certificate the
    client refuses (expired, unknown CA, host name mismatch), a login the broker refuses,
    a secret that cannot be read. Retriable: the runtime retries with capped backoff, and
    a fixed certificate or rotated secret takes effect on the next attempt. The message
    names the instance and the cause; it never carries a secret."""

    def __init__(self, message: str, *, cause: str) -> None:
        super().__init__(message, retriable=True)
        self.cause = cause
