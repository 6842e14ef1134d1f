"""Issue 12 item 5: a subscriber queue that is the broker's own is refused, and one that
keeps failing is suspended (through the real service on the embedded queue manager)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.mq.ibmmq import IBMMQConfig, IBMMQQueueManager
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.records import Destination, SubFormat, Subscription
from gateway.pubsub.sqlite_store import SqliteStore
from gateway.pubsub.store import UpsertSubscription
from gateway.pubsub.topics import Scheme
from gateway.runtime.backlog_seal import BacklogSeal
from gateway.runtime.metrics import GatewayMetrics
from gateway.runtime.pubsub_service import BrokerService
from gateway.wire.constants import MsgType
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.reasons import Reason
from tests.support.gateway import STOCK, InProcessGateway, bridge_config, build_gateway
from tests.support.mqi_standin import StandIn
from tests.support.pubsub_messages import CONTROL, rfh2_message
from tests.support.service_client import drain, drain_raw, put, settle

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
QUEUES = f"""
DEFINE QLOCAL('{STOCK}') DEFPSIST(YES) REPLACE
DEFINE QLOCAL('BULLETIN.STREAM') REPLACE
DEFINE QLOCAL(SUB.OK) REPLACE
DEFINE QLOCAL(REPLY.Q) REPLACE
"""


def reg_sub(queue: str, topic: str = "price/a") -> object:
    return rfh2_message(
        CONTROL,
        [("Command", "RegSub"), ("Topic", topic), ("QName", queue)],
        reply_to_q="REPLY.Q",
        msg_type=MsgType.REQUEST,
    )


def publish(topic: str = "price/a", payload: bytes = b"1") -> object:
    return rfh2_message(CONTROL, [("Command", "Publish"), ("Topic", topic)], payload)


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[InProcessGateway]:
    gw = build_gateway(tmp_path, mqsc=QUEUES, config=bridge_config(suspend_subscription_after=3))
    await gw.service.start()
    try:
        yield gw
    finally:
        await gw.close()


@pytest.mark.parametrize("queue", [STOCK, CONTROL, DLQ, "SYSTEM.BROKER.DEFAULT.STREAM"])
async def test_regsub_naming_a_broker_queue_is_refused_and_nothing_loops(
    gateway: InProcessGateway, queue: str
) -> None:
    qm, service = gateway.qm, gateway.service
    await put(qm, reg_sub(queue))  # type: ignore[arg-type]
    await settle(qm, service)
    [reply] = await drain(qm, "REPLY.Q")
    assert reply.get("pscr/Completion") == "error"
    assert reply.get("pscr/Response/Reason") == str(int(Reason.Q_NAME_ERROR))
    assert not [s for s in service.engine.subscriptions if s.destination.queue == queue]
    # A publication that would have matched reaches nobody, goes round no loop and
    # leaves the DLQ empty (before: ~90 re-publications a second, or plain copies on the
    # DLQ without an MQDLH).
    await put(qm, reg_sub("SUB.OK"))  # type: ignore[arg-type]
    await put(qm, publish())  # type: ignore[arg-type]
    await settle(qm, service, timeout=5)
    handled = service.counters.messages
    assert handled <= 4
    assert len(await drain(qm, "SUB.OK")) == 1
    assert qm.queue_depth(DLQ) == 0


async def test_a_stored_subscription_to_a_broker_queue_is_removed_at_start(
    tmp_path: Path,
) -> None:
    # What a gateway before the fix left in its store: the loop survived restarts.
    store = SqliteStore(tmp_path / "pubsub.db")
    looping = Subscription(
        "SYSTEM.BROKER.DEFAULT.STREAM",
        "price/a",
        Scheme.TOPIC,
        Destination("QM1", STOCK),
        SubFormat.RFH2,
        created=1.0,
    )
    store.apply([UpsertSubscription(looping)])
    store.close()
    gw = build_gateway(tmp_path, mqsc=QUEUES)
    try:
        assert gw.service.engine.removed_broker_queue_subscriptions == 1
        assert gw.service.engine.subscriptions == []
        await gw.service.start()
        await put(gw.qm, publish())  # type: ignore[arg-type]
        await settle(gw.qm, gw.service, timeout=5)
        assert gw.service.counters.messages == 1
        assert gw.qm.queue_depth(STOCK) == 0
    finally:
        await gw.close()
    again = SqliteStore(tmp_path / "pubsub.db")
    try:
        assert again.load().subscriptions == []  # removed for good, not only in memory
    finally:
        again.close()


async def test_a_subscription_whose_queue_keeps_failing_is_suspended_then_resumed(
    gateway: InProcessGateway,
) -> None:
    qm, service = gateway.qm, gateway.service
    await put(qm, reg_sub("NO.SUCH.Q"))  # type: ignore[arg-type]
    await settle(qm, service)
    assert [r.get("pscr/Completion") for r in await drain(qm, "REPLY.Q")] == ["ok"]
    for i in range(6):
        await put(qm, publish(payload=str(i).encode()))  # type: ignore[arg-type]
        await settle(qm, service)
    # three dead-lettered with reason 2085, then suspended: no endless DLQ stream
    assert qm.queue_depth(DLQ) == 3
    assert service.engine.suspended_subscriptions == 1
    assert service.engine.suspensions == 1
    text = GatewayMetrics(service, gateway.host, dict, lambda: 0).exposition().decode()
    assert "\nmqgw_suspended_subscriptions 1.0\n" in text
    assert 'mqgw_errors_total{component="broker",kind="subscription_suspended"} 1.0' in text
    # the queue is fixed and the subscriber registers again: resumed
    qm.run_mqsc("DEFINE QLOCAL(NO.SUCH.Q) REPLACE", stop_on_error=True)
    await put(qm, reg_sub("NO.SUCH.Q"))  # type: ignore[arg-type]
    await put(qm, publish(payload=b"back"))  # type: ignore[arg-type]
    await settle(qm, service)
    assert service.engine.suspended_subscriptions == 0
    assert [r.payload for r in await drain(qm, "NO.SUCH.Q")] == [b"back"]


async def test_suspension_is_durable_across_a_restart(tmp_path: Path) -> None:
    config = bridge_config(suspend_subscription_after=2)
    gw = build_gateway(tmp_path, mqsc=QUEUES, config=config)
    try:
        await gw.service.start()
        await put(gw.qm, reg_sub("NO.SUCH.Q"))  # type: ignore[arg-type]
        for _ in range(3):
            await put(gw.qm, publish())  # type: ignore[arg-type]
            await settle(gw.qm, gw.service)
        assert gw.service.engine.suspended_subscriptions == 1
    finally:
        await gw.close()
    gw = build_gateway(tmp_path, mqsc="", config=config)
    try:
        assert gw.service.engine.suspended_subscriptions == 1
        await gw.service.start()
        await put(gw.qm, publish())  # type: ignore[arg-type]
        await settle(gw.qm, gw.service)
        assert gw.qm.queue_depth(DLQ) == 2
    finally:
        await gw.close()


async def test_mqgw_subscriptions_lists_the_suspended_one(tmp_path: Path) -> None:
    """What `/metrics` counts, the operator can name: `mqgw subscriptions --suspended`
    (a separate process, reading the store) lists the suspended subscription and its
    queue, and exits 1 while any is suspended; the healthy one is not listed."""
    gw = build_gateway(tmp_path, mqsc=QUEUES, config=bridge_config(suspend_subscription_after=2))
    try:
        await gw.service.start()
        await put(gw.qm, reg_sub("SUB.OK", "price/ok"))  # type: ignore[arg-type]
        await put(gw.qm, reg_sub("NO.SUCH.Q"))  # type: ignore[arg-type]
        for _ in range(2):
            await put(gw.qm, publish())  # type: ignore[arg-type]
            await settle(gw.qm, gw.service)
        assert gw.service.engine.suspended_subscriptions == 1
    finally:
        await gw.close()
    cli = [sys.executable, "-m", "gateway.runtime.cli", "subscriptions"]
    store = str(tmp_path / "pubsub.db")
    suspended = subprocess.run(
        [*cli, "--store", store, "--suspended"], capture_output=True, text=True, timeout=60
    )
    assert suspended.returncode == 1, suspended.stderr
    [row, total] = suspended.stdout.strip().splitlines()
    assert row.startswith("SUSPENDED") and "price/a" in row and "NO.SUCH.Q" in row
    assert total == "2 subscription(s), 1 suspended"
    everything = subprocess.run(
        [*cli, "--store", store, "--json"], capture_output=True, text=True, timeout=60
    )
    assert everything.returncode == 0, everything.stderr
    rows = [json.loads(line) for line in everything.stdout.splitlines()]
    assert sorted((r["topic"], r["suspended"]) for r in rows) == [
        ("price/a", True),
        ("price/ok", False),
    ]
    missing = subprocess.run(
        [*cli, "--store", str(tmp_path / "nothing.db")], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "no pub/sub store" in missing.stderr
    assert "Traceback" not in missing.stderr


async def test_a_subscriber_queue_full_on_ibm_mq_is_dead_lettered_not_holding_its_stream(
    tmp_path: Path,
) -> None:
    """IBM MQ answers 2056 (MQRC_Q_SPACE_NOT_AVAILABLE) for one queue whose file reached
    MAXFSIZE. That subscriber's copies go to the DLQ with 2056 and its subscription is
    suspended after ``suspend_subscription_after`` of them; the other subscriber gets
    every publication. (Before: every batch of the stream was backed out as if the disk
    were full, for good, and suspension never came.) Through the ibmmq adapter over the
    stand-in MQI, which refuses the puts to that queue."""
    standin = StandIn(tmp_path / "qm", q_mgr_name="QM1")
    standin.qm.run_mqsc(QUEUES + "DEFINE QLOCAL(SUB.FULL) REPLACE\n", stop_on_error=True)
    standin.put_failures["SUB.FULL"] = Reason.Q_SPACE_NOT_AVAILABLE
    qm = IBMMQQueueManager(IBMMQConfig(q_mgr_name="QM1"), mqi=standin.module)
    config = bridge_config(suspend_subscription_after=3)
    store = SqliteStore(tmp_path / "pubsub.db")
    engine = PubSubEngine(qm.name, store, broker_queues=config.broker_queues,
                          suspend_after=config.suspend_subscription_after)
    service = BrokerService(qm, engine, config, backlog_seal=BacklogSeal(bytes(32)))
    await service.start()

    async def handled(count: int) -> None:
        """Until ``count`` messages were handled and committed (one at a time, so the
        suspension, decided after a batch, applies from the next one)."""
        async with asyncio.timeout(30):
            while service.counters.messages < count:
                await asyncio.sleep(0.02)

    try:
        for queue in ("SUB.OK", "SUB.FULL"):
            await put(qm, reg_sub(queue))  # type: ignore[arg-type]
        await handled(2)
        for i in range(6):
            await put(qm, publish(payload=str(i).encode()))  # type: ignore[arg-type]
            await handled(3 + i)
        assert [r.payload for r in await drain(qm, "SUB.OK")] == [
            str(i).encode() for i in range(6)
        ]
        letters = [unwrap_from_dlq(m.md, m.body)[0] for m in await drain_raw(qm, DLQ)]
        assert [(d.reason, d.dest_q_name.strip()) for d in letters] == [
            (Reason.Q_SPACE_NOT_AVAILABLE, "SUB.FULL")
        ] * 3
        assert service.engine.suspended_subscriptions == 1
        assert service.counters.backlog_full == 0
    finally:
        await service.stop()
        store.close()
        standin.close()
