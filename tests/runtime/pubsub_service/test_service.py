"""BrokerService on the embedded queue manager: options, retained publications, request
update, delete, negative cases, dead-lettering, backout threshold and sinks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.plugin_api import Envelope
from gateway.pubsub.topics import Scheme
from gateway.runtime.backlog_format import BACKLOG_FORMAT, backlog_queue_name
from gateway.runtime.pubsub_service import BrokerService
from gateway.wire.constants import MsgType, Persistence, Report
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.reasons import Reason
from tests.support.pubsub_messages import CONTROL, DEFAULT, rfh2_message, rfh_message
from tests.support.service_client import drain, drain_raw, put, settle

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
REQ = MsgType.REQUEST


def regsub(topic: str, queue: str = "SUB.Q", *opts: str, **md: object) -> object:
    pairs = [("MQPSCommand", "RegSub"), ("MQPSTopic", topic), ("MQPSQName", queue)]
    pairs += [("MQPSRegOpts", o) for o in opts]
    md.setdefault("reply_to_q", "REPLY.Q")
    md.setdefault("msg_type", REQ)
    return rfh_message(CONTROL, pairs, **md)


async def test_options_retained_update_and_delete(
    qm: EmbeddedQueueManager, service: BrokerService
) -> None:
    # retained publication first, persistent
    await put(
        qm,
        rfh_message(
            DEFAULT,
            [("MQPSCommand", "Publish"), ("MQPSTopic", "px/apple"), ("MQPSPubOpts", "RetainPub")],
            b"1.10",
            persistence=Persistence.PERSISTENT,
        ),
    )
    await settle(qm, service)
    # InformIfRet + CorrelAsId + NonPers subscriber receives it flagged, with its CorrelId
    cid = b"C" * 24
    await put(qm, regsub("px/*", "SUB.Q", "InformIfRet", "CorrelAsId", "NonPers", correl_id=cid))
    # a PubOnReqOnly subscriber gets nothing until it asks
    await put(qm, regsub("px/*", "SUB2.Q", "PubOnReqOnly"))
    await settle(qm, service)
    assert [r.get("MQPSReason") for r in await drain(qm, "REPLY.Q")] == ["0", "0"]
    [ret] = await drain(qm, "SUB.Q")
    assert ret.payload == b"1.10" and ret.get("MQPSPubOpts") == "IsRetainedPub"
    assert ret.md.correl_id == cid and ret.md.persistence == Persistence.NOT_PERSISTENT
    assert await drain(qm, "SUB2.Q") == []

    await put(
        qm,
        rfh_message(
            CONTROL,
            [("MQPSCommand", "ReqUpdate"), ("MQPSTopic", "px/*"), ("MQPSQName", "SUB2.Q")],
            reply_to_q="REPLY.Q",
            msg_type=REQ,
        ),
    )
    await settle(qm, service)
    assert [r.payload for r in await drain(qm, "SUB2.Q")] == [b"1.10"]
    assert [r.get("MQPSReason") for r in await drain(qm, "REPLY.Q")] == ["0"]

    await put(
        qm,
        rfh_message(
            DEFAULT,
            [("MQPSCommand", "DeletePub"), ("MQPSTopic", "px/apple")],
            reply_to_q="REPLY.Q",
            msg_type=REQ,
        ),
    )
    await settle(qm, service)
    assert [r.get("MQPSReason") for r in await drain(qm, "REPLY.Q")] == ["0"]
    await put(
        qm,
        rfh_message(
            CONTROL,
            [("MQPSCommand", "ReqUpdate"), ("MQPSTopic", "px/*"), ("MQPSQName", "SUB2.Q")],
            reply_to_q="REPLY.Q",
            msg_type=REQ,
        ),
    )
    await settle(qm, service)
    assert [r.get("MQPSReason") for r in await drain(qm, "REPLY.Q")] == [
        str(int(Reason.NO_RETAINED_MSG))
    ]
    assert await drain(qm, DLQ) == []  # a refusal is not a malformed message


async def test_malformed_command_is_answered_and_dead_lettered(
    qm: EmbeddedQueueManager, service: BrokerService
) -> None:
    bad = rfh2_message(
        CONTROL,
        [("Command", "RegSub"), ("Topic", "a"), ("RegOpt", "Bogus")],
        reply_to_q="REPLY.Q",
        msg_type=REQ,
    )
    await put(qm, bad)
    await put(qm, regsub("after/bad"))  # the queue is not blocked
    await settle(qm, service)
    replies = await drain(qm, "REPLY.Q")
    assert [r.get("pscr/Completion") or r.get("MQPSReason") for r in replies] == ["error", "0"]
    assert replies[0].get("pscr/Response/Reason") == str(int(Reason.REG_OPTIONS_ERROR))
    [dead] = await drain_raw(qm, DLQ)
    dlh, original_md, original_body = unwrap_from_dlq(dead.md, dead.body)
    assert dlh.reason == Reason.REG_OPTIONS_ERROR and dlh.dest_q_name == CONTROL
    assert original_md.format == "MQHRF2" and original_body == bad.body
    assert [s.topic for s in service.engine.subscriptions] == ["after/bad"]


async def test_undeliverable_subscriber_is_dead_lettered_others_still_served(
    qm: EmbeddedQueueManager, service: BrokerService
) -> None:
    await put(qm, regsub("u", "NO.SUCH.QUEUE"))
    await put(qm, regsub("u", "SUB.Q"))
    await settle(qm, service)
    await put(qm, rfh_message(DEFAULT, [("MQPSCommand", "Publish"), ("MQPSTopic", "u")], b"x"))
    await settle(qm, service)
    assert [m.payload for m in await drain(qm, "SUB.Q")] == [b"x"]
    [dead] = await drain_raw(qm, DLQ)
    dlh, _md, body = unwrap_from_dlq(dead.md, dead.body)
    assert dlh.reason == Reason.UNKNOWN_OBJECT_NAME and dlh.dest_q_name == "NO.SUCH.QUEUE"
    assert body.endswith(b"x")


class RecordingSink:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.batches: list[list[Envelope]] = []

    async def send(self, deliveries: Sequence[Envelope]) -> None:
        if self.fail:
            raise ConnectionError("broker down")
        self.batches.append(list(deliveries))


async def test_sink_subscribers_and_commit_after_ack(
    qm: EmbeddedQueueManager, service: BrokerService
) -> None:
    await put(
        qm,
        rfh_message(
            "StreamX",
            [("MQPSCommand", "Publish"), ("MQPSTopic", "k/0"), ("MQPSPubOpts", "RetainPub")],
            b"old",
        ),
    )
    await settle(qm, service)
    sink = RecordingSink()
    service.register_sink("kafka", sink)
    await service.subscribe_sink("kafka", "$SYS/STREAM/StreamX/#", scheme=Scheme.TOPIC)
    await settle(qm, service)  # retained ones travel through the sink's backlog too
    assert [[d.payload for d in batch] for batch in sink.batches] == [[b"old"]]  # retained
    await put(qm, rfh_message("StreamX", [("MQPSCommand", "Publish"), ("MQPSTopic", "k/1")], b"v"))
    await settle(qm, service)
    d = sink.batches[-1][0]
    assert len(sink.batches) == 2
    assert (d.stream, d.topic) == ("StreamX", "k/1")  # $SYS/STREAM/StreamX/k/1
    assert d.payload == b"v" and not d.from_retained_store
    assert await service.unsubscribe_sink("kafka", "$SYS/STREAM/StreamX/#")
    await put(qm, rfh_message("StreamX", [("MQPSCommand", "Publish"), ("MQPSTopic", "k/2")], b"w"))
    await settle(qm, service)
    assert len(sink.batches) == 2


async def test_units_of_work_stay_under_the_put_limit(
    qm: EmbeddedQueueManager, service: BrokerService
) -> None:
    service.config.max_puts_per_unit = 10
    for i in range(30):
        await put(
            qm, regsub("fan/out", "SUB.Q", "CorrelAsId", correl_id=(i + 1).to_bytes(24, "big"))
        )
    await settle(qm, service)
    await drain(qm, "REPLY.Q")
    before = service.counters.batches
    for _ in range(4):
        await put(
            qm, rfh_message(DEFAULT, [("MQPSCommand", "Publish"), ("MQPSTopic", "fan/out")], b"f")
        )
    await settle(qm, service)
    assert len(await drain(qm, "SUB.Q")) == 4 * 30
    assert service.counters.batches - before == 4  # one publication per unit of work


async def test_units_of_work_count_gets_and_sink_deliveries(
    qm: EmbeddedQueueManager, service: BrokerService
) -> None:
    """MaxUncommittedMsgs counts gets as well as puts: a batch whose publications only go
    to a sink (no MQ put due while it grows) still ends at ``max_puts_per_unit`` messages
    in its unit of work, each publication being one get and one sink delivery."""
    sink = RecordingSink()
    service.register_sink("kafka", sink)
    await service.subscribe_sink("kafka", "$SYS/STREAM/StreamX/#", scheme=Scheme.TOPIC)
    await settle(qm, service)
    await service.stop()
    for i in range(30):
        await put(
            qm, rfh_message("StreamX", [("MQPSCommand", "Publish"), ("MQPSTopic", f"k/{i}")], b"v")
        )
    service.config.max_puts_per_unit = 10
    before = service.counters.batches
    await service.start()
    await settle(qm, service)
    assert sorted(int(d.topic[2:]) for b in sink.batches for d in b) == list(range(30))
    assert service.counters.batches - before == 6  # 5 gets + 5 sink deliveries each


async def test_poison_sink_delivery_moves_to_backout_queue_and_does_not_block(
    qm: EmbeddedQueueManager, service: BrokerService
) -> None:
    """A publication one sink keeps failing on is backed out on that sink's backlog queue
    until its BOTHRESH, then moved as is to its BOQNAME; the stream and its MQ
    subscribers are never held."""
    failing = RecordingSink(fail=True)
    service.register_sink("down", failing)
    backlog = backlog_queue_name("down")
    qm.run_mqsc(f"ALTER QLOCAL('{backlog}') BOTHRESH(2) BOQNAME(PUB.BACKOUT)", stop_on_error=True)
    await service.stop()
    await service.start()  # re-reads BOTHRESH/BOQNAME
    await service.subscribe_sink("down", "$SYS/STREAM/StreamX/poison")
    await put(
        qm,
        rfh_message(
            CONTROL,
            [
                ("MQPSCommand", "RegSub"),
                ("MQPSTopic", "fine"),
                ("MQPSQName", "SUB.Q"),
                ("MQPSStreamName", "StreamX"),
            ],
        ),
    )
    await settle(qm, service, CONTROL)
    await put(
        qm, rfh_message("StreamX", [("MQPSCommand", "Publish"), ("MQPSTopic", "poison")], b"p")
    )
    await put(qm, rfh_message("StreamX", [("MQPSCommand", "Publish"), ("MQPSTopic", "fine")], b"f"))
    await settle(qm, service, "StreamX", timeout=20)
    assert [m.payload for m in await drain(qm, "SUB.Q")] == [b"f"]
    deadline = time.monotonic() + 20
    while service.counters.moved_to_backout_queue < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    moved = await drain_raw(qm, "PUB.BACKOUT")
    assert len(moved) == 1 and moved[0].body.endswith(b"p")
    assert moved[0].md.format == BACKLOG_FORMAT  # moved as is (the backlog message)
    assert service.counters.backouts >= 2 and service.counters.moved_to_backout_queue == 1
    assert qm.queue_depth(backlog) == 0


async def test_datagram_with_nan_only_answers_failures(
    qm: EmbeddedQueueManager, service: BrokerService
) -> None:
    await put(qm, regsub("ok/topic", msg_type=MsgType.DATAGRAM, report=Report.NAN))
    await put(qm, regsub("bad/#", msg_type=MsgType.DATAGRAM, report=Report.NAN))
    await settle(qm, service)
    replies = await drain(qm, "REPLY.Q")
    assert [r.get("MQPSReason") for r in replies] == [str(int(Reason.TOPIC_ERROR))]


async def test_more_options_on_the_embedded_qm(
    qm: EmbeddedQueueManager, service: BrokerService
) -> None:
    # MQRFH2 subscriber on StreamX with the prefix; MQRFH subscriber with InclStreamName
    await put(
        qm,
        rfh2_message(
            CONTROL,
            [("Command", "RegSub"), ("Topic", "$SYS/STREAM/StreamX/o/+"), ("QName", "SUB2.Q")],
            reply_to_q="REPLY.Q",
            msg_type=REQ,
        ),
    )
    await put(qm, regsub("o/*", "SUB.Q", "InclStreamName", "Pers"))
    await put(qm, regsub("o/*", "SUB.SAME"))
    await settle(qm, service)
    assert len(await drain(qm, "REPLY.Q")) == 3
    # OtherSubsOnly: the publisher (identity SUB.SAME) does not get its own publication
    await put(
        qm,
        rfh_message(
            DEFAULT,
            [("MQPSCommand", "Publish"), ("MQPSTopic", "o/1"), ("MQPSPubOpts", "OtherSubsOnly")],
            b"mine",
            reply_to_q="SUB.SAME",
            persistence=Persistence.NOT_PERSISTENT,
        ),
    )
    await put(
        qm, rfh_message("StreamX", [("MQPSCommand", "Publish"), ("MQPSTopic", "o/2")], b"streamx")
    )
    await settle(qm, service)
    [v1] = await drain(qm, "SUB.Q")
    assert (v1.topic, v1.get("MQPSStreamName"), v1.payload) == ("o/1", DEFAULT, b"mine")
    assert v1.md.persistence == Persistence.PERSISTENT  # Pers overrides the publisher
    assert await drain(qm, "SUB.SAME") == []
    [v2] = await drain(qm, "SUB2.Q")
    assert (v2.topic, v2.payload) == ("$SYS/STREAM/StreamX/o/2", b"streamx")
    # MQRFH2 DeregSub, then a publication reaches nobody on StreamX
    await put(
        qm,
        rfh2_message(
            CONTROL,
            [("Command", "DeregSub"), ("Topic", "$SYS/STREAM/StreamX/o/+"), ("QName", "SUB2.Q")],
            reply_to_q="REPLY.Q",
            msg_type=REQ,
        ),
    )
    await settle(qm, service)
    assert [r.get("pscr/Completion") for r in await drain(qm, "REPLY.Q")] == ["ok"]
    await put(qm, rfh_message("StreamX", [("MQPSCommand", "Publish"), ("MQPSTopic", "o/3")], b"x"))
    await settle(qm, service)
    assert await drain(qm, "SUB2.Q") == []
