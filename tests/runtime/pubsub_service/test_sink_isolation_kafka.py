"""Sink isolation with a real outage (issue 12 item 2): the Kafka broker process is
stopped (SIGTERM) and started again with the same arguments while publications flow.
MQ subscribers and another sink keep receiving meanwhile; Kafka's deliveries wait on
its backlog queue and all arrive once the broker is back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gateway.devstack import KafkaBroker
from gateway.runtime.backlog_format import backlog_queue_name
from plugins.kafka import KafkaPluginConfig
from plugins.kafka import plugin as kafka_plugin
from plugins.memory import MemoryConfig, MemoryInstance, get_bus, reset_buses
from tests.plugins.kafka.kafka_harness import consume, unique
from tests.support.gateway import CONTROL, STOCK, bridge_config, build_gateway
from tests.support.pubsub_messages import rfh2_message
from tests.support.service_client import drain, put, settle

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

STOCK_ALL = f"$SYS/STREAM/{STOCK}/#"


def _publication(i: int) -> object:
    return rfh2_message(
        STOCK, [("Command", "Publish"), ("Topic", f"{STOCK_ALL[:-1]}T")], str(i).encode()
    )


async def test_kafka_stopped_holds_only_its_own_backlog(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    reset_buses()
    prefix = unique("iso")
    kafka = kafka_plugin.create(
        "kafka",
        KafkaPluginConfig.model_validate(
            {
                "bootstrap_servers": kafka_broker.bootstrap,
                "request_timeout_ms": 3000,
                "send_timeout_s": 10,
                "outbound": {"topic_template": prefix + ".{stream}", "routes": [{"stream": STOCK}]},
            }
        ),
    )
    mem = MemoryInstance("mem", MemoryConfig(subscribe=[STOCK_ALL], bus="mem"))
    gw = build_gateway(tmp_path, config=bridge_config(sink_retry_max_delay=0.5))
    await gw.start(kafka, mem)
    n = 40
    try:
        await put(
            gw.qm,
            rfh2_message(
                CONTROL, [("Command", "RegSub"), ("Topic", STOCK_ALL), ("QName", "SUB.RFH2")]
            ),
        )
        await settle(gw.qm, gw.service)
        await put(gw.qm, _publication(0))  # type: ignore[arg-type]
        await consume(kafka_broker.bootstrap, f"{prefix}.{STOCK}", 1)
        await asyncio.to_thread(kafka_broker.stop)
        try:
            for i in range(1, n):
                await put(gw.qm, _publication(i))  # type: ignore[arg-type]
            # While Kafka is down: the MQ subscriber and the memory sink get everything.
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(got) < n and time.monotonic() < deadline:
                got += [m.payload for m in await drain(gw.qm, "SUB.RFH2")]
                await asyncio.sleep(0.05)
            assert got == [str(i).encode() for i in range(n)]
            records = await get_bus("mem").wait_for(n, timeout=30)
            assert [r.payload for r in records] == got
            assert gw.qm.queue_depth(STOCK) == 0
            assert gw.qm.queue_depth(backlog_queue_name("kafka")) == n - 1
            assert gw.service.forwarder_counters()["kafka"].delivered == 1
        finally:
            await asyncio.to_thread(kafka_broker.restart)
        kafka_records = await consume(kafka_broker.bootstrap, f"{prefix}.{STOCK}", n, timeout=90)
        values = [int(r.value) for r in kafka_records]
        assert set(values) == set(range(n))  # nothing lost (at-least-once: copies counted)
        firsts = list(dict.fromkeys(values))
        assert firsts == list(range(n))  # in order
        assert gw.qm.queue_depth("SYSTEM.DEAD.LETTER.QUEUE") == 0
        assert gw.service.counters.moved_to_backout_queue == 0
    finally:
        await gw.close()
        reset_buses()
