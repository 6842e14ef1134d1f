"""The plugin's paho client (plugins/mqtt/connection.py ``PahoClient``) skips paho's scan
for queued messages after each acknowledgement while nothing is queued, and paho's DEBUG
lines unless they would be logged. Both must change nothing a user sees: messages held
behind a full in-flight window still go out as acknowledgements free it, and
``mqgw -vv`` still shows paho's DEBUG lines."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, ClassVar

import aiomqtt
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from gateway.devstack import MosquittoBroker
from plugins.mqtt.config import MqttConfig
from plugins.mqtt.connection import (
    MqttConnection,
    Outgoing,
    PahoClient,
    paho_log,
    set_no_delay,
)


async def test_messages_behind_a_full_in_flight_window_are_all_published_in_order(
    mqtt_broker: MosquittoBroker,
) -> None:
    """20 QoS 1 messages through a window of 2: paho queues 18 and sends each as an
    acknowledgement frees a place (the path the skipped scan must not lose)."""
    n, topic = 20, "paho-window/t"
    config = MqttConfig(protocol="5", port=mqtt_broker.port, max_inflight=2)
    received: list[bytes] = []
    async with aiomqtt.Client(mqtt_broker.host, port=mqtt_broker.port,
                              identifier="paho-window-sub") as sub:
        await sub.subscribe(topic, qos=1)
        conn = MqttConnection(config, "paho-window-pub", on_message=lambda _: None,
                              subscriptions=lambda: [])
        await conn.start()
        try:
            assert isinstance(conn._client, PahoClient)
            messages = [Outgoing(topic, f"{i:03d}".encode(), 1, False) for i in range(n)]
            await conn.publish_all(messages, timeout=20)
            assert not conn._client._out_messages  # every one acknowledged
        finally:
            await conn.close()

        async def collect() -> None:
            async for msg in sub.messages:
                assert isinstance(msg.payload, bytes)
                received.append(msg.payload)
                if len(received) == n:
                    return

        await asyncio.wait_for(collect(), 20)
    assert received == [f"{i:03d}".encode() for i in range(n)]


@pytest.mark.parametrize("debug", [False, True])
def test_paho_debug_lines_reach_on_log_only_when_they_would_be_logged(debug: bool) -> None:
    seen: list[tuple[int, str]] = []
    client = PahoClient(callback_api_version=CallbackAPIVersion.VERSION2, client_id="log")
    client.on_log = lambda _c, _u, level, text: seen.append((level, text))
    before = paho_log.level
    paho_log.setLevel(logging.DEBUG if debug else logging.INFO)
    try:
        client._easy_log(paho.MQTT_LOG_DEBUG, "Sending %s", "PUBLISH")
        client._easy_log(paho.MQTT_LOG_ERR, "failed to receive on socket: %s", "reset")
    finally:
        paho_log.setLevel(before)
    expected = [(paho.MQTT_LOG_ERR, "failed to receive on socket: reset")]
    if debug:
        expected.insert(0, (paho.MQTT_LOG_DEBUG, "Sending PUBLISH"))
    assert seen == expected


class _NoScan(dict[int, paho.MQTTMessage]):
    """Held messages that fail the test if paho scans them."""

    def values(self):  # type: ignore[override]
        raise AssertionError("paho scanned the held messages")


def _held(n: int, state: int = paho.mqtt_ms_wait_for_puback) -> dict[int, paho.MQTTMessage]:
    held = {}
    for mid in range(1, n + 1):
        msg = paho.MQTTMessage(mid, b"t")
        msg.qos, msg.state = 1, state
        held[mid] = msg
    return held


def test_no_scan_for_queued_messages_while_every_held_one_is_in_flight() -> None:
    client = PahoClient(callback_api_version=CallbackAPIVersion.VERSION2, client_id="scan")
    client._out_messages = _NoScan(_held(3))
    client._inflight_messages = 3
    assert client._update_inflight() == paho.MQTTErrorCode.MQTT_ERR_SUCCESS
    # one held message not in flight (queued): paho's own scan runs, and is seen
    client._inflight_messages = 2
    with pytest.raises(AssertionError, match="scanned"):
        client._update_inflight()


async def test_forgetting_held_messages_lowers_the_in_flight_count() -> None:
    conn = MqttConnection(MqttConfig(), "forget", on_message=lambda _: None,
                          subscriptions=lambda: [])
    client = conn._client
    client._out_messages = _held(3)
    queued = paho.MQTTMessage(4, b"t")
    queued.qos, queued.state = 1, paho.mqtt_ms_queued
    client._out_messages[4] = queued
    client._inflight_messages = 3
    conn._forget_unacknowledged({1, 2, 4})
    assert list(client._out_messages) == [3]
    assert client._inflight_messages == 1  # the queued one was never counted


async def test_the_plugin_socket_sends_without_nagle_delay(mqtt_broker: MosquittoBroker) -> None:
    """TCP_NODELAY on the broker connection: paho leaves Nagle's algorithm on, and a
    PUBLISH written right after an unacknowledged PUBACK then waited for the broker's
    delayed ACK (about 40 ms a hop of a request/reply round trip; docs/performance.md)."""
    config = MqttConfig(protocol="5", port=mqtt_broker.port)
    conn = MqttConnection(config, "paho-nodelay", on_message=lambda _: None,
                          subscriptions=lambda: [])
    await conn.start()
    try:
        sock = conn._client.socket()
        assert sock is not None
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        await conn.close()


class _RecordingSocket(socket.socket):
    """A TCP socket that records its sends and TCP_CORK changes."""

    calls: list[tuple[str, int]]

    def setsockopt(self, *args: Any) -> None:  # type: ignore[override]
        if args[:2] == (socket.IPPROTO_TCP, socket.TCP_CORK):
            self.calls.append(("cork", args[2]))
        super().setsockopt(*args)

    def send(self, data: Any, *args: Any) -> int:  # type: ignore[override]
        self.calls.append(("send", len(data)))
        return super().send(data, *args)


class _RecordingClient(PahoClient):
    sockets: ClassVar[list[_RecordingSocket]] = []

    def _create_socket_connection(self) -> socket.socket:
        plain = super()._create_socket_connection()
        sock = _RecordingSocket(fileno=plain.detach())
        sock.calls = []
        self.sockets.append(sock)
        return sock


async def test_packets_queued_together_leave_corked_and_a_lone_one_at_once(
    mqtt_broker: MosquittoBroker,
) -> None:
    """Without Nagle (above), a batch's PUBLISHes are written under TCP_CORK, uncorked
    once written, so they still leave in full segments; a single packet is not corked
    (it leaves at once, as TCP_NODELAY wants)."""
    config = MqttConfig(protocol="5", port=mqtt_broker.port)
    conn = MqttConnection(config, "paho-cork", on_message=lambda _: None,
                          subscriptions=lambda: [], client_factory=_RecordingClient)
    await conn.start()
    try:
        (sock,) = _RecordingClient.sockets
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        sock.calls.clear()
        await conn.publish_all([Outgoing("paho-cork/one", b"x", 1, False)], timeout=10)
        assert sock.calls == [("send", sock.calls[0][1])]  # one PUBLISH, no cork
        sock.calls.clear()
        batch = [Outgoing("paho-cork/t", b"%03d" % i, 1, False) for i in range(10)]
        await conn.publish_all(batch, timeout=10)
        kinds = [kind for kind, _ in sock.calls]
        assert kinds == ["cork"] + ["send"] * 10 + ["cork"]
        assert (sock.calls[0], sock.calls[-1]) == (("cork", 1), ("cork", 0))
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0
    finally:
        await conn.close()
        _RecordingClient.sockets.clear()


def test_no_delay_leaves_a_unix_socket_alone() -> None:
    """paho's ``unix`` transport has no TCP options to set."""
    a, b = socket.socketpair(socket.AF_UNIX)
    try:
        set_no_delay(a)  # raises OSError if it tried
    finally:
        a.close()
        b.close()
