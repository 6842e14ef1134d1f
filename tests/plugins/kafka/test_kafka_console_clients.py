"""End to end with clients this project did not write: Kafka's own console producer and
console consumer (the kafka-tools jar, separate JVM processes) on the real broker, and a
legacy MQRFH application's subscription and publication on the embedded queue manager."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from gateway.devstack import KafkaBroker, console_tool_command
from gateway.wire.constants import MsgType
from plugins.kafka import KafkaPluginConfig
from tests.plugins.kafka.kafka_harness import (
    CONTROL,
    STOCK,
    send_command,
    start_gateway,
    unique,
    wait_for_queue,
)
from tests.support.pubsub_messages import rfh_message

pytestmark = [pytest.mark.kafka]


def _run(tool: str, *args: str, stdin: bytes = b"", timeout: float = 90) -> str:
    proc = subprocess.run(
        console_tool_command(tool, *args),
        input=stdin,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    return proc.stdout.decode(errors="replace")


@pytest.mark.parametrize("backend", ["aiokafka", "confluent"])
async def test_console_producer_to_mq_subscriber_and_mq_publisher_to_console_consumer(
    kafka_broker: KafkaBroker, tmp_path: Path, backend: str
) -> None:
    inbound, prefix, group = unique("console-in"), unique("console-out"), unique("g")
    cfg = KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": kafka_broker.bootstrap,
            "backend": backend,
            "outbound": {"topic_template": prefix + ".{stream}", "routes": [{"stream": STOCK}]},
            "inbound": {
                "group_id": group,
                "topics": [{"kafka_topic": inbound, "stream": STOCK, "topic": "Console/Default"}],
            },
        }
    )
    gw = await start_gateway(tmp_path, cfg)
    try:
        await send_command(
            gw.qm,
            rfh_message(
                CONTROL,
                [
                    ("MQPSCommand", "RegSub"),
                    ("MQPSStreamName", STOCK),
                    ("MQPSTopic", "Console/*"),
                    ("MQPSQName", "SUB.RFH"),
                ],
                reply_to_q="REPLY.Q",
                msg_type=MsgType.REQUEST,
            ),
        )
        [reply] = await wait_for_queue(gw.qm, "REPLY.Q", 1)
        assert reply.get("MQPSCompCode") in (None, "0")

        # Kafka -> MQ: two keyed records and one without a key, from the console producer.
        lines = b"Console/IBM|118.50\nConsole/HUR|2.10\n"
        await asyncio.to_thread(
            _run,
            "kafka-console-producer",
            "--bootstrap-server", kafka_broker.bootstrap,
            "--topic", inbound,
            "--property", "parse.key=true",
            "--property", "key.separator=|",
            stdin=lines,
        )
        got = await wait_for_queue(gw.qm, "SUB.RFH", 2, timeout=60)
        assert sorted((m.topic, m.payload) for m in got) == [
            ("Console/HUR", b"2.10"),
            ("Console/IBM", b"118.50"),
        ]

        # MQ -> Kafka: a legacy MQRFH publisher; the console consumer reads the record.
        await send_command(
            gw.qm,
            rfh_message(
                STOCK,
                [
                    ("MQPSCommand", "Publish"),
                    ("MQPSStreamName", STOCK),
                    ("MQPSTopic", "Quotes/IBM"),
                ],
                b"IBM 119.00",
            ),
        )
        out = await asyncio.to_thread(
            _run,
            "kafka-console-consumer",
            "--bootstrap-server", kafka_broker.bootstrap,
            "--topic", f"{prefix}.{STOCK}",
            "--from-beginning",
            "--max-messages", "1",
            "--timeout-ms", "60000",
            "--formatter-property", "print.key=true",
            "--formatter-property", "key.separator=|",
        )
    finally:
        await gw.close()
    # (Headers are not printed: mq.msgId/mq.correlId are raw bytes; the contract tests
    # check every header with a client that reads bytes.)
    assert [ln for ln in out.splitlines() if ln] == ["Quotes/IBM|IBM 119.00"]
