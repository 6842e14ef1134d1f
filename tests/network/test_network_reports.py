"""Report messages across two embedded queue managers joined by channels: COA from the
destination QM and an exception report (Feedback = MQRC) from a receiving QM that
dead-letters, both back at the sender's ReplyToQ through the return channel."""

from __future__ import annotations

from gateway.mq.port import PutOptions
from gateway.wire.constants import Feedback, MsgType, Report
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.network.network_helpers import NetworkFactory, drain, get_one

QMA = """
DEFINE QLOCAL(APP.REPLY)
DEFINE QLOCAL(QMB) USAGE(XMITQ)
DEFINE CHANNEL(QMA.TO.QMB) CHLTYPE(SDR) CONNAME('QMB') XMITQ(QMB)
DEFINE CHANNEL(QMB.TO.QMA) CHLTYPE(RCVR)
"""
QMB = """
DEFINE QLOCAL(IN)
DEFINE QLOCAL(QMA) USAGE(XMITQ)
DEFINE CHANNEL(QMA.TO.QMB) CHLTYPE(RCVR)
DEFINE CHANNEL(QMB.TO.QMA) CHLTYPE(SDR) CONNAME('QMA') XMITQ(QMA)
"""


async def test_coa_and_exception_reports_come_back(make_network: NetworkFactory) -> None:
    async with make_network({"QMA": QMA, "QMB": QMB}) as net:
        qma, qmb = net["QMA"].qm, net["QMB"].qm
        async with await qma.connect() as conn:
            good = await conn.put1(
                "IN", MQMD(format="MQSTR", report=Report.COA, reply_to_q="APP.REPLY"),
                b"hello", PutOptions(), q_mgr_name="QMB")
            lost = await conn.put1(
                "NO.SUCH.QUEUE",
                MQMD(format="MQSTR", report=Report.EXCEPTION_WITH_DATA | Report.PASS_CORREL_ID,
                     correl_id=b"K" * 24, reply_to_q="APP.REPLY"),
                b"lost?", PutOptions(), q_mgr_name="QMB")
        assert good.reply_to_q_mgr == "QMA"  # filled in by the QM at put
        # the far QM still dead-letters (existing behaviour) ...
        dl = await get_one(qmb, "SYSTEM.DEAD.LETTER.QUEUE")
        dlh, _, body = unwrap_from_dlq(dl.md, dl.body)
        assert (dlh.reason, dlh.dest_q_name, body) == (2085, "NO.SUCH.QUEUE", b"lost?")
        # ... and the reports arrive at QMA's APP.REPLY over the return channel
        reports = [await get_one(qma, "APP.REPLY") for _ in range(2)]
        by_feedback = {r.md.feedback: r for r in reports}
        assert set(by_feedback) == {Feedback.COA, Reason.UNKNOWN_OBJECT_NAME}
        coa = by_feedback[Feedback.COA]
        assert coa.md.msg_type == MsgType.REPORT
        assert coa.md.correl_id == good.msg_id and coa.body == b""
        assert coa.md.put_appl_name == qmb.appl_name
        exc = by_feedback[Reason.UNKNOWN_OBJECT_NAME]
        assert exc.md.msg_type == MsgType.REPORT
        assert exc.md.correl_id == b"K" * 24  # PASS_CORREL_ID
        assert exc.md.msg_id != lost.msg_id  # no PASS_MSG_ID: a new MsgId
        assert exc.body == b"lost?" and exc.md.format == "MQSTR"
        assert (await get_one(qmb, "IN")).body == b"hello"
        assert await drain(qma, "APP.REPLY") == []
        assert await drain(qmb, "SYSTEM.DEAD.LETTER.QUEUE") == []
