"""QoS 2 inbound across a reconnect, without a broker: paho sent PUBREC on arrival and
delivered the message after PUBREL, so the broker will never resend the PUBLISH. A QoS 2
message that arrived on an older connection must still be published into MQ and
acknowledged (PUBCOMP) on the current link; QoS 1 ones are left for redelivery."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from gateway.plugin_api import InboundPublication, PublishRefusedError
from plugins.mqtt.config import InboundConfig, MqttConfig
from plugins.mqtt.connection import MqttConnection, Received
from plugins.mqtt.source import MqttSource


def _message(mid: int, qos: int, topic: str = "sensors/a") -> paho.MQTTMessage:
    msg = paho.MQTTMessage(mid, topic.encode())
    msg.qos = qos
    msg.payload = b"v"
    return msg


class FakeConnection:
    def __init__(self) -> None:
        self.generation = 2
        self.acked: list[tuple[int, int]] = []
        self.parked: list[str] = []

    async def publish_all(self, outgoing: Sequence[Any], timeout: float) -> None:
        self.parked.extend(o.topic for o in outgoing)

    def ack(self, received: Received) -> bool:
        self.acked.append((received.message.mid, received.generation))
        return True


class RecordingPublisher:
    def __init__(self, refuse_topic: str = "") -> None:
        self.published: list[InboundPublication] = []
        self.refuse_topic = refuse_topic

    async def publish(self, publications: Sequence[InboundPublication]) -> None:
        for i, pub in enumerate(publications):
            if pub.topic == self.refuse_topic:
                raise PublishRefusedError("bad", index=i)
        self.published.extend(publications)


def _source(publisher: RecordingPublisher, conn: FakeConnection) -> MqttSource:
    config = InboundConfig.model_validate({"filters": [{"filter": "sensors/#", "qos": 2}]})
    return MqttSource(config, cast(MqttConnection, conn), publisher, "m1")


async def test_qos2_message_of_an_older_connection_is_published_and_acked() -> None:
    conn, publisher = FakeConnection(), RecordingPublisher()
    source = _source(publisher, conn)
    old_qos2 = Received(_message(7, 2), 1)
    old_qos1 = Received(_message(8, 1), 1)
    current = Received(_message(9, 1), 2)
    await source._handle([old_qos2, old_qos1, current])
    assert len(publisher.published) == 2
    assert sorted(mid for mid, _ in conn.acked) == [7, 9]
    assert source.counters.abandoned == 1  # only the QoS 1 one, redelivered by the broker


async def test_refused_message_is_dropped_and_acked_and_the_rest_published() -> None:
    conn, publisher = FakeConnection(), RecordingPublisher(refuse_topic="sensors/bad")
    source = _source(publisher, conn)
    batch = [Received(_message(1, 2, "sensors/ok"), 2), Received(_message(2, 2, "sensors/bad"), 2)]
    await source._handle(batch)
    assert [p.topic for p in publisher.published] == ["sensors/ok"]
    assert sorted(mid for mid, _ in conn.acked) == [1, 2]
    assert source.counters.dead_lettered == 1
    assert [t.endswith("/sensors/bad") for t in conn.parked] == [True]


class AckRecordingPaho(paho.Client):
    """A real paho client that records acknowledgements instead of sending them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acks: list[tuple[int, int]] = []

    def ack(self, mid: int, qos: int) -> paho.MQTTErrorCode:
        self.acks.append((mid, qos))
        return paho.MQTTErrorCode.MQTT_ERR_SUCCESS


def _link_event(client: paho.Client, *, up: bool) -> None:
    """What paho reports for a CONNACK (``up``) or a lost link, through the callbacks
    the connection registered on its client."""
    reason = ReasonCode(PacketTypes.CONNACK, identifier=0 if up else 0x80)
    if up:
        client.on_connect(client, None, paho.ConnectFlags(False), reason, None)
    else:
        client.on_disconnect(client, None, paho.DisconnectFlags(False), reason, None)


async def test_connection_acks_qos2_on_the_current_link_but_not_stale_qos1() -> None:
    clients: list[AckRecordingPaho] = []

    def factory(**kwargs: Any) -> AckRecordingPaho:
        clients.append(AckRecordingPaho(**kwargs))
        return clients[-1]

    conn = MqttConnection(
        MqttConfig(),
        "cid",
        on_message=lambda _: None,
        subscriptions=lambda: [],
        client_factory=factory,
    )
    [fake] = clients
    _link_event(fake, up=True)  # connection 1
    _link_event(fake, up=True)  # connection 2 (a reconnect): generation 2, link up
    assert conn.generation == 2
    assert conn.ack(Received(_message(7, 2), 1))
    assert not conn.ack(Received(_message(8, 1), 1))
    assert conn.ack(Received(_message(9, 1), 2))
    assert fake.acks == [(7, 2), (9, 1)]
    _link_event(fake, up=False)
    assert not conn.ack(Received(_message(10, 2), 2))
