"""The demo's loop through a whole gateway: a legacy MQRFH publisher's ticks go MQ ->
gateway -> Kafka, the ohlc job turns them into bars, and the gateway's inbound path
delivers the bars to a legacy MQ subscriber queue.

Uses the shared in-process gateway (tests/support/gateway.py) through the Kafka
plugin's helpers
(tests/plugins/kafka/kafka_harness.py).
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

from analytics.job import JobOptions
from analytics.jobs import ohlc
from analytics.runner import run_job
from analytics.source import KafkaInput
from gateway.wire.constants import MsgType
from plugins.kafka import KafkaPluginConfig
from tests.plugins.kafka.kafka_harness import (
    CONTROL,
    STOCK,
    consume,
    send_command,
    start_gateway,
    wait_for_queue,
)
from tests.support.names import unique
from tests.support.pubsub_messages import rfh_message

TICKS = [("IBM", "100.50", 10), ("HPQ", "20.10", 7), ("IBM", "101.25", 5),
         ("IBM", "99.75", 20), ("HPQ", "19.90", 3)]


async def test_ticks_from_mq_come_back_to_mq_as_bars(
    kafka_broker: Any, spark_session: Any, tmp_path: Path
) -> None:
    prefix, bars_topic, group = unique("loop"), unique("loop-bars."), unique("g")
    tick_topic = f"{prefix}.{STOCK}"
    cfg = KafkaPluginConfig.model_validate({
        "bootstrap_servers": kafka_broker.bootstrap,
        "outbound": {"topic_template": prefix + ".{stream}",
                     "retained_topic_template": prefix + "-retained.{stream}",
                     "routes": [{"stream": STOCK}]},
        "inbound": {"group_id": group, "topics": [{"kafka_topic": bars_topic,
                                                   "stream": STOCK}]},
    })
    gw = await start_gateway(tmp_path / "gw", cfg)
    try:
        # A legacy MQRFH subscriber to the bars, a legacy MQRFH publisher of ticks.
        await send_command(gw.qm, rfh_message(CONTROL, [
            ("MQPSCommand", "RegSub"), ("MQPSStreamName", STOCK),
            ("MQPSTopic", "OHLC/1m/*"), ("MQPSQName", "SUB.RFH"),
        ], reply_to_q="REPLY.Q", msg_type=MsgType.REQUEST))
        replies = await wait_for_queue(gw.qm, "REPLY.Q", 1)
        assert replies[0].get("MQPSCompCode") in (None, "0")
        for symbol, price, volume in TICKS:
            await send_command(gw.qm, rfh_message(STOCK, [
                ("MQPSCommand", "Publish"), ("MQPSStreamName", STOCK),
                ("MQPSTopic", f"{symbol}/Latest"),
            ], f"{symbol} {price} {volume}".encode()))
        records = await consume(kafka_broker.bootstrap, tick_topic, len(TICKS))
        assert len(records) == len(TICKS)

        # By hand, from the put times the gateway wrote: bars per (symbol, minute).
        expected: dict[tuple[str, int], list[Any]] = defaultdict(list)
        for rec in records:
            h = dict(rec.headers)
            symbol, price, volume = rec.value.decode().split()
            minute = int(h["mq.putTime"]) // 60_000
            expected[(symbol, minute)].append((Decimal(price), int(volume)))

        source = KafkaInput(kafka_broker.bootstrap, topics=(tick_topic,))
        options = JobOptions(source=source, out=str(tmp_path / "out"), extra={
            "stream": STOCK, "bars_topic": bars_topic, "bars_stream": STOCK})
        result = await asyncio.to_thread(run_job, spark_session, "ohlc", ohlc.build, options,
                                         checkpoint=str(tmp_path / "ckpt"), once=True)
        assert result.stats["ohlc"].rows == len(TICKS)

        bars = await wait_for_queue(gw.qm, "SUB.RFH", len(expected), timeout=60)
        await asyncio.sleep(0.5)
        extra = await wait_for_queue(gw.qm, "SUB.RFH", 0)
    finally:
        await gw.close()

    assert extra == []
    got = {}
    for msg in bars:
        bar = json.loads(msg.payload)
        assert msg.topic == f"OHLC/1m/{bar['symbol']}"
        start_ms = _epoch_ms(bar["start"])
        got[(bar["symbol"], start_ms // 60_000)] = (
            Decimal(bar["open"]), Decimal(bar["high"]), Decimal(bar["low"]),
            Decimal(bar["close"]), bar["volume"], bar["ticks"])
    want = {k: (v[0][0], max(p for p, _ in v), min(p for p, _ in v), v[-1][0],
                sum(q for _, q in v), len(v)) for k, v in expected.items()}
    assert got == want


def _epoch_ms(text: str) -> int:
    from datetime import UTC, datetime

    return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
               .timestamp() * 1000)
