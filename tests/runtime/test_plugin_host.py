"""The plugin host end to end on an embedded queue manager: legacy MQRFH/MQRFH2
publishers reach a plugin sink, plugin publications reach MQRFH/MQRFH2 subscribers, the
origin rule, retained deletions, back-pressure and refusal of unpublishable data."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.plugin_api import Envelope, InboundPublication, PluginError
from gateway.runtime.plugin_host import MQPublisher, PluginHost, PublishRefusedError
from gateway.runtime.pubsub_service import BrokerService
from gateway.wire.constants import MsgType
from gateway.wire.folder import Element
from gateway.wire.reasons import Reason
from plugins.memory import MemoryConfig, MemoryInstance, get_bus
from tests.support.pubsub_messages import CONTROL, rfh2_message, rfh_message
from tests.support.service_client import drain, put, settle

STOCK_ALL = "$SYS/STREAM/STOCK.STREAM/#"


async def _subscribe_legacy(qm: EmbeddedQueueManager, service: BrokerService) -> None:
    """An MQRFH subscriber (RFH.SUB) and an MQRFH2 subscriber (RFH2.SUB) of STOCK.STREAM."""
    await put(
        qm,
        rfh_message(
            CONTROL,
            [
                ("MQPSCommand", "RegSub"),
                ("MQPSStreamName", "STOCK.STREAM"),
                ("MQPSTopic", "*"),
                ("MQPSQName", "RFH.SUB"),
            ],
            reply_to_q="REPLY.Q",
            msg_type=MsgType.REQUEST,
        ),
    )
    await put(
        qm,
        rfh2_message(
            CONTROL,
            [("Command", "RegSub"), ("Topic", STOCK_ALL), ("QName", "RFH2.SUB")],
            reply_to_q="REPLY.Q",
            msg_type=MsgType.REQUEST,
        ),
    )
    await settle(qm, service)
    replies = await drain(qm, "REPLY.Q")
    assert len(replies) == 2
    codes = sorted(str(r.get("MQPSCompCode") or r.get("pscr/Completion")) for r in replies)
    assert codes == ["0", "ok"]


async def _start(
    host: PluginHost, service: BrokerService, name: str, **cfg: object
) -> MemoryInstance:
    inst = MemoryInstance(name, MemoryConfig.model_validate(cfg))
    host.attach(inst)
    if not service._tasks:
        await service.start()
    await host.start(inst)
    return inst


async def test_mqrfh_and_mqrfh2_publishers_reach_a_sink(
    qm: EmbeddedQueueManager, service: BrokerService, host: PluginHost
) -> None:
    await _start(host, service, "out", subscribe=[STOCK_ALL, "$SYS/STREAM/BULLETIN.STREAM/#"])
    await put(
        qm,
        rfh_message(
            "STOCK.STREAM",
            [
                ("MQPSCommand", "Publish"),
                ("MQPSStreamName", "STOCK.STREAM"),
                ("MQPSTopic", "IBM/Latest"),
                ("Trader", "Ann"),
            ],
            b"141.25",
        ),
    )
    await put(
        qm,
        rfh2_message(
            "SYSTEM.BROKER.DEFAULT.STREAM",
            [("Command", "Publish"), ("Topic", "$SYS/STREAM/BULLETIN.STREAM/News/Today")],
            b"markets open",
            folders=[Element.from_pairs("usr", {"Colour": "Blue"})],
        ),
    )
    records = await get_bus().wait_for(2)
    by_stream = {r.stream: r for r in records}
    stock = by_stream["STOCK.STREAM"]
    assert (stock.topic, stock.payload, stock.properties) == (
        "IBM/Latest",
        b"141.25",
        {"Trader": "Ann"},
    )
    bulletin = by_stream["BULLETIN.STREAM"]
    assert (bulletin.topic, bulletin.payload) == ("News/Today", b"markets open")
    assert bulletin.properties == {"Colour": "Blue"}
    assert bulletin.put_time and bulletin.msg_id != bytes(24)


async def test_plugin_publication_reaches_mqrfh_and_mqrfh2_subscribers(
    qm: EmbeddedQueueManager, service: BrokerService, host: PluginHost
) -> None:
    await service.start()
    await _subscribe_legacy(qm, service)
    await _start(host, service, "in", bus="in-bus")
    await get_bus("in-bus").inject(
        InboundPublication(
            stream="STOCK.STREAM",
            topic="IBM",
            payload=b"142.00",
            properties={"Source": "kafka"},
        )
    )
    await settle(qm, service)
    rfh = await drain(qm, "RFH.SUB")
    rfh2 = await drain(qm, "RFH2.SUB")
    assert len(rfh) == 1 and len(rfh2) == 1
    assert rfh[0].get("MQPSTopic") == "IBM"
    assert rfh[0].get("MQPSStreamName") == "STOCK.STREAM"
    assert rfh[0].get("Source") == "kafka"
    assert rfh[0].payload == b"142.00"
    assert rfh2[0].topic == "$SYS/STREAM/STOCK.STREAM/IBM"
    assert rfh2[0].get("usr/Source") == "kafka"
    assert [f.name for f in rfh2[0].folders] == ["psc", "usr"]  # no gateway folder leaks
    assert rfh2[0].payload == b"142.00"


async def test_instance_never_gets_its_own_publication_back(
    qm: EmbeddedQueueManager, service: BrokerService, host: PluginHost
) -> None:
    await _start(host, service, "a", subscribe=[STOCK_ALL], bus="bus-a")
    await _start(host, service, "b", subscribe=[STOCK_ALL], bus="bus-b")
    await get_bus("bus-a").inject(InboundPublication("STOCK.STREAM", "IBM", b"from a"))
    await get_bus("bus-b").inject(InboundPublication("STOCK.STREAM", "IBM", b"from b"))
    await settle(qm, service)
    assert [r.payload for r in get_bus("bus-a").records] == [b"from b"]
    assert [r.payload for r in get_bus("bus-b").records] == [b"from a"]


async def test_retained_publication_and_its_deletion_reach_sinks(
    qm: EmbeddedQueueManager, service: BrokerService, host: PluginHost
) -> None:
    await _start(host, service, "src", bus="src")
    await _start(host, service, "mirror", subscribe=[STOCK_ALL], bus="mirror")
    src = get_bus("src")
    await src.inject(InboundPublication("STOCK.STREAM", "IBM", b"1", retain=True))
    mirror = get_bus("mirror")
    await mirror.wait_for(1)
    await src.inject(InboundPublication("STOCK.STREAM", "IBM", b"", delete=True))
    records = await mirror.wait_for(2)
    assert [(r.topic, r.payload, r.deleted) for r in records] == [
        ("IBM", b"1", False),
        ("IBM", b"", True),
    ]
    assert records[1].retained
    assert service.engine.retained("STOCK.STREAM") == []
    # A later subscriber gets nothing retained: the deletion was real.
    await _start(host, service, "late", subscribe=[STOCK_ALL], bus="late")
    await settle(qm, service)
    assert get_bus("late").records == []


async def test_legacy_delete_publication_becomes_a_sink_deletion(
    qm: EmbeddedQueueManager, service: BrokerService, host: PluginHost
) -> None:
    await _start(host, service, "mirror", subscribe=[STOCK_ALL], bus="mirror")
    publish = [
        ("MQPSCommand", "Publish"),
        ("MQPSStreamName", "STOCK.STREAM"),
        ("MQPSTopic", "IBM/Latest"),
        ("MQPSPubOpts", "RetainPub"),
    ]
    await put(qm, rfh_message("STOCK.STREAM", publish, b"9"))
    await get_bus("mirror").wait_for(1)
    delete = [
        ("MQPSCommand", "DeletePub"),
        ("MQPSStreamName", "STOCK.STREAM"),
        ("MQPSTopic", "IBM/*"),
    ]
    await put(qm, rfh_message("STOCK.STREAM", delete))
    records = await get_bus("mirror").wait_for(2)
    assert (records[1].topic, records[1].deleted, records[1].payload) == ("IBM/Latest", True, b"")
    # A DeletePub of nothing retained tells the sinks nothing.
    await put(qm, rfh_message("STOCK.STREAM", delete))
    await settle(qm, service)
    assert len(get_bus("mirror").records) == 2


async def test_sink_down_holds_the_batch_on_mq_without_loss_or_backout(
    qm: EmbeddedQueueManager, service: BrokerService, host: PluginHost
) -> None:
    await _start(host, service, "out", subscribe=[STOCK_ALL])
    bus = get_bus()
    bus.down = True
    for i in range(5):
        await put(
            qm,
            rfh_message(
                "STOCK.STREAM",
                [("MQPSCommand", "Publish"), ("MQPSTopic", f"T{i}")],
                str(i).encode(),
            ),
        )
    async with asyncio.timeout(10):
        while bus.refused_sends < 3:
            await asyncio.sleep(0.02)
    assert bus.records == []
    assert service.counters.backouts == 0
    bus.down = False
    records = await bus.wait_for(5)
    await settle(qm, service)
    assert sorted(r.payload for r in bus.records) == [b"0", b"1", b"2", b"3", b"4"]
    assert [r.payload for r in records if r.topic == "T0"] == [b"0"]
    assert service.counters.backouts == 0
    assert service.counters.sink_retries >= 3


async def test_sink_bug_backs_out_and_ends_on_the_dead_letter_queue(
    qm: EmbeddedQueueManager, service: BrokerService, host: PluginHost
) -> None:
    inst = await _start(host, service, "buggy", subscribe=[STOCK_ALL])

    async def broken(deliveries: object) -> None:
        raise ValueError("plugin bug")

    inst.send = broken  # type: ignore[method-assign,assignment]
    await put(
        qm,
        rfh_message("STOCK.STREAM", [("MQPSCommand", "Publish"), ("MQPSTopic", "X")], b"x"),
    )
    async with asyncio.timeout(15):
        while service.counters.moved_to_backout_queue < 1:
            await asyncio.sleep(0.05)
    assert service.counters.backouts >= service.config.default_backout_threshold
    dead = await drain(qm, "SYSTEM.DEAD.LETTER.QUEUE")
    assert len(dead) == 1


async def test_publish_commits_before_returning(
    qm: EmbeddedQueueManager, service: BrokerService
) -> None:
    publisher = MQPublisher(qm, origin="x", serviced_queues={"STOCK.STREAM"})
    try:
        await publisher.publish(
            [
                InboundPublication("STOCK.STREAM", "A", b"1"),
                InboundPublication("OTHER.STREAM", "B", b"2"),
            ]
        )
    finally:
        await publisher.close()
    # Committed (visible to another connection) on the stream's queue or the default one.
    assert qm.queue_depth("STOCK.STREAM") == 1
    assert qm.queue_depth("SYSTEM.BROKER.DEFAULT.STREAM") == 1
    assert publisher.counters.per_stream == {"STOCK.STREAM": 1, "OTHER.STREAM": 1}


@pytest.mark.parametrize(
    ("pub", "fragment"),
    [
        (InboundPublication("BAD STREAM", "a", b""), "stream name"),
        (InboundPublication("S", "", b""), "empty"),
        (InboundPublication("S", "a/#", b"", delete=True), "wildcard"),
        (InboundPublication("S", "a", b"", properties={"1bad": "v"}), "property name"),
        (InboundPublication("S", "a", b"", payload_format="TOOLONGFMT"), "format"),
        (InboundPublication("S", "a", b"", payload_format="MQ\u00e9"), "format"),
        (InboundPublication("S", "a", b"", ccsid=2**40), "CCSID"),
        (InboundPublication("S", "a", b"", ccsid=-5), "CCSID"),
        (InboundPublication("S", "a", b"", encoding=2**31), "encoding"),
    ],
)
async def test_unpublishable_data_is_refused_not_retried(
    qm: EmbeddedQueueManager, pub: InboundPublication, fragment: str
) -> None:
    publisher = MQPublisher(qm)
    ok = InboundPublication("S", "fine", b"")
    with pytest.raises(PublishRefusedError, match=fragment) as info:
        await publisher.publish([ok, pub])
    assert info.value.index == 1
    assert not info.value.retriable
    assert qm.queue_depth("SYSTEM.BROKER.DEFAULT.STREAM") == 0  # nothing half-published
    await publisher.close()


async def test_publish_while_queue_manager_is_gone_is_retriable(qm: EmbeddedQueueManager) -> None:
    publisher = MQPublisher(qm)
    await qm.close()
    with pytest.raises(PluginError) as info:
        await publisher.publish([InboundPublication("S", "a", b"")])
    assert info.value.retriable


async def test_duplicate_instance_names_are_refused(host: PluginHost) -> None:
    host.attach(MemoryInstance("same", MemoryConfig()))
    with pytest.raises(PluginError, match="unique"):
        host.attach(MemoryInstance("same", MemoryConfig()))


async def test_instance_starting_while_its_batch_is_held_does_not_deadlock(
    qm: EmbeddedQueueManager, service: BrokerService, host: PluginHost
) -> None:
    # A durable subscription of "late" from an earlier run.
    await _start(host, service, "late", subscribe=[STOCK_ALL], bus="late")
    await host.stop("late")
    # Now "late" is attached but not started: its deliveries are held on MQ.
    await put(
        qm,
        rfh_message("STOCK.STREAM", [("MQPSCommand", "Publish"), ("MQPSTopic", "X")], b"held"),
    )
    async with asyncio.timeout(10):
        while service.counters.sink_retries < 2:
            await asyncio.sleep(0.02)
    # Starting it subscribes again (needs the engine) while its target is still down:
    # no batch waits for a sink (its deliveries wait on its backlog queue), so nothing
    # has to give way and nothing is backed out.
    inst = host.instances["late"]
    get_bus("late").down = True
    async with asyncio.timeout(10):
        await host.start(inst)
    assert service.counters.backouts == 0
    get_bus("late").down = False
    records = await get_bus("late").wait_for(1)
    await settle(qm, service)
    assert [r.payload for r in records] == [b"held"]
    assert service.counters.moved_to_backout_queue == 0
    assert await drain(qm, "SYSTEM.DEAD.LETTER.QUEUE") == []


async def test_a_poison_publication_does_not_drag_its_batch_to_the_backout_queue(
    qm: EmbeddedQueueManager, service: BrokerService, host: PluginHost
) -> None:
    """One publication a sink can never take fails its whole batch; the batch's other
    messages are then retried one per unit of work, so only the poison one collects
    backouts and is moved aside — the innocent ones are delivered, once each."""
    inst = await _start(host, service, "picky", subscribe=[STOCK_ALL])
    original = inst.send

    async def picky(deliveries: list[Envelope]) -> None:
        if any(d.payload == b"poison" for d in deliveries):
            raise ValueError("cannot take this one")
        await original(deliveries)

    inst.send = picky  # type: ignore[method-assign,assignment]
    payloads = [b"poison", b"g1", b"g2", b"g3", b"g4", b"g5"]
    # Committed in one unit of work, so the service's first batch holds all six.
    conn = await qm.connect()
    try:
        stream = await conn.open("STOCK.STREAM", OpenOption.OUTPUT)
        for i, payload in enumerate(payloads):
            msg = rfh_message(
                "STOCK.STREAM", [("MQPSCommand", "Publish"), ("MQPSTopic", f"T{i}")], payload
            )
            await stream.put(msg.md, msg.body, PutOptions(syncpoint=True))
        await conn.commit()
    finally:
        await conn.disconnect()
    bus = get_bus()
    delivered = await bus.wait_for(5)
    async with asyncio.timeout(15):
        while service.counters.moved_to_backout_queue < 1:
            await asyncio.sleep(0.05)
    await settle(qm, service)
    assert sorted(r.payload for r in delivered) == [b"g1", b"g2", b"g3", b"g4", b"g5"]
    assert sorted(r.payload for r in bus.records) == [b"g1", b"g2", b"g3", b"g4", b"g5"]
    assert service.counters.moved_to_backout_queue == 1
    dead = await drain(qm, "SYSTEM.DEAD.LETTER.QUEUE")
    assert len(dead) == 1


async def test_retained_publication_refused_on_subscribe_is_skipped_not_fatal(
    qm: EmbeddedQueueManager, service: BrokerService, host: PluginHost
) -> None:
    await _start(host, service, "src", bus="src")
    src = get_bus("src")
    await src.inject(InboundPublication("STOCK.STREAM", "IBM", b"1", retain=True))
    await src.inject(InboundPublication("STOCK.STREAM", "BAD", b"2", retain=True))
    await settle(qm, service)

    inst = MemoryInstance(
        "late", MemoryConfig.model_validate({"subscribe": [STOCK_ALL], "bus": "late"})
    )
    real_send = inst.send

    async def picky_send(deliveries: Sequence[Envelope]) -> None:
        if any(d.topic.endswith("BAD") for d in deliveries):
            raise PluginError("cannot map topic BAD")  # not retriable
        await real_send(deliveries)

    inst.send = picky_send  # type: ignore[method-assign]
    host.attach(inst)
    async with asyncio.timeout(10):
        await host.start(inst)  # must not fail for ever on the refused retained one
    # Retained ones travel through the instance's backlog queue like live ones: the
    # refused one is skipped (when sent while subscribing) or, sent later, set aside
    # after the backlog's BOTHRESH; either way it is counted once and blocks nothing.
    async with asyncio.timeout(20):
        while host.sink_counters[
            "late"
        ].retained_skipped + service.counters.moved_to_backout_queue < 1 or [
            r.topic for r in get_bus("late").records
        ] != ["IBM"]:
            await asyncio.sleep(0.02)
    await settle(qm, service)
    assert [r.topic for r in get_bus("late").records] == ["IBM"]
    assert (
        host.sink_counters["late"].retained_skipped + service.counters.moved_to_backout_queue == 1
    )


class _GatedStore:
    """The queue manager's store writes wait for ``gate`` (a slow disk), the first one
    failing once ``fail_first`` is set (a disk that fails): a commit stays in flight
    for as long as the test needs."""

    def __init__(self, qm: EmbeddedQueueManager, *, fail_first: bool = False) -> None:
        self.gate = threading.Event()
        self._real = qm._store.apply
        self._fail = fail_first
        qm._store.apply = self._apply  # type: ignore[method-assign]

    def _apply(self, *args: Any, **kwargs: Any) -> None:
        self.gate.wait(30)
        if self._fail:
            self._fail = False
            raise OSError("the disk failed")
        self._real(*args, **kwargs)


async def _stream_payloads(qm: EmbeddedQueueManager) -> list[bytes]:
    """The payloads of the Publish commands committed on STOCK.STREAM, in queue order
    (got from another connection)."""
    conn = await qm.connect()
    try:
        handle = await conn.open("STOCK.STREAM", OpenOption.INPUT_SHARED)
        got: list[bytes] = []
        while True:
            try:
                got.append((await handle.get(GetOptions())).body[-2:])
            except MQError as exc:
                assert exc.reason == Reason.NO_MSG_AVAILABLE
                return got
    finally:
        await conn.disconnect()


async def _until(condition: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.005)


async def test_next_unit_is_put_while_the_one_before_commits_and_commits_after_it(
    qm: EmbeddedQueueManager,
) -> None:
    store = _GatedStore(qm)
    publisher = MQPublisher(qm, serviced_queues={"STOCK.STREAM"})
    try:
        first = await publisher.begin_publish(
            [InboundPublication("STOCK.STREAM", "t", b"a1"),
             InboundPublication("STOCK.STREAM", "t", b"a2")]
        )
        second = asyncio.ensure_future(
            publisher.begin_publish([InboundPublication("STOCK.STREAM", "t", b"b1")])
        )
        # the second unit is put while the first one's commit waits for the disk
        await _until(lambda: publisher.counters.overlapped == 1, "the second unit put")
        assert not second.done()
        assert await _stream_payloads(qm) == []  # neither committed yet
        store.gate.set()
        await first
        await (await second)
    finally:
        store.gate.set()
        await publisher.close()
    assert await _stream_payloads(qm) == [b"a1", b"a2", b"b1"]
    assert publisher.counters.units_of_work == 2


async def test_a_failed_commit_takes_the_unit_put_behind_it_with_it(
    qm: EmbeddedQueueManager,
) -> None:
    store = _GatedStore(qm, fail_first=True)
    publisher = MQPublisher(qm, serviced_queues={"STOCK.STREAM"})
    first_unit = [InboundPublication("STOCK.STREAM", "t", b"a1")]
    second_unit = [InboundPublication("STOCK.STREAM", "t", b"b1")]
    try:
        first = await publisher.begin_publish(first_unit)
        second = asyncio.ensure_future(publisher.begin_publish(second_unit))
        await _until(lambda: publisher.counters.overlapped == 1, "the second unit put")
        store.gate.set()
        with pytest.raises(PluginError) as failed:
            await first
        assert failed.value.retriable
        with pytest.raises(PluginError) as behind:
            await second
        assert behind.value.retriable
        assert await _stream_payloads(qm) == []  # nothing of either committed
        # published again in order, as a source retries
        await publisher.publish(first_unit)
        await publisher.publish(second_unit)
    finally:
        store.gate.set()
        await publisher.close()
    assert await _stream_payloads(qm) == [b"a1", b"b1"]
