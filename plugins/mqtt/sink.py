"""Outbound: envelopes → MQTT publications (the instance's sink half).

``send`` publishes one MQ unit of work's envelopes, pipelined and in order, and returns
only after every PUBACK (QoS 1) / PUBCOMP (QoS 2) arrived; any failure (connection down,
timeout, a broker refusal) raises, the broker service backs the MQ unit of work out and
the publications are offered again: at-least-once, nothing lost while MQTT is down.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.plugin_api import Envelope
from plugins.mqtt.config import OutboundConfig
from plugins.mqtt.connection import MqttConnection, Outgoing
from plugins.mqtt.mapping import (
    expiry_interval,
    mqtt_topic,
    qos_for,
    user_properties,
)

#: Text payloads in these CCSIDs are UTF-8 already.
_UTF8_CCSIDS = frozenset({1208, 1209})


@dataclass(slots=True)
class SinkCounters:
    published: int = 0
    deletions: int = 0
    units_of_work: int = 0
    failures: int = 0


def to_outgoing(envelope: Envelope, config: OutboundConfig, *, v5: bool) -> Outgoing:
    """The MQTT message for one envelope (pure)."""
    e = envelope
    topic = mqtt_topic(e.stream, e.topic, config)
    qos = qos_for(e.persistent, config)
    if e.delete:
        # MQTT deletes a retained message with an empty retained one (MQTT 5.0 §3.3.1.3).
        return Outgoing(topic, b"", config.qos_persistent, True)
    payload = e.payload
    utf8 = False
    if e.is_text:
        if e.ccsid in _UTF8_CCSIDS:
            utf8 = True
        elif config.convert_text:
            try:
                payload = e.text().encode("utf-8")
                utf8 = True
            except ValueError:
                pass  # not text in its declared CCSID: forwarded as is
    props: list[tuple[str, str]] = []
    expiry: int | None = None
    if v5:
        if config.user_properties:
            props = user_properties(e)
        if config.message_expiry:
            expiry = expiry_interval(e.expiry)
    return Outgoing(topic, payload, qos, e.retain, props, expiry, utf8 and v5)


class MqttSink:
    """Publishes envelopes through the instance's connection."""

    def __init__(self, config: OutboundConfig, connection: MqttConnection) -> None:
        self.config = config
        self.connection = connection
        self.counters = SinkCounters()

    async def send(self, envelopes: Sequence[Envelope]) -> None:
        if not envelopes:
            return
        messages = [to_outgoing(d, self.config, v5=self.connection.v5) for d in envelopes]
        try:
            await self.connection.publish_all(messages, self.config.ack_timeout)
        except BaseException:
            self.counters.failures += 1
            raise
        c = self.counters
        c.units_of_work += 1
        c.published += len(messages)
        c.deletions += sum(1 for d in envelopes if d.delete)
