"""Smoke: 1,000 QoS 1 messages through the real Mosquitto with aiomqtt, all received in order."""

from __future__ import annotations

import asyncio
import uuid

import aiomqtt
import pytest

from gateway.devstack import MosquittoBroker

pytestmark = [pytest.mark.mqtt]

N_MESSAGES = 1000


async def test_qos1_publish_1000_all_received_in_order(mqtt_broker: MosquittoBroker) -> None:
    base = f"smoke/{uuid.uuid4().hex[:12]}"
    received: list[tuple[str, int, bytes]] = []

    async with aiomqtt.Client(
        mqtt_broker.host, port=mqtt_broker.port, identifier=f"sub-{uuid.uuid4().hex[:8]}"
    ) as subscriber:
        await subscriber.subscribe(f"{base}/#", qos=1)

        async def collect() -> None:
            async for message in subscriber.messages:
                assert isinstance(message.payload, bytes)
                received.append((message.topic.value, message.qos, message.payload))
                if len(received) == N_MESSAGES:
                    return

        collector = asyncio.create_task(collect())
        async with aiomqtt.Client(
            mqtt_broker.host, port=mqtt_broker.port, identifier=f"pub-{uuid.uuid4().hex[:8]}"
        ) as publisher:
            for i in range(N_MESSAGES):
                await publisher.publish(f"{base}/data", payload=f"msg-{i}".encode(), qos=1)
        async with asyncio.timeout(30):
            await collector

    assert len(received) == N_MESSAGES
    assert {topic for topic, _, _ in received} == {f"{base}/data"}
    assert {qos for _, qos, _ in received} == {1}
    assert [payload for _, _, payload in received] == [
        f"msg-{i}".encode() for i in range(N_MESSAGES)
    ]
