"""Report messages the embedded queue manager generates itself (COA, COD, EXPIRATION,
EXCEPTION), as IBM MQ does.

Why one module: the rules that turn an original MQMD + body + feedback into a report
(:func:`build_report`, pure) and where a report goes (:func:`send_reports`: the original
ReplyToQ @ ReplyToQMgr through name resolution, else the dead-letter queue) are one
concept; the queue manager only calls in at the points where MQ generates them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.mq.port import MQError, PutOptions
from gateway.wire.constants import (
    MI_NONE,
    Feedback,
    MsgType,
    Report,
)
from gateway.wire.formats import FMT_NONE
from gateway.wire.mqmd import MQMD

if TYPE_CHECKING:
    from gateway.mq.embedded.qmgr import EmbeddedQueueManager

log = logging.getLogger(__name__)

#: How much application data a *_WITH_DATA report carries (MQ: the first 100 bytes).
WITH_DATA_BYTES = 100

# (plain bit, with-data bits, full-data bits) per feedback kind
_COA = (Report.COA, Report.COA_WITH_DATA, Report.COA_WITH_FULL_DATA)
_COD = (Report.COD, Report.COD_WITH_DATA, Report.COD_WITH_FULL_DATA)
_EXPIRATION = (Report.EXPIRATION, Report.EXPIRATION_WITH_DATA,
               Report.EXPIRATION_WITH_FULL_DATA)
_EXCEPTION = (Report.EXCEPTION, Report.EXCEPTION_WITH_DATA, Report.EXCEPTION_WITH_FULL_DATA)


@dataclass(slots=True)
class ReportMessage:
    """A report ready to put: where it goes and what it is."""

    q_name: str
    q_mgr_name: str
    md: MQMD
    body: bytes


def _bits(feedback: int) -> tuple[int, int, int]:
    if feedback == Feedback.COA:
        return _COA
    if feedback == Feedback.COD:
        return _COD
    if feedback == Feedback.EXPIRATION:
        return _EXPIRATION
    return _EXCEPTION


def wants_report(md: MQMD, feedback: int) -> bool:
    """True when ``md`` asks for a report of this feedback kind and one can be sent
    (a ReplyToQ is named, and it is not itself a report)."""
    if md.msg_type == MsgType.REPORT or not md.reply_to_q.strip():
        return False
    plain, _, _ = _bits(feedback)
    return bool(md.report & plain)


def build_report(
    md: MQMD, body: bytes, feedback: int, *, appl_name: str
) -> ReportMessage | None:
    """The report MQ generates about the message (``md``, ``body``) with ``feedback``;
    None when it asks for none. MsgId is MI_NONE (new at put) unless PASS_MSG_ID."""
    if not wants_report(md, feedback):
        return None
    _, with_data, full = _bits(feedback)
    if md.report & full == full:
        data = bytes(body)
    elif md.report & with_data == with_data:
        data = bytes(body[:WITH_DATA_BYTES])
    else:
        data = b""
    out = MQMD(
        msg_type=MsgType.REPORT,
        feedback=feedback,
        report=Report.NONE,
        persistence=md.persistence,
        priority=md.priority,
        expiry=-1,
        encoding=md.encoding if data else MQMD().encoding,
        coded_char_set_id=md.coded_char_set_id if data else MQMD().coded_char_set_id,
        format=md.format if data else FMT_NONE,
        msg_id=md.msg_id if md.report & Report.PASS_MSG_ID else MI_NONE,
        correl_id=md.correl_id if md.report & Report.PASS_CORREL_ID else md.msg_id,
        group_id=md.group_id,
        msg_seq_number=md.msg_seq_number,
        offset=md.offset,
        msg_flags=md.msg_flags,
        original_length=md.original_length,
        user_identifier=md.user_identifier,
        accounting_token=md.accounting_token,
        appl_identity_data=md.appl_identity_data,
        put_appl_name=appl_name,
    )
    if md.report & Report.PASS_DISCARD_AND_EXPIRY:
        out.report = md.report & Report.DISCARD_MSG
    return ReportMessage(md.reply_to_q.strip(), md.reply_to_q_mgr.strip(), out, data)


def arrival_report(qm: EmbeddedQueueManager, q_name: str) -> bool:
    """True when a put to local queue ``q_name`` is an arrival that earns a COA: not a
    transmission queue (the message has not arrived yet) and not the dead-letter queue."""
    qdef = qm.catalogue.get(q_name)
    if qdef is None or qdef.is_xmitq:
        return False
    return q_name != qm.catalogue.qmgr.dead_letter_q_name


async def send_reports(qm: EmbeddedQueueManager, reports: list[ReportMessage]) -> None:
    """Put reports (put1, no syncpoint) through the queue manager's name resolution; a
    report that cannot be put goes to the dead-letter queue; nothing here ever raises
    into the operation that caused the report."""
    if not reports or qm.closed or qm.stopping:
        return
    try:
        conn = await qm.connect()
    except MQError:
        log.warning("%s: %d report(s) lost: queue manager not available", qm.name,
                    len(reports))
        return
    try:
        for r in reports:
            try:
                await conn.put1(r.q_name, r.md, r.body, PutOptions(), r.q_mgr_name)
                qm.stats.reports += 1
            except MQError as exc:
                try:
                    await conn.put_dead_letter(r.md, r.body, exc.reason, r.q_name,
                                               r.q_mgr_name)
                except MQError as dlq_exc:
                    log.warning("%s: report (feedback %d) for %s@%s lost: %s; DLQ: %s",
                                qm.name, r.md.feedback, r.q_name, r.q_mgr_name, exc,
                                dlq_exc)
    except Exception:  # a report never fails the caller's operation
        log.exception("%s: report generation failed", qm.name)
    finally:
        with contextlib.suppress(MQError):
            await conn.disconnect()


def queue_reports(
    qm: EmbeddedQueueManager, items: Sequence[tuple[MQMD, bytes, int]]
) -> None:
    """Build the reports for (md, body, feedback) items and put them in the background
    (the caller's put/get/commit has already succeeded and must not wait on them)."""
    reports = [r for md, body, fb in items
               if (r := build_report(md, body, fb, appl_name=qm.appl_name)) is not None]
    if reports and not qm.closed and not qm.stopping:
        qm._background(send_reports(qm, reports))
