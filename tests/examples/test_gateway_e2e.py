"""The whole slice against the real Kafka broker and real Mosquitto: the demo's driver
(legacy MQRFH/MQRFH2 publishers and subscribers, a Kafka consumer/producer, an MQTT
subscriber/publisher) through one GatewayApp with the kafka and mqtt plugins."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.demo.exercise import exercise
from examples.demo.paths import PATHS

pytestmark = [pytest.mark.kafka, pytest.mark.mqtt, pytest.mark.slow]


async def test_every_path_delivers_everything_once(
    kafka_broker: object, mqtt_broker: object, tmp_path: Path
) -> None:
    stats = await exercise(
        kafka_broker.bootstrap,  # type: ignore[attr-defined]
        mqtt_broker.host,  # type: ignore[attr-defined]
        mqtt_broker.port,  # type: ignore[attr-defined]
        count=40,
        timeout=60,
        work=tmp_path,
    )
    assert set(stats) == set(PATHS)
    for name, s in stats.items():
        assert s.sent == 40, name
        assert s.received == 40, (name, s.received)  # none lost, none duplicated
