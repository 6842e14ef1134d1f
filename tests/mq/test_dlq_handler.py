"""The dead-letter queue handler on the embedded queue manager: retry to the original
destination once it exists, forward with and without the MQDLH, discard, ignore, dry
run, failed retries kept, retry counts across passes, WAIT, and crash safety."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.mq.dlq_handler import DlqHandlerError, DlqReport, run_dlq_handler
from gateway.mq.dlq_rules import parse_rules
from gateway.mq.embedded.connection import EmbeddedConnection
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import Browse, GetOptions, Message, MQError, OpenOption
from gateway.wire.constants import MsgType, Persistence, PutApplType
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.xqh import wrap_for_xmitq

DLQ = "SYSTEM.DEAD.LETTER.QUEUE"
BODY = "grüße, 100 €".encode("utf-16-be")  # not ASCII, not the queue manager's CCSID


@pytest.fixture
async def qm(tmp_path: Path) -> AsyncIterator[EmbeddedQueueManager]:
    manager = EmbeddedQueueManager("QM1", tmp_path / "qm1")
    try:
        yield manager
    finally:
        await manager.close()


def mqsc_ok(qm: EmbeddedQueueManager, script: str) -> None:
    for r in qm.run_mqsc(script):
        assert r.ok, (r.line, r.text, r.lines)


def app_md(n: int, **kw: Any) -> MQMD:
    values: dict[str, Any] = dict(
        msg_id=b"M%023d" % n, correl_id=b"C%023d" % n, format="MQSTR",
        coded_char_set_id=1200, encoding=273, persistence=Persistence.PERSISTENT,
        priority=3, reply_to_q="REPLY.Q", reply_to_q_mgr="QM1", user_identifier="alice",
        appl_identity_data="ident", put_appl_type=PutApplType.UNIX,
        put_appl_name="payments-app", put_date="20261126", put_time="10000000",
        msg_type=MsgType.DATAGRAM, expiry=-1,
    )
    values.update(kw)
    return MQMD(**values)


async def dead_letter_via_channel(qm: EmbeddedQueueManager, n: int, queue: str,
                                  **kw: Any) -> MQMD:
    """What a receiving channel does with a message for a queue that does not exist:
    the queue manager dead-letters it with MQRC_UNKNOWN_OBJECT_NAME."""
    md = app_md(n, **kw)
    xmd, xbody = wrap_for_xmitq(md, BODY, queue, "QM1", qmgr_ccsid=819, msg_id=b"X%023d" % n)
    async with await qm.connect() as conn:
        res = await conn.deliver_transmission(xmd, xbody)
    assert res.dead_lettered and res.reason == Reason.UNKNOWN_OBJECT_NAME
    return md


async def dead_letter(qm: EmbeddedQueueManager, n: int, queue: str, reason: int,
                      **kw: Any) -> MQMD:
    md = app_md(n, **kw)
    async with await qm.connect() as conn:
        await conn.put_dead_letter(md, BODY, reason, queue)
    return md


async def browse_all(qm: EmbeddedQueueManager, queue: str) -> list[Message]:
    out: list[Message] = []
    async with await qm.connect() as conn:
        q = await conn.open(queue, OpenOption.BROWSE)
        browse = Browse.FIRST
        while True:
            try:
                out.append(await q.get(GetOptions(browse=browse)))
            except MQError as exc:
                assert exc.reason == Reason.NO_MSG_AVAILABLE
                return out
            browse = Browse.NEXT


async def run(qm: EmbeddedQueueManager, rules: str, *, once: bool = True,
              dry_run: bool = False) -> tuple[DlqReport, str]:
    out = io.StringIO()
    async with await qm.connect() as conn:
        report = await run_dlq_handler(conn, parse_rules(rules), once=once,
                                       dry_run=dry_run, out=out)
        assert isinstance(conn, EmbeddedConnection) and conn.uncommitted == 0
    return report, out.getvalue()


def assert_same_message(got: Message, sent: MQMD) -> None:
    assert got.body == BODY
    for name in ("msg_id", "correl_id", "format", "coded_char_set_id", "encoding",
                 "persistence", "priority", "reply_to_q", "reply_to_q_mgr",
                 "user_identifier", "appl_identity_data", "put_appl_type", "put_appl_name",
                 "put_date", "put_time", "msg_type"):
        assert getattr(got.md, name) == getattr(sent, name), name


# ---------------------------------------------------------------- the acceptance case


async def test_retry_to_a_queue_that_now_exists_and_discard(qm: EmbeddedQueueManager) -> None:
    sent = await dead_letter_via_channel(qm, 1, "APP.LATE")
    junk = await dead_letter_via_channel(qm, 2, "JUNK.Q")
    assert qm.queue_depth(DLQ) == 2
    mqsc_ok(qm, "DEFINE QLOCAL(APP.LATE)")  # the cause is fixed: the queue exists now
    report, text = await run(qm, """\
* retry what failed for lack of the queue, except junk
DESTQ(JUNK.*) ACTION(DISCARD)
REASON(MQRC_UNKNOWN_OBJECT_NAME) ACTION(RETRY) RETRY(3)
""")
    assert (report.retried, report.discarded, report.failed, report.ignored) == (1, 1, 0, 0)
    assert qm.queue_depth(DLQ) == 0
    [got] = await browse_all(qm, "APP.LATE")
    assert_same_message(got, sent)  # body, MD fields, Format/CCSID/Encoding restored
    assert got.md.format == "MQSTR" and got.md.coded_char_set_id == 1200
    lines = text.splitlines()
    assert f"msgid={sent.msg_id.hex()} reason=MQRC_UNKNOWN_OBJECT_NAME dest=APP.LATE@QM1 " \
           "action=RETRY retried (rule line 3)" in lines
    assert f"msgid={junk.msg_id.hex()} reason=MQRC_UNKNOWN_OBJECT_NAME dest=JUNK.Q@QM1 " \
           "action=DISCARD discarded (rule line 2)" in lines
    assert lines[-1].startswith("totals: retried 1, forwarded 0, discarded 1, ignored 0")


# ---------------------------------------------------------------- actions


async def test_forward_with_and_without_header(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(INSPECT.WITH)\nDEFINE QLOCAL(INSPECT.BARE)")
    with_hdr = await dead_letter(qm, 1, "A.Q", Reason.Q_FULL)
    bare = await dead_letter(qm, 2, "B.Q", Reason.PUT_INHIBITED)
    report, _ = await run(qm, """\
DESTQ(A.Q) ACTION(FWD) FWDQ(INSPECT.WITH) HEADER(YES)
DESTQ(B.Q) ACTION(FWD) FWDQ(INSPECT.BARE) FWDQM(QM1) HEADER(NO)
""")
    assert report.forwarded == 2 and qm.queue_depth(DLQ) == 0
    [kept] = await browse_all(qm, "INSPECT.WITH")
    assert kept.md.format == "MQDEAD"
    dlh, original, data = unwrap_from_dlq(kept.md, kept.body)
    assert (dlh.reason, dlh.dest_q_name) == (Reason.Q_FULL, "A.Q")
    assert data == BODY and original.msg_id == with_hdr.msg_id
    [stripped] = await browse_all(qm, "INSPECT.BARE")
    assert_same_message(stripped, bare)


async def test_forward_to_reply_queue_and_destq_substitution(
    qm: EmbeddedQueueManager,
) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(REPLY.Q)\nDEFINE QLOCAL(REAL.DEST)")
    await dead_letter(qm, 1, "X.Q", Reason.NOT_AUTHORIZED)
    await dead_letter(qm, 2, "REAL.DEST", Reason.Q_FULL)
    await dead_letter(qm, 3, "Y.Q", Reason.NOT_AUTHORIZED, reply_to_q="")
    report, text = await run(qm, """\
REASON(MQRC_NOT_AUTHORIZED) REPLYQ(?*) ACTION(FWD) FWDQ(&REPLYQ) FWDQM(&REPLYQM) HEADER(NO)
REASON(MQRC_Q_FULL) ACTION(FWD) FWDQ(&DESTQ) FWDQM(&DESTQM) HEADER(NO)
""")
    assert report.forwarded == 2 and report.ignored == 1
    assert len(await browse_all(qm, "REPLY.Q")) == 1
    assert len(await browse_all(qm, "REAL.DEST")) == 1
    assert qm.queue_depth(DLQ) == 1  # blank ReplyToQ: REPLYQ(?*) does not match
    assert "left (no matching rule)" in text


async def test_ignore_leaves_the_message(qm: EmbeddedQueueManager) -> None:
    sent = await dead_letter(qm, 1, "A.Q", Reason.Q_FULL)
    report, text = await run(qm, "ACTION(IGNORE)")
    assert report.ignored == 1 and report.removed == 0
    [left] = await browse_all(qm, DLQ)
    assert left.md.msg_id == sent.msg_id and left.md.backout_count == 0
    assert "action=IGNORE left (rule line 1)" in text


async def test_dry_run_changes_nothing(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(APP.LATE)")
    await dead_letter(qm, 1, "APP.LATE", Reason.UNKNOWN_OBJECT_NAME)
    await dead_letter(qm, 2, "GONE.Q", Reason.UNKNOWN_OBJECT_NAME)
    await dead_letter(qm, 3, "JUNK.Q", Reason.Q_FULL)
    before = await browse_all(qm, DLQ)
    report, text = await run(qm, """\
REASON(MQRC_UNKNOWN_OBJECT_NAME) ACTION(RETRY)
ACTION(DISCARD)
""", once=False, dry_run=True)
    after = await browse_all(qm, DLQ)
    assert [(m.md, m.body) for m in after] == [(m.md, m.body) for m in before]
    assert qm.queue_depth("APP.LATE") == 0
    assert report.removed == 0 and report.passes == 1
    assert "dry run: would retry (rule line 1)" in text
    assert "dry run: would retry, but the destination does not open: " \
           "MQRC_UNKNOWN_OBJECT_NAME" in text
    assert "dry run: would discard (rule line 2)" in text


async def test_failed_retry_stays_on_the_dlq_then_next_rule(
    qm: EmbeddedQueueManager,
) -> None:
    sent = await dead_letter_via_channel(qm, 1, "STILL.MISSING")
    mqsc_ok(qm, "DEFINE QLOCAL(PARKED)")
    rules = """\
RETRYINT(0) WAIT(NO)
REASON(MQRC_UNKNOWN_OBJECT_NAME) ACTION(RETRY) RETRY(2)
ACTION(FWD) FWDQ(PARKED) HEADER(YES)
"""
    report, text = await run(qm, rules.replace("ACTION(FWD)", "DESTQ(NONE) ACTION(FWD)"))
    assert report.failed == 1 and report.removed == 0
    [left] = await browse_all(qm, DLQ)
    assert left.md.msg_id == sent.msg_id and left.body.endswith(BODY)
    assert "action=RETRY failed: MQRC_UNKNOWN_OBJECT_NAME, kept on the DLQ" in text
    # not once: two attempts RETRYINT apart, then the next matching rule forwards it
    report, text = await run(qm, rules, once=False)
    assert report.failed == 2 and report.forwarded == 1 and report.passes == 3
    assert qm.queue_depth(DLQ) == 0 and qm.queue_depth("PARKED") == 1


async def test_retry_succeeds_on_a_later_pass(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(SMALL) MAXDEPTH(1)")
    async with await qm.connect() as conn:
        await conn.put1("SMALL", app_md(9), b"occupant")
    sent = await dead_letter(qm, 1, "SMALL", Reason.Q_FULL)
    out = io.StringIO()

    async def drain_soon() -> None:
        await asyncio.sleep(0.3)
        async with await qm.connect() as conn:
            q = await conn.open("SMALL", OpenOption.INPUT_SHARED)
            assert (await q.get()).body == b"occupant"

    async with await qm.connect() as conn:
        drain = asyncio.create_task(drain_soon())
        report = await run_dlq_handler(
            conn, parse_rules("RETRYINT(1) WAIT(NO)\nREASON(MQRC_Q_FULL) ACTION(RETRY) RETRY(5)"),
            once=False, dry_run=False, out=out)
        await drain
    assert report.failed == 1 and report.retried == 1 and report.passes == 2
    [got] = await browse_all(qm, "SMALL")
    assert_same_message(got, sent)


async def test_wait_seconds_picks_up_a_new_arrival_then_ends(
    qm: EmbeddedQueueManager,
) -> None:
    async def arrive_later() -> None:
        await asyncio.sleep(0.3)
        await dead_letter(qm, 5, "LATE.Q", Reason.Q_FULL)

    task = asyncio.create_task(arrive_later())
    report, _ = await run(qm, "WAIT(1)\nACTION(DISCARD)", once=False)
    await task
    assert report.discarded == 1 and report.passes == 2
    assert qm.queue_depth(DLQ) == 0


async def test_message_without_dlh_is_reported_and_left(qm: EmbeddedQueueManager) -> None:
    async with await qm.connect() as conn:
        await conn.put1(DLQ, app_md(1), b"no header here")
    report, text = await run(qm, "ACTION(DISCARD)")
    assert report.no_header == 1 and qm.queue_depth(DLQ) == 1
    assert "no MQDLH" in text


async def test_inputq_and_errors(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(OTHER.DLQ)")
    async with await qm.connect() as conn:
        await conn.put_dead_letter(app_md(1), BODY, Reason.Q_FULL, "A.Q")
    async with await qm.connect() as conn:
        q = await conn.open("OTHER.DLQ", OpenOption.OUTPUT | OpenOption.SET_ALL_CONTEXT)
        [m] = await browse_all(qm, DLQ)
        await q.put(m.md, m.body)
    report, _ = await run(qm, "INPUTQ(OTHER.DLQ)\nACTION(DISCARD)")
    assert report.discarded == 1 and qm.queue_depth("OTHER.DLQ") == 0
    assert qm.queue_depth(DLQ) == 1
    with pytest.raises(DlqHandlerError, match=r"INPUTQM\(QM9\)"):
        await run(qm, "INPUTQM(QM9)\nACTION(DISCARD)")
    with pytest.raises(DlqHandlerError, match=r"NO\.SUCH\.DLQ"):
        await run(qm, "INPUTQ(NO.SUCH.DLQ)\nACTION(DISCARD)")


# ---------------------------------------------------------------- crash safety


class _Crash(Exception):
    pass


async def test_a_put_that_raises_leaves_the_message_on_the_dlq(
    qm: EmbeddedQueueManager, monkeypatch: pytest.MonkeyPatch,
) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(APP.LATE)")
    sent = await dead_letter(qm, 1, "APP.LATE", Reason.UNKNOWN_OBJECT_NAME)
    from gateway.mq.embedded.handle import EmbeddedQueueHandle

    real_put = EmbeddedQueueHandle.put

    async def exploding_put(self: EmbeddedQueueHandle, *a: Any, **kw: Any) -> MQMD:
        await real_put(self, *a, **kw)  # the put is in the unit of work...
        raise _Crash("process dies here")  # ...and the handler never commits

    monkeypatch.setattr(EmbeddedQueueHandle, "put", exploding_put)
    with pytest.raises(_Crash):
        await run(qm, "ACTION(RETRY)")
    monkeypatch.undo()
    [left] = await browse_all(qm, DLQ)
    assert left.md.msg_id == sent.msg_id
    assert qm.queue_depth("APP.LATE") == 0  # no duplicate either


async def test_crash_at_commit_keeps_one_copy(
    qm: EmbeddedQueueManager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(APP.LATE)")
    await dead_letter(qm, 1, "APP.LATE", Reason.UNKNOWN_OBJECT_NAME)

    async def dying_commit(self: EmbeddedConnection, *a: Any, **kw: Any) -> None:
        raise _Crash("killed before MQCMIT")

    monkeypatch.setattr(EmbeddedConnection, "commit", dying_commit)
    with pytest.raises(_Crash):
        await run(qm, "ACTION(RETRY)")
    monkeypatch.undo()
    assert qm.queue_depth(DLQ) == 1 and qm.queue_depth("APP.LATE") == 0
    # restart: the persistent message is still on the DLQ, once, and the retry now works
    await qm.close()
    async with EmbeddedQueueManager("QM1", tmp_path / "qm1") as again:
        assert again.queue_depth(DLQ) == 1 and again.queue_depth("APP.LATE") == 0
        report, _ = await run(again, "ACTION(RETRY)")
        assert report.retried == 1
        assert again.queue_depth(DLQ) == 0 and again.queue_depth("APP.LATE") == 1


async def test_a_retried_message_that_comes_back_uses_up_its_retries(
    qm: EmbeddedQueueManager,
) -> None:
    """A retried message dead-lettered again with the same MsgId/CorrelId (as the broker
    does with a command it refuses) is retried RETRY(n) times in all, then left: the
    handler does not loop put/refuse for ever."""
    mqsc_ok(qm, "DEFINE QLOCAL(BOUNCE.Q)")
    sent = await dead_letter(qm, 7, "BOUNCE.Q", Reason.NOT_AUTHORIZED)
    bounced = 0

    async def refuse_again() -> None:  # what the broker does with a refused command
        nonlocal bounced
        async with await qm.connect() as conn:
            q = await conn.open("BOUNCE.Q", OpenOption.INPUT_SHARED)
            while True:
                try:
                    msg = await q.get(GetOptions(wait_ms=200))
                except MQError:
                    continue
                await conn.put_dead_letter(msg.md, msg.body, Reason.NOT_AUTHORIZED, "BOUNCE.Q")
                bounced += 1

    bouncer = asyncio.create_task(refuse_again())
    try:
        report, text = await asyncio.wait_for(
            run(qm, "RETRYINT(1) WAIT(1)\nREASON(MQRC_NOT_AUTHORIZED) ACTION(RETRY) RETRY(2)",
                once=False), 30)
    finally:
        bouncer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await bouncer
    assert report.retried == 2 and bounced == 2, text
    assert "retries exhausted" in text
    [left] = await browse_all(qm, DLQ)
    assert left.md.msg_id == sent.msg_id
