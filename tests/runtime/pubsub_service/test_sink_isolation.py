"""Sink isolation (issue 12 items 2, 3, 8): each sink's deliveries wait on its own
backlog queue, so one sink that is down, refuses a publication for good, or stays down
across restarts holds only itself — never MQ subscribers, the other sinks or a stream.

Driven from outside: publications are put by an MQ client onto the stream queue,
arrival is read from the MQ subscriber queue and the memory plugins' buses, and the
dead-letter queue is read as an operator would.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from gateway.mq.port import OpenOption, PutOptions
from gateway.runtime.backlog_format import backlog_queue_name, decode_backlog_message
from gateway.runtime.metrics import GatewayMetrics
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.reasons import Reason
from plugins.memory import MemoryConfig, MemoryInstance, get_bus, reset_buses
from tests.support.gateway import CONTROL, STOCK, InProcessGateway, bridge_config, build_gateway
from tests.support.pubsub_messages import rfh2_message, rfh_message
from tests.support.service_client import drain, drain_raw, put, settle

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
STOCK_ALL = f"$SYS/STREAM/{STOCK}/#"


def _memory(name: str, **cfg: object) -> MemoryInstance:
    return MemoryInstance(
        name, MemoryConfig.model_validate({"subscribe": [STOCK_ALL], "bus": name, **cfg})
    )


def _gateway(path: Path) -> InProcessGateway:
    return build_gateway(path, config=bridge_config(retry_delay=0.01, sink_retry_max_delay=0.1))


async def _mq_subscriber(gw: InProcessGateway) -> None:
    await put(
        gw.qm,
        rfh2_message(CONTROL, [("Command", "RegSub"), ("Topic", STOCK_ALL), ("QName", "SUB.RFH2")]),
    )
    await settle(gw.qm, gw.service)


async def _publish(gw: InProcessGateway, payloads: list[bytes]) -> None:
    """All of ``payloads`` in one unit of work (so they share the service's batches)."""
    conn = await gw.qm.connect()
    try:
        stream = await conn.open(STOCK, OpenOption.OUTPUT)
        for i, payload in enumerate(payloads):
            msg = rfh_message(STOCK, [("MQPSCommand", "Publish"), ("MQPSTopic", f"T{i}")], payload)
            await stream.put(msg.md, msg.body, PutOptions(syncpoint=True))
        await conn.commit()
    finally:
        await conn.disconnect()


async def _wait(predicate: object, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.02)


async def test_a_sink_that_is_down_holds_only_its_own_deliveries(tmp_path: Path) -> None:
    reset_buses()
    gw = _gateway(tmp_path)
    await gw.start(_memory("down"), _memory("up"))
    try:
        await _mq_subscriber(gw)
        get_bus("down").down = True
        payloads = [f"p{i:03d}".encode() for i in range(40)]
        await _publish(gw, payloads)
        # The MQ subscriber and the other sink get everything while "down" is down.
        got = [m.payload for m in await _drain_until(gw, "SUB.RFH2", len(payloads))]
        assert got == payloads
        up = await get_bus("up").wait_for(len(payloads))
        assert [r.payload for r in up] == payloads
        assert get_bus("down").records == [] and get_bus("down").refused_sends > 0
        assert gw.qm.queue_depth(STOCK) == 0  # the stream is not held either
        assert gw.qm.queue_depth(backlog_queue_name("down")) == len(payloads)
        # Back up: everything arrives, once, in order; nothing was set aside.
        get_bus("down").down = False
        down = await get_bus("down").wait_for(len(payloads))
        await settle(gw.qm, gw.service)
        assert [r.payload for r in down] == payloads
        assert [r.payload for r in get_bus("up").records] == payloads
        assert await drain_raw(gw.qm, DLQ) == []
        assert gw.service.counters.backouts == 0
    finally:
        await gw.close()
        reset_buses()


async def _drain_until(gw: InProcessGateway, queue: str, count: int, timeout: float = 20) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += await drain(gw.qm, queue)
        await asyncio.sleep(0.02)
    return got


async def test_a_refused_publication_is_dead_lettered_for_that_sink_only(tmp_path: Path) -> None:
    """2 MB: over the picky sink's 1 MB limit (as Kafka's max.request.size), under MQ's
    4 MB MAXMSGL. The MQ subscriber and the other sink get it once; the picky sink gets
    its neighbours once; the DLQ holds it once, with the reason, for that sink."""
    reset_buses()
    gw = _gateway(tmp_path)
    picky = _memory("picky", refuse_larger_than=1_000_000)
    await gw.start(picky, _memory("up"))
    try:
        await _mq_subscriber(gw)
        big = b"B" * (2 * 1024 * 1024)
        payloads = [b"before", big, b"after"]
        await _publish(gw, payloads)
        got = [m.payload for m in await _drain_until(gw, "SUB.RFH2", 3)]
        assert got == payloads
        assert [r.payload for r in await get_bus("up").wait_for(3)] == payloads
        assert [r.payload for r in await get_bus("picky").wait_for(2)] == [b"before", b"after"]
        await _wait(lambda: gw.qm.queue_depth(DLQ) >= 1)
        await settle(gw.qm, gw.service)
        [dead] = await drain_raw(gw.qm, DLQ)
        dlh, _md, body = unwrap_from_dlq(dead.md, dead.body)
        assert dlh.reason == Reason.MSG_TOO_BIG_FOR_Q
        assert dlh.dest_q_name.strip() == backlog_queue_name("picky")
        assert decode_backlog_message(body).payload == big
        # Nobody got anything twice, and the refusal was not a backout.
        assert [r.payload for r in get_bus("up").records] == payloads
        assert [r.payload for r in get_bus("picky").records] == [b"before", b"after"]
        assert await drain(gw.qm, "SUB.RFH2") == []
        assert gw.service.counters.backouts == 0
        assert gw.service.forwarder_counters()["picky"].dead_lettered == {
            int(Reason.MSG_TOO_BIG_FOR_Q): 1
        }
        # ... and on /metrics, per sink and reason.
        text = GatewayMetrics(gw.service, gw.host, lambda: {}, lambda: 0).exposition().decode()
        assert 'mqgw_sink_dead_lettered_total{plugin="picky",reason="2030"} 1.0' in text
        up = [line for line in text.splitlines()
              if line.startswith('mqgw_sink_dead_lettered_total{plugin="up"')]
        assert up and all(line.endswith(" 0.0") for line in up), up  # its series, at 0
    finally:
        await gw.close()
        reset_buses()


async def test_restarts_during_an_outage_never_dead_letter(tmp_path: Path) -> None:
    """Seven restarts (more than BOTHRESH 5) while the sink is down: each stop backs its
    held backlog batch out (BackoutCount + 1), yet nothing is set aside; once the sink
    is back everything arrives once."""
    reset_buses()
    payloads = [b"a", b"b", b"c"]
    for restart in range(8):
        gw = _gateway(tmp_path)
        get_bus("down").down = restart < 7
        await gw.start(_memory("down"))
        try:
            if restart == 0:
                await _publish(gw, payloads)
            if restart < 7:
                before = gw.service.counters.sink_retries
                await _wait(lambda: gw.service.counters.sink_retries > before, 10)  # noqa: B023
                assert gw.service.counters.sink_retries > before
            else:
                records = await get_bus("down").wait_for(3)
                await settle(gw.qm, gw.service)
                assert [r.payload for r in records] == payloads
                assert gw.qm.queue_depth(backlog_queue_name("down")) == 0
                assert await drain_raw(gw.qm, DLQ) == []
                assert gw.service.counters.moved_to_backout_queue == 0
        finally:
            await gw.close()
    reset_buses()


async def test_restarts_while_a_backlog_is_full_never_set_a_publication_aside(
    tmp_path: Path,
) -> None:
    """A full backlog backs the stream batch out again and again (back-pressure, each
    one forgiven). Those forgiven backouts are durable: restarted in the middle, with the
    publications' BackoutCount far past BOTHRESH, the gateway still sets none aside and
    delivers all of them once the sink is back (issue 12 item 8)."""
    reset_buses()
    first, second = [b"a", b"b", b"c"], [b"d", b"e", b"f"]

    def small_backlog() -> InProcessGateway:
        config = bridge_config(
            retry_delay=0.01, sink_retry_max_delay=0.1, sink_backlog_max_depth=3
        )
        return build_gateway(tmp_path, config=config)

    for restart in range(3):
        gw = small_backlog()
        get_bus("down").down = restart < 2
        await gw.start(_memory("down"))
        try:
            if restart == 0:
                await _publish(gw, first)  # fills the backlog (the sink holds them)
                await _wait(lambda: gw.qm.queue_depth(backlog_queue_name("down")) == 3)  # noqa: B023
                await _publish(gw, second)  # cannot fit: backed out, forgiven, again
            if restart < 2:
                await _wait(lambda: gw.service.counters.backlog_full >= 8, 20)  # noqa: B023
                assert gw.service.counters.backlog_full >= 8  # past BOTHRESH 5, each run
                assert gw.qm.queue_depth(STOCK) == 3
            else:
                records = await get_bus("down").wait_for(6)
                await settle(gw.qm, gw.service)
                assert [r.payload for r in records] == first + second
                assert await drain_raw(gw.qm, DLQ) == []
                assert gw.service.counters.moved_to_backout_queue == 0
                assert len(gw.service.forgiven) == 0  # settled once committed
        finally:
            await gw.close()
    reset_buses()


async def test_a_full_backlog_does_not_stop_the_gateway_starting(tmp_path: Path) -> None:
    """At each start a sink's subscription hands it the retained publications again,
    through its backlog. A backlog that is full (its sink away for a while) must not fail
    that subscription, and so the start: the hand-over waits, the gateway runs, and once
    the sink is back what the backlog holds arrives."""
    reset_buses()

    def small_backlog() -> InProcessGateway:
        config = bridge_config(
            retry_delay=0.01, sink_retry_max_delay=0.1, sink_backlog_max_depth=2
        )
        return build_gateway(tmp_path, config=config)

    retained = rfh_message(
        STOCK, [("MQPSCommand", "Publish"), ("MQPSTopic", "R"), ("MQPSPubOpts", "RetainPub")], b"r"
    )
    gw = small_backlog()
    get_bus("away").down = True
    await gw.start(_memory("away"))
    try:
        await put(gw.qm, retained)
        await _publish(gw, [b"n"])
        await _wait(lambda: gw.qm.queue_depth(backlog_queue_name("away")) == 2)
        assert gw.qm.queue_depth(backlog_queue_name("away")) == 2  # full
    finally:
        await gw.close()
    gw = small_backlog()
    await gw.start(_memory("away"))  # raised BacklogFullError before the fix
    try:
        get_bus("away").down = False
        records = await get_bus("away").wait_for(2)
        assert [r.payload for r in records] == [b"r", b"n"]
        await settle(gw.qm, gw.service)
        assert await drain_raw(gw.qm, DLQ) == []
    finally:
        await gw.close()
        reset_buses()
