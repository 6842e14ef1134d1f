"""Inbound while MQ refuses: nothing is acknowledged, the batch is retried, and once MQ
takes it exactly one copy reaches the MQ subscriber."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from gateway.devstack import MosquittoBroker
from gateway.plugin_api import InboundPublication, PluginError, Publisher
from plugins.mqtt import MqttConfig
from tests.plugins.mqtt.mqtt_harness import (
    client,
    drain_now,
    register_mq_subscribers,
    start_gateway,
    unique,
    wait_for_queue,
)

pytestmark = [pytest.mark.mqtt]


class FailingFirst:
    """A real publisher that refuses (as an unreachable queue manager would) until
    ``allow`` is set."""

    def __init__(self, real: Publisher) -> None:
        self.real = real
        self.allow = asyncio.Event()
        self.refused = 0

    async def publish(self, publications: Sequence[InboundPublication]) -> None:
        if not self.allow.is_set():
            self.refused += 1
            raise PluginError("queue manager unavailable", retriable=True)
        await self.real.publish(publications)


async def test_publish_failures_hold_the_ack_and_retry(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    base = unique("retry")
    cfg = MqttConfig.model_validate(
        {
            "host": mqtt_broker.host,
            "port": mqtt_broker.port,
            "client_id": unique("gw-"),
            "outbound": {"topics": []},
            "inbound": {"filters": [{"filter": f"{base}/#", "strip_prefix": f"{base}/"}]},
        }
    )
    gw = await start_gateway(tmp_path, cfg)
    try:
        await register_mq_subscribers(gw.qm, "r/#")
        source = gw.instance.source
        assert source is not None
        failing = FailingFirst(source.publisher)
        source.publisher = failing
        async with client(mqtt_broker.host, mqtt_broker.port) as pub:
            await pub.publish(f"{base}/r/1", b"one", qos=1)
        async with asyncio.timeout(10):
            while failing.refused < 3:
                await asyncio.sleep(0.05)
        assert not gw.instance.healthy()
        assert gw.qm.queue_depth("SUB.RFH2") == 0
        failing.allow.set()
        got = await wait_for_queue(gw.qm, "SUB.RFH2", 1)
        got += await wait_for_queue(gw.qm, "SUB.RFH", 1)
        await asyncio.sleep(1.0)  # a second copy would arrive here
        got += await drain_now(gw.qm, "SUB.RFH2") + await drain_now(gw.qm, "SUB.RFH")
        assert gw.instance.healthy()
        stats = gw.instance.stats()
    finally:
        await gw.close()
    assert [(r.topic, r.payload) for r in got] == [("r/1", b"one"), ("r/1", b"one")]
    assert stats["inbound_published"] == 1
    assert stats["inbound_publish_failures"] >= 3
