"""No loss, no duplicate across a graceful gateway restart mid-stream; back-pressure
(MQ messages wait) while Mosquitto is stopped, and delivery once it is back."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.devstack import MosquittoBroker
from plugins.mqtt import MqttConfig
from tests.plugins.mqtt.mqtt_harness import (
    STOCK,
    FixedPortMosquitto,
    Gateway,
    client,
    collect,
    publish_rfh,
    start_gateway,
    unique,
)
from tests.support.pubsub_messages import rfh_publication
from tests.support.service_client import put_at_once

pytestmark = [pytest.mark.mqtt, pytest.mark.slow]


def config(host: str, port: int, prefix: str, client_id: str) -> MqttConfig:
    return MqttConfig.model_validate(
        {
            "host": host,
            "port": port,
            "client_id": client_id,
            "reconnect_min_delay": 0.1,
            "reconnect_max_delay": 1.0,
            "outbound": {"prefix": prefix, "topics": [f"$SYS/STREAM/{STOCK}/#"]},
        }
    )


async def test_restart_mid_stream_loses_and_duplicates_nothing(
    mqtt_broker: MosquittoBroker, tmp_path: Path
) -> None:
    prefix = unique("rs")
    n = 2000
    cfg = config(mqtt_broker.host, mqtt_broker.port, prefix, unique("gw-"))
    async with client(mqtt_broker.host, mqtt_broker.port) as sub:
        await sub.subscribe(f"{prefix}/#", qos=1)
        # batches of 32: the stream lasts long enough for the stop to land in it (with
        # the default cap of 256 the 2,000 can be through before the stop)
        gw: Gateway | None = await start_gateway(tmp_path, cfg, batch_size=32)
        try:
            assert gw is not None
            await put_at_once(gw.qm, [rfh_publication(STOCK, "seq", b"%d" % i) for i in range(n)])
            first = await collect(sub, 50, quiet=0.0)
            await gw.close()  # mid-stream: most messages still on the stream queue
            sent = gw.host.sink_counters["mqtt"].deliveries
            gw = None
            assert 50 <= sent < n, f"the stop did not land mid-stream ({sent} of {n} sent)"
            first += await collect(sub, sent - len(first), timeout=30, quiet=0.0)
            gw = await start_gateway(tmp_path, cfg)
            rest = await collect(sub, n - len(first), timeout=60, quiet=1.0)
        finally:
            if gw is not None:
                await gw.close()
    payloads = [int(m.payload) for m in first + rest]
    assert payloads == list(range(n))


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[FixedPortMosquitto]:
    broker = FixedPortMosquitto(tmp_path / "mosquitto")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


async def test_backpressure_while_mosquitto_is_down(
    own_broker: FixedPortMosquitto, tmp_path: Path
) -> None:
    prefix = unique("bp")
    n = 60
    sub_id = unique("sub-")
    cfg = config(own_broker.host, own_broker.port, prefix, unique("gw-"))
    gw = await start_gateway(tmp_path / "gw", cfg)
    received = []
    try:
        # a subscriber with a persistent session, so what is published while it is
        # reconnecting waits for it in the broker
        async with client(
            own_broker.host, own_broker.port, v5=False, identifier=sub_id, clean_session=False
        ) as sub:
            await sub.subscribe(f"{prefix}/#", qos=1)
            await publish_rfh(gw.qm, STOCK, "seq", b"0")
            received += await collect(sub, 1, quiet=0.0)
        own_broker.stop()
        async with asyncio.timeout(10):
            while gw.instance.healthy():
                await asyncio.sleep(0.05)
        for i in range(1, n):
            await publish_rfh(gw.qm, STOCK, "seq", str(i).encode())
        await asyncio.sleep(2.0)
        # held: retried in place by the broker service, never committed nor dead-lettered
        assert gw.service.counters.sink_retries > 0
        assert gw.service.counters.dead_lettered == 0
        assert gw.service.counters.moved_to_backout_queue == 0
        own_broker.start()
        async with client(
            own_broker.host, own_broker.port, v5=False, identifier=sub_id, clean_session=False
        ) as sub:
            await sub.subscribe(f"{prefix}/#", qos=1)
            received += await collect(sub, n - 1, timeout=60, quiet=1.0)
        assert gw.instance.healthy()
    finally:
        await gw.close()
    payloads = [int(m.payload) for m in received]
    assert payloads == list(range(n))
