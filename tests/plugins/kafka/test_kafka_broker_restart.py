"""Issue 12 item 1: the real Kafka broker process is stopped (SIGTERM) in the middle of a
transfer and started again with the same arguments after a gap. The outbound producer
must not stay wedged (``OutOfOrderSequenceException`` for ever): a fatal producer error
leads to a new producer, the stream drains, health comes back by itself, nothing is lost.
The inbound consumer, fed by Kafka's own console producer in a separate process, resumes
after the restart and loses nothing.

``MQGW_TEST_KAFKA_OUTAGE_S`` sets the gap (default 20 s, as in the issue's reproduction).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.devstack import KafkaBroker
from gateway.pubsub.outcome import InboundMessage
from gateway.wire.constants import MsgType
from plugins.kafka import KafkaPluginConfig
from tests.plugins.kafka.kafka_harness import (
    CONTROL,
    STOCK,
    consume,
    send_command,
    start_gateway,
    unique,
    wait_for_queue,
)
from tests.support.pubsub_messages import rfh2_message
from tests.support.service_client import drain

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

OUTAGE_S = float(os.environ.get("MQGW_TEST_KAFKA_OUTAGE_S", "20"))
#: The MQ feeder must put at least one publication in each such round.
FEED_ROUND_S = 10.0


def _config(bootstrap: str, prefix: str) -> KafkaPluginConfig:
    return KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": bootstrap,
            "request_timeout_ms": 5000,
            "outbound": {"topic_template": prefix + ".{stream}", "routes": [{"stream": STOCK}]},
        }
    )


def _publication(i: int) -> InboundMessage:
    return rfh2_message(
        STOCK,
        [("Command", "Publish"), ("Topic", f"$SYS/STREAM/{STOCK}/T{i % 3}")],
        str(i).encode() + b" " + b"p" * 2000,
    )


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    """A broker of this test alone: it is stopped and started again."""
    broker = KafkaBroker(tmp_path / "kafka").start()
    try:
        yield broker
    finally:
        broker.stop()


async def test_outbound_recovers_by_itself_after_the_broker_process_restarts(
    own_broker: KafkaBroker, tmp_path: Path
) -> None:
    p = unique("kill")
    n = 3000
    gw = await start_gateway(tmp_path / "gw", _config(own_broker.bootstrap, p))
    try:

        fed = 0

        async def feed() -> None:  # a steady load, so the stop lands mid-transfer
            nonlocal fed
            for i in range(n):
                await send_command(gw.qm, _publication(i))
                fed += 1
                await asyncio.sleep(0.002)

        feeder = asyncio.create_task(feed())
        async with asyncio.timeout(30):
            while gw.host.sink_counters["kafka"].deliveries < 1:
                await asyncio.sleep(0.01)
        await asyncio.sleep(2.0)  # ~2 s into the transfer, as in the reproduction
        assert not feeder.done(), "the stop must land mid-transfer"
        await asyncio.to_thread(own_broker.stop)  # SIGTERM: a real stop of the process
        await asyncio.sleep(OUTAGE_S)
        await asyncio.to_thread(own_broker.restart)  # same arguments, same data
        # The feeder puts on this process's queue manager as fast as the machine lets it:
        # bounded by its progress (a round that puts nothing fails), not by a fixed time.
        while not feeder.done():
            before = fed
            await asyncio.wait([feeder], timeout=FEED_ROUND_S)
            if not feeder.done() and fed == before:
                feeder.cancel()
                raise AssertionError(
                    f"the feeder put nothing in {FEED_ROUND_S:.0f} s ({fed} of {n})")
        feeder.result()
        records = await consume(own_broker.bootstrap, f"{p}.STOCK.STREAM", n, timeout=90)
        async with asyncio.timeout(30):
            while not gw.instance.healthy() or gw.qm.queue_depth(STOCK) > 0:
                await asyncio.sleep(0.1)
        counters = gw.service.counters
        assert counters.dead_lettered == 0 and counters.moved_to_backout_queue == 0
    finally:
        await gw.close()
    values = {int(r.value.split(b" ")[0]) for r in records}
    assert values == set(range(n))  # nothing lost (at-least-once: duplicates allowed)


#: An outside producer process: ``n`` records ``0..n-1`` at a steady rate, each retried
#: (with a fresh producer) until acknowledged, so it rides out the broker's outage.
#: (Kafka's console producer is not among the jars the devstack resolves.)
_FEEDER = """
import asyncio, sys
from aiokafka import AIOKafkaProducer

async def main(bootstrap, topic, n, deadline_s):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    producer = None
    for i in range(n):
        while True:
            if loop.time() > deadline:
                sys.exit(f"feeder: record {i} not acknowledged in time")
            try:
                if producer is None:
                    producer = AIOKafkaProducer(
                        bootstrap_servers=bootstrap, acks="all", request_timeout_ms=3000
                    )
                    await producer.start()
                await producer.send_and_wait(topic, str(i).encode(), key=b"Orders/%d" % (i % 3))
                break
            except Exception:
                if producer is not None:
                    try:
                        await asyncio.wait_for(producer.stop(), 5)
                    except Exception:
                        pass
                    producer = None
                await asyncio.sleep(0.5)
        await asyncio.sleep(0.005)
    await producer.stop()
    print("done", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
"""


async def test_inbound_consumer_resumes_after_the_broker_process_restarts(
    own_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = unique("in-kill"), unique("g")
    n = 600
    cfg = KafkaPluginConfig.model_validate(
        {
            "bootstrap_servers": own_broker.bootstrap,
            "request_timeout_ms": 5000,
            "outbound": {"enabled": False},
            "inbound": {
                "group_id": group,
                "retry_max_s": 1.0,
                "topics": [{"kafka_topic": topic, "stream": STOCK, "topic": "Orders/X"}],
            },
        }
    )
    gw = await start_gateway(tmp_path / "gw", cfg)
    feeder: asyncio.subprocess.Process | None = None
    try:
        gw.qm.run_mqsc("DEFINE QLOCAL('SUB.IN') REPLACE", stop_on_error=True)
        await send_command(
            gw.qm,
            rfh2_message(
                CONTROL,
                [
                    ("Command", "RegSub"),
                    ("Topic", f"$SYS/STREAM/{STOCK}/Orders/#"),
                    ("QName", "SUB.IN"),
                ],
                reply_to_q="REPLY.Q",
                msg_type=MsgType.REQUEST,
            ),
        )
        await wait_for_queue(gw.qm, "REPLY.Q", 1)
        feeder = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _FEEDER,
            own_broker.bootstrap,
            topic,
            str(n),
            str(OUTAGE_S + 90),
            stdout=asyncio.subprocess.PIPE,
        )
        got = await wait_for_queue(gw.qm, "SUB.IN", 50, timeout=30)  # records flow
        await asyncio.to_thread(own_broker.stop)  # SIGTERM mid-feed
        await asyncio.sleep(OUTAGE_S)
        await asyncio.to_thread(own_broker.restart)
        out, _ = await asyncio.wait_for(feeder.communicate(), OUTAGE_S + 100)

        assert feeder.returncode == 0 and b"done" in out
        async with asyncio.timeout(90):
            while len({int(m.payload) for m in got}) < n:
                got.extend(await drain(gw.qm, "SUB.IN"))
                await asyncio.sleep(0.1)
        async with asyncio.timeout(30):
            while not gw.instance.healthy():
                await asyncio.sleep(0.1)
    finally:
        if feeder is not None and feeder.returncode is None:
            feeder.kill()
            await feeder.wait()
        await gw.close()
    assert {int(m.payload) for m in got} == set(range(n))  # nothing lost
