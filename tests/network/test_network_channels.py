"""Sender/receiver channels between embedded queue managers (scenario 9 and basics)."""

from __future__ import annotations

from gateway.mq.port import OpenOption, PutOptions
from gateway.wire.constants import Persistence
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.network.network_helpers import NetworkFactory, drain, get_one, wait_for

QMA = """
DEFINE QLOCAL(QMB) USAGE(XMITQ)
DEFINE QREMOTE(TARGET) RNAME(IN) RQMNAME(QMB) XMITQ(QMB)
DEFINE CHANNEL(QMA.TO.QMB) CHLTYPE(SDR) CONNAME('QMB') XMITQ(QMB)
"""
QMB = """
DEFINE QLOCAL(IN)
DEFINE CHANNEL(QMA.TO.QMB) CHLTYPE(RCVR)
"""


async def test_sender_receiver_moves_messages_in_order(make_network: NetworkFactory) -> None:
    async with make_network({"QMA": QMA, "QMB": QMB}) as net:
        qma, qmb = net["QMA"].qm, net["QMB"].qm
        async with await qma.connect() as conn:
            q = await conn.open("TARGET", OpenOption.OUTPUT)
            for i in range(120):
                await q.put(MQMD(format="MQSTR", persistence=Persistence.PERSISTENT,
                                 reply_to_q="R"), f"m{i}".encode())
        got = [await get_one(qmb, "IN") for _ in range(120)]
        assert [m.body for m in got] == [f"m{i}".encode() for i in range(120)]
        first = got[0].md
        assert first.format == "MQSTR"  # MQXQH stripped
        assert (first.reply_to_q, first.reply_to_q_mgr) == ("R", "QMA")
        assert first.put_appl_name  # original context kept
        assert qma.queue_depth("QMB") == 0
        sender = net["QMA"].senders[("MANUAL", "QMA.TO.QMB")]
        assert sender.stats.messages == 120
        assert sender.stats.batches >= 3  # BATCHSZ 50


async def test_scenario9_missing_destination_goes_to_dlq(make_network: NetworkFactory) -> None:
    async with make_network({"QMA": QMA, "QMB": QMB}) as net:
        qma, qmb = net["QMA"].qm, net["QMB"].qm
        async with await qma.connect() as conn:
            sent = await conn.put1("NO.SUCH.QUEUE", MQMD(format="MQSTR", msg_id=b"M" * 24),
                                   b"lost?", PutOptions(), q_mgr_name="QMB")
        dl = await get_one(qmb, "SYSTEM.DEAD.LETTER.QUEUE")
        assert dl.md.format == "MQDEAD"
        dlh, md, body = unwrap_from_dlq(dl.md, dl.body)
        assert dlh.reason == Reason.UNKNOWN_OBJECT_NAME == 2085
        assert (dlh.dest_q_name, dlh.dest_q_mgr_name) == ("NO.SUCH.QUEUE", "QMB")
        assert dlh.format == "MQSTR"
        assert body == b"lost?"
        assert md.msg_id == sent.msg_id == b"M" * 24
        assert await drain(qmb, "IN", 100) == []


async def test_unknown_channel_is_refused_and_messages_wait(make_network: NetworkFactory) -> None:
    qmb_without_rcvr = "DEFINE QLOCAL(IN)\n"
    async with make_network({"QMA": QMA, "QMB": qmb_without_rcvr}) as net:
        qma = net["QMA"].qm
        async with await qma.connect() as conn:
            await conn.put1("TARGET", MQMD(format="MQSTR", persistence=Persistence.PERSISTENT),
                            b"x")
        sender = net["QMA"].senders[("MANUAL", "QMA.TO.QMB")]
        await wait_for(lambda: "no receiver channel QMA.TO.QMB" in sender.last_error)
        assert sender.retrying
        assert qma.queue_depth("QMB") == 1  # kept, not lost
        net["QMB"].qm.run_mqsc("DEFINE CHANNEL(QMA.TO.QMB) CHLTYPE(RCVR)")
        got = await get_one(net["QMB"].qm, "IN")
        assert got.body == b"x"
