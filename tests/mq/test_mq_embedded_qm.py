"""Embedded queue manager behaviour beyond the port contract: attributes, durability,
name resolution through the engine, transmission and dead-letter queues.

A little over 500 lines on purpose: one scenario per behaviour of one public object
(``EmbeddedQueueManager``), all sharing the same fixtures.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager, QueueManagerUnavailableError
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions, QueueAttr
from gateway.wire.constants import Persistence, Report
from gateway.wire.dlh import unwrap_from_dlq
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from gateway.wire.xqh import unwrap_from_xmitq, wrap_for_xmitq

IO = OpenOption.INPUT_SHARED | OpenOption.OUTPUT | OpenOption.BROWSE | OpenOption.INQUIRE
PERS = Persistence.PERSISTENT
NPERS = Persistence.NOT_PERSISTENT


def mqsc_ok(qm: EmbeddedQueueManager, script: str) -> None:
    for r in qm.run_mqsc(script):
        assert r.ok, (r.line, r.text, r.lines)


def md(**kw: object) -> MQMD:
    kw.setdefault("format", "MQSTR")
    return MQMD(**kw)  # type: ignore[arg-type]


async def test_default_objects_exist(qm: EmbeddedQueueManager) -> None:
    cat = qm.catalogue
    assert cat.qmgr.dead_letter_q_name == "SYSTEM.DEAD.LETTER.QUEUE"
    for name in ("SYSTEM.DEAD.LETTER.QUEUE", "SYSTEM.BROKER.CONTROL.QUEUE",
                 "SYSTEM.BROKER.DEFAULT.STREAM"):
        assert cat.get(name) is not None
    stream = cat.get("SYSTEM.BROKER.DEFAULT.STREAM")
    assert stream is not None and stream.default_persistent
    async with await qm.connect() as conn:
        h = await conn.open("SYSTEM.BROKER.DEFAULT.STREAM", OpenOption.INQUIRE)
        got = await h.inquire(QueueAttr.DEF_PERSISTENCE, QueueAttr.DEAD_LETTER_Q_NAME)
        assert got == {QueueAttr.DEF_PERSISTENCE: 1,
                       QueueAttr.DEAD_LETTER_Q_NAME: "SYSTEM.DEAD.LETTER.QUEUE"}


async def test_persistence_and_priority_defaults_from_queue(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(P.Q) DEFPSIST(YES) DEFPRTY(7)\nDEFINE QLOCAL(N.Q)")
    async with await qm.connect() as conn:
        out = await conn.put1("P.Q", md(), b"x")
        assert out.persistence == PERS and out.priority == 7
        out = await conn.put1("N.Q", md(), b"x")
        assert out.persistence == NPERS and out.priority == 0
        out = await conn.put1("P.Q", md(persistence=NPERS, priority=3), b"x")
        assert out.persistence == NPERS and out.priority == 3


async def test_maxdepth_gives_2053_counting_uncommitted(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(SMALL) MAXDEPTH(2)")
    async with await qm.connect() as conn:
        q = await conn.open("SMALL", IO)
        await q.put(md(), b"1")
        await q.put(md(), b"2", PutOptions(syncpoint=True))
        with pytest.raises(MQError) as err:
            await q.put(md(), b"3")
        assert err.value.reason == Reason.Q_FULL and err.value.retriable
        await conn.backout()
        await q.put(md(), b"3")
        assert qm.queue_depth("SMALL") == 2


async def test_a_full_queue_takes_back_what_the_unit_of_work_got_from_it(
    qm: EmbeddedQueueManager,
) -> None:
    """IBM MQ takes a message got under syncpoint off CURDEPTH at the get, so a unit of
    work may put back to a full queue as many messages as it got from it (a requeue),
    and no more; another connection still finds the queue full."""
    mqsc_ok(qm, "DEFINE QLOCAL(SMALL) MAXDEPTH(2)")
    async with await qm.connect() as conn, await qm.connect() as other:
        q = await conn.open("SMALL", IO)
        await q.put(md(), b"1")
        await q.put(md(), b"2")
        got = await q.get(GetOptions(syncpoint=True))
        await q.put(md(), got.body, PutOptions(syncpoint=True))
        with pytest.raises(MQError) as err:
            await q.put(md(), b"3", PutOptions(syncpoint=True))
        assert err.value.reason == Reason.Q_FULL
        with pytest.raises(MQError) as err:
            await other.put1("SMALL", md(), b"4")
        assert err.value.reason == Reason.Q_FULL
        await conn.commit()
        assert qm.queue_depth("SMALL") == 2
        reader = await other.open("SMALL", OpenOption.INPUT_SHARED)
        assert [(await reader.get(GetOptions())).body for _ in range(2)] == [b"2", b"1"]


async def test_maxmsgl_gives_2030_and_qmgr_limit_2031(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(TINY) MAXMSGL(10)")
    async with await qm.connect() as conn:
        await conn.put1("TINY", md(), b"0123456789")
        with pytest.raises(MQError) as err:
            await conn.put1("TINY", md(), b"0123456789A")
        assert err.value.reason == Reason.MSG_TOO_BIG_FOR_Q
        mqsc_ok(qm, "ALTER QMGR MAXMSGL(32768)\nDEFINE QLOCAL(BIG) MAXMSGL(100000)")
        with pytest.raises(MQError) as err:
            await conn.put1("BIG", md(), bytes(40000))
        assert err.value.reason == Reason.MSG_TOO_BIG_FOR_Q_MGR


async def test_get_and_put_inhibited(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(INH) GET(DISABLED)\nDEFINE QALIAS(INH.A) TARGET(INH) PUT(DISABLED)")
    async with await qm.connect() as conn:
        q = await conn.open("INH", IO)
        await q.put(md(), b"x")
        with pytest.raises(MQError) as err:
            await q.get(GetOptions())
        assert err.value.reason == Reason.GET_INHIBITED
        with pytest.raises(MQError) as err:
            await conn.put1("INH.A", md(), b"x")
        assert err.value.reason == Reason.PUT_INHIBITED
        mqsc_ok(qm, "ALTER QLOCAL(INH) GET(ENABLED) PUT(DISABLED)")
        assert (await q.get(GetOptions())).body == b"x"
        with pytest.raises(MQError) as err:
            await q.put(md(), b"y")
        assert err.value.reason == Reason.PUT_INHIBITED


async def test_waiter_is_told_when_gets_become_inhibited(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(W.INH)")
    async with await qm.connect() as conn:
        q = await conn.open("W.INH", IO)
        waiter = asyncio.ensure_future(q.get(GetOptions(wait_ms=10_000)))
        await asyncio.sleep(0.05)
        mqsc_ok(qm, "ALTER QLOCAL(W.INH) GET(DISABLED)")
        with pytest.raises(MQError) as err:
            await asyncio.wait_for(waiter, 2)
        assert err.value.reason == Reason.GET_INHIBITED


async def test_alias_resolves_to_base_and_inquire(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(BASE) BOTHRESH(3) BOQNAME(BASE.BO)\n"
                "DEFINE QALIAS(ALIAS) TARGET(BASE)")
    async with await qm.connect() as conn:
        a = await conn.open("ALIAS", IO)
        assert a.resolved_q_name == "BASE" and a.resolved_q_mgr_name == "QM1"
        await a.put(md(), b"via-alias")
        b = await conn.open("BASE", IO)
        assert (await b.get(GetOptions())).body == b"via-alias"
        assert await a.inquire(QueueAttr.BASE_Q_NAME) == {QueueAttr.BASE_Q_NAME: "BASE"}
        with pytest.raises(MQError) as err:
            await a.inquire(QueueAttr.CURRENT_Q_DEPTH)
        assert err.value.reason == Reason.SELECTOR_NOT_FOR_TYPE
        got = await b.inquire(QueueAttr.BACKOUT_THRESHOLD, QueueAttr.BACKOUT_REQ_Q_NAME)
        assert got == {QueueAttr.BACKOUT_THRESHOLD: 3, QueueAttr.BACKOUT_REQ_Q_NAME: "BASE.BO"}


async def test_exclusive_input(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(EXCL)")
    async with await qm.connect() as a, await qm.connect() as b:
        h = await a.open("EXCL", OpenOption.INPUT_EXCLUSIVE)
        with pytest.raises(MQError) as err:
            await b.open("EXCL", OpenOption.INPUT_SHARED)
        assert err.value.reason == Reason.OBJECT_IN_USE
        await h.close()
        await b.open("EXCL", OpenOption.INPUT_SHARED)


async def test_remote_queue_put_goes_to_xmitq_with_xqh(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(QM2) USAGE(XMITQ)\n"
                "DEFINE QREMOTE(APP.REMOTE) RNAME(APP.IN) RQMNAME(QM2)")
    async with await qm.connect() as conn:
        h = await conn.open("APP.REMOTE", OpenOption.OUTPUT)
        assert (h.resolved_q_name, h.resolved_q_mgr_name) == ("APP.IN", "QM2")
        sent = await h.put(md(persistence=PERS, report=Report.COA), b"payload")
        x = await conn.open("QM2", OpenOption.INPUT_SHARED)
        got = await x.get(GetOptions())
        assert got.md.format == "MQXMIT"
        assert got.md.correl_id == sent.msg_id and got.md.msg_id != sent.msg_id
        assert got.md.report & 0x0003FF00 == 0
        assert got.md.persistence == PERS
        xm = unwrap_from_xmitq(got.md, got.body)
        assert (xm.remote_q_name, xm.remote_q_mgr_name) == ("APP.IN", "QM2")
        assert xm.body == b"payload" and xm.md.msg_id == sent.msg_id
        assert xm.md.reply_to_q_mgr == "" and xm.md.format == "MQSTR"


async def test_open_remote_for_input_is_2045(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(QM2) USAGE(XMITQ)\nDEFINE QREMOTE(R) RNAME(A) RQMNAME(QM2)")
    async with await qm.connect() as conn:
        with pytest.raises(MQError) as err:
            await conn.open("R", OpenOption.INPUT_SHARED)
        assert err.value.reason == Reason.OPTION_NOT_VALID_FOR_TYPE


async def test_qm_alias_defxmitq_and_errors(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(TO.HUB) USAGE(XMITQ)\n"
                "DEFINE QREMOTE(YORK) RNAME(' ') RQMNAME(CLUSQM) XMITQ(TO.HUB)")
    async with await qm.connect() as conn:
        h = await conn.open("Q", OpenOption.OUTPUT, "YORK")
        assert (h.resolved_q_name, h.resolved_q_mgr_name) == ("Q", "CLUSQM")
        await h.put(md(), b"york")
        x = await conn.open("TO.HUB", OpenOption.INPUT_SHARED)
        xm = unwrap_from_xmitq(*(lambda m: (m.md, m.body))(await x.get(GetOptions())))
        assert xm.remote_q_mgr_name == "CLUSQM"  # the alias name is replaced
        with pytest.raises(MQError) as err:
            await conn.open("Q", OpenOption.OUTPUT, "NOWHERE")
        assert err.value.reason == Reason.UNKNOWN_REMOTE_Q_MGR
        mqsc_ok(qm, "ALTER QMGR DEFXMITQ(TO.HUB)")
        h2 = await conn.open("Q", OpenOption.OUTPUT, "NOWHERE")
        assert h2.resolved_q_mgr_name == "NOWHERE"


async def test_reply_to_alias_rewrites_reply_fields(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(REQ)\nDEFINE QREMOTE(QUEUE) RNAME(OTHERQ) RQMNAME(PISA)")
    async with await qm.connect() as conn:
        out = await conn.put1("REQ", md(msg_type=1, reply_to_q="QUEUE"), b"r")
        assert (out.reply_to_q, out.reply_to_q_mgr) == ("OTHERQ", "PISA")
        out = await conn.put1("REQ", md(msg_type=1, reply_to_q="PLAIN"), b"r")
        assert (out.reply_to_q, out.reply_to_q_mgr) == ("PLAIN", "QM1")
        with pytest.raises(MQError) as err:
            await conn.put1("REQ", md(msg_type=1), b"r")
        assert err.value.reason == Reason.MISSING_REPLY_TO_Q


async def test_inbound_transmission_delivers_or_dead_letters(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(APP.IN)")
    async with await qm.connect() as conn:
        app = md(persistence=PERS, msg_id=b"M" * 24)
        x_md, x_body = wrap_for_xmitq(app, b"hello", "APP.IN", "QM1", msg_id=b"X" * 24)
        d = await conn.deliver_transmission(x_md, x_body)
        assert (d.q_name, d.dead_lettered) == ("APP.IN", False)
        got = await (await conn.open("APP.IN", IO)).get(GetOptions())
        assert got.body == b"hello" and got.md.msg_id == b"M" * 24
        x_md, x_body = wrap_for_xmitq(app, b"lost", "NO.SUCH.Q", "QM1", msg_id=b"Y" * 24)
        d = await conn.deliver_transmission(x_md, x_body)
        assert d.dead_lettered and d.reason == Reason.UNKNOWN_OBJECT_NAME
        dlq = await conn.open("SYSTEM.DEAD.LETTER.QUEUE", IO)
        dead = await dlq.get(GetOptions())
        assert dead.md.format == "MQDEAD"
        dlh, original, data = unwrap_from_dlq(dead.md, dead.body)
        assert dlh.reason == 2085 and (dlh.dest_q_name, dlh.dest_q_mgr_name) == ("NO.SUCH.Q", "QM1")
        assert data == b"lost" and original.format == "MQSTR" and original.msg_id == b"M" * 24
        discard = md(report=Report.DISCARD_MSG)
        x_md, x_body = wrap_for_xmitq(discard, b"bye", "NO.SUCH.Q", "QM1")
        d = await conn.deliver_transmission(x_md, x_body)
        assert d.discarded and not d.dead_lettered
        assert qm.queue_depth("SYSTEM.DEAD.LETTER.QUEUE") == 0


async def test_persistent_survive_restart_nonpersistent_do_not(tmp_path: Path) -> None:
    path = tmp_path / "qm"
    qm = EmbeddedQueueManager("QMR", path)
    mqsc_ok(qm, "DEFINE QLOCAL(DUR)")
    async with await qm.connect() as conn:
        q = await conn.open("DUR", IO)
        await q.put(md(persistence=PERS, priority=1), b"p1")
        await q.put(md(persistence=NPERS), b"n1")
        await q.put(md(persistence=PERS), b"p2")
        await q.put(md(persistence=PERS), b"uncommitted", PutOptions(syncpoint=True))
        await q.put(md(persistence=PERS), b"got")
        # a persistent message got under syncpoint and backed out: count is hardened
        while (m := await q.get(GetOptions(syncpoint=True))).body != b"got":
            pass
        await conn.backout()
    await qm.close()
    qm2 = EmbeddedQueueManager("QMR", path)
    try:
        assert qm2.catalogue.get("DUR") is not None
        async with await qm2.connect() as conn:
            q = await conn.open("DUR", IO)
            bodies = []
            counts = {}
            while True:
                try:
                    m = await q.get(GetOptions())
                except MQError:
                    break
                bodies.append(m.body)
                counts[m.body] = m.md.backout_count
            assert bodies == [b"p1", b"p2", b"got"]
            assert counts[b"got"] == 1
    finally:
        await qm2.close()


async def test_second_owner_is_refused(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QML", tmp_path / "qm")
    try:
        with pytest.raises(QueueManagerUnavailableError) as err:
            EmbeddedQueueManager("QML", tmp_path / "qm")
        assert err.value.reason == Reason.Q_MGR_NOT_AVAILABLE
        assert "in use" in str(err.value)
    finally:
        await qm.close()
    await EmbeddedQueueManager("QML", tmp_path / "qm").close()


async def test_wrong_qmgr_name_for_data_dir(tmp_path: Path) -> None:
    await EmbeddedQueueManager("QMA", tmp_path / "qm").close()
    with pytest.raises(QueueManagerUnavailableError, match="holds queue manager QMA"):
        EmbeddedQueueManager("QMB", tmp_path / "qm")


async def test_mqsc_file_at_start_error_names_line(tmp_path: Path) -> None:
    script = tmp_path / "boot.mqsc"
    script.write_text("* comment\nDEFINE QLOCAL(OK.Q) REPLACE\n\nDEFINE QLOCAL(BAD) MAXDEPTH(x)\n")
    with pytest.raises(Exception, match="line 4"):
        EmbeddedQueueManager("QMS", tmp_path / "qm", mqsc_file=script)
    script.write_text("DEFINE QLOCAL(OK.Q) REPLACE +\n  MAXDEPTH(7)\n")
    qm = EmbeddedQueueManager("QMS", tmp_path / "qm", mqsc_file=script)
    try:
        d = qm.catalogue.get("OK.Q")
        assert d is not None and d.max_depth == 7
    finally:
        await qm.close()


async def test_expired_persistent_message_removed_and_depth_drops(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QME", tmp_path / "qm")
    mqsc_ok(qm, "DEFINE QLOCAL(EXP)")
    async with await qm.connect() as conn:
        q = await conn.open("EXP", IO)
        await q.put(md(persistence=PERS, expiry=1), b"soon")
        assert qm.queue_depth("EXP") == 1
        await asyncio.sleep(0.2)
        with pytest.raises(MQError):
            await q.get(GetOptions())
        assert qm.queue_depth("EXP") == 0
    await qm.close()
    qm2 = EmbeddedQueueManager("QME", tmp_path / "qm")
    try:
        assert qm2.queue_depth("EXP") == 0
    finally:
        await qm2.close()


async def test_delete_queue_rules(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(DEL.Q)")
    async with await qm.connect() as conn:
        await conn.put1("DEL.Q", md(), b"x")
        r = qm.run_mqsc("DELETE QLOCAL(DEL.Q)")[0]
        assert not r.ok and "AMQ8143E" in r.lines[0]
        h = await conn.open("DEL.Q", OpenOption.INPUT_SHARED)
        r = qm.run_mqsc("DELETE QLOCAL(DEL.Q) PURGE")[0]
        assert not r.ok and "in use" in r.lines[0]
        await h.close()
        mqsc_ok(qm, "DELETE QLOCAL(DEL.Q) PURGE")
        with pytest.raises(MQError) as err:
            await conn.open("DEL.Q", OpenOption.OUTPUT)
        assert err.value.reason == Reason.UNKNOWN_OBJECT_NAME


async def test_closed_qmgr(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QMC", tmp_path / "qm")
    mqsc_ok(qm, "DEFINE QLOCAL(C.Q)")
    conn = await qm.connect()
    q = await conn.open("C.Q", IO)
    waiter = asyncio.ensure_future(q.get(GetOptions(wait_ms=-1)))
    await asyncio.sleep(0.05)
    await qm.close()
    with pytest.raises(MQError) as err:
        await asyncio.wait_for(waiter, 2)
    assert err.value.reason == Reason.Q_MGR_STOPPING
    with pytest.raises(MQError) as err:
        await qm.connect()
    assert err.value.reason == Reason.Q_MGR_STOPPING


async def test_wakeup_goes_to_a_waiter_that_can_take_the_message(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(WM)")
    async with await qm.connect() as a, await qm.connect() as b, await qm.connect() as c:
        qa = await a.open("WM", IO)
        qb = await b.open("WM", IO)
        qc = await c.open("WM", IO)
        wants_x = asyncio.ensure_future(qa.get(GetOptions(wait_ms=5000, match_correl_id=b"X" * 24)))
        plain = asyncio.ensure_future(qb.get(GetOptions(wait_ms=5000)))
        await asyncio.sleep(0.05)
        await qc.put(md(correl_id=b"Y" * 24), b"for-anyone")
        assert (await asyncio.wait_for(plain, 2)).body == b"for-anyone"
        await asyncio.sleep(0.05)
        assert not wants_x.done()
        await qc.put(md(correl_id=b"X" * 24), b"for-x")
        assert (await asyncio.wait_for(wants_x, 2)).body == b"for-x"


async def test_cancelled_woken_waiter_passes_the_message_on(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(WP)")
    async with await qm.connect() as a, await qm.connect() as b, await qm.connect() as c:
        qa = await a.open("WP", IO)
        qb = await b.open("WP", IO)
        qc = await c.open("WP", IO)
        first = asyncio.ensure_future(qa.get(GetOptions(wait_ms=5000)))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(qb.get(GetOptions(wait_ms=5000)))
        await asyncio.sleep(0.05)
        await qc.put(md(), b"only")  # wakes `first` only
        first.cancel()  # ... which leaves before taking it
        assert (await asyncio.wait_for(second, 2)).body == b"only"
        with pytest.raises(asyncio.CancelledError):
            await first


async def test_is_a_port_queue_manager(qm: EmbeddedQueueManager) -> None:
    from gateway.mq.port import Connection, QueueHandle, QueueManager

    assert isinstance(qm, QueueManager)
    mqsc_ok(qm, "DEFINE QLOCAL(PORT.Q)")
    async with await qm.connect() as conn:
        assert isinstance(conn, Connection)
        assert isinstance(await conn.open("PORT.Q", IO), QueueHandle)


async def test_concurrent_commits_share_fsyncs_and_are_all_durable(tmp_path: Path) -> None:
    path = tmp_path / "qm"
    qm = EmbeddedQueueManager("QMG", path)
    mqsc_ok(qm, "DEFINE QLOCAL(GC)")
    conns = [await qm.connect() for _ in range(20)]
    handles = [await c.open("GC", OpenOption.OUTPUT) for c in conns]
    for i, h in enumerate(handles):
        await h.put(md(persistence=PERS), f"g{i}".encode(), PutOptions(syncpoint=True))
    before = qm.stats.store_transactions
    await asyncio.gather(*(c.commit() for c in conns))
    assert qm.stats.store_transactions - before < 20 // 2
    for c in conns:
        await c.disconnect()
    await qm.close()
    qm2 = EmbeddedQueueManager("QMG", path)
    try:
        async with await qm2.connect() as conn:
            q = await conn.open("GC", IO)
            bodies = set()
            while True:
                try:
                    bodies.add((await q.get(GetOptions())).body)
                except MQError:
                    break
        assert bodies == {f"g{i}".encode() for i in range(20)}
    finally:
        await qm2.close()


async def test_descriptor_the_store_cannot_hold_fails_the_put(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(MDQ)")
    async with await qm.connect() as conn:
        q = await conn.open("MDQ", IO)
        bad = md(persistence=PERS, reply_to_q="Q.\u65e5\u672c", msg_type=8)
        with pytest.raises(MQError) as err:
            await q.put(bad, b"x", PutOptions(syncpoint=True))
        assert err.value.reason == Reason.MD_ERROR
        await conn.commit()  # nothing half-done is left in the unit of work
        assert qm.queue_depth("MDQ") == 0
        # a version-1 descriptor carrying version-2 values is stored as version 2
        v1 = md(persistence=PERS, version=1, msg_seq_number=3)
        await q.put(v1, b"v1")
        assert (await q.get(GetOptions())).md.msg_seq_number == 3


async def test_one_event_loop_owns_the_queue_manager(qm: EmbeddedQueueManager) -> None:
    import threading

    async with await qm.connect():
        pass
    errors: list[BaseException] = []

    def other_loop() -> None:
        try:
            asyncio.run(qm.connect())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=other_loop)
    t.start()
    t.join(10)
    assert len(errors) == 1 and isinstance(errors[0], MQError)
    assert errors[0].reason == Reason.ENVIRONMENT_ERROR


async def test_inbound_for_another_qmgr_is_forwarded_multi_hop(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(QM3) USAGE(XMITQ)\nDEFINE QREMOTE(QM9) RNAME(' ') RQMNAME(QM3)")
    async with await qm.connect() as conn:
        app = md(persistence=PERS, msg_id=b"H" * 24)
        x_md, x_body = wrap_for_xmitq(app, b"hop", "Q3", "QM3", msg_id=b"1" * 24)
        d = await conn.deliver_transmission(x_md, x_body, syncpoint=True)
        assert (d.q_name, d.q_mgr_name, d.dead_lettered) == ("Q3", "QM3", False)
        assert qm.queue_depth("QM3") == 1  # inside the unit of work: counted, not visible
        xq = await conn.open("QM3", OpenOption.INPUT_SHARED)
        with pytest.raises(MQError):
            await xq.get(GetOptions())
        await conn.commit()
        got = await xq.get(GetOptions())
        xm = unwrap_from_xmitq(got.md, got.body)
        assert (xm.remote_q_name, xm.remote_q_mgr_name, xm.body) == ("Q3", "QM3", b"hop")
        assert xm.md.msg_id == b"H" * 24
        # via the queue-manager alias: the header names the real target
        x_md, x_body = wrap_for_xmitq(app, b"alias", "Q9", "QM9", msg_id=b"2" * 24)
        d = await conn.deliver_transmission(x_md, x_body)
        assert (d.q_name, d.q_mgr_name) == ("Q9", "QM3")
        xm = unwrap_from_xmitq(*(lambda m: (m.md, m.body))(await xq.get(GetOptions())))
        assert xm.remote_q_mgr_name == "QM3"
        # no route: dead-lettered with 2087
        x_md, x_body = wrap_for_xmitq(app, b"lost", "Q", "NOWHERE", msg_id=b"3" * 24)
        d = await conn.deliver_transmission(x_md, x_body)
        assert d.dead_lettered and d.reason == Reason.UNKNOWN_REMOTE_Q_MGR


async def test_sweep_expired_keeps_depth_honest(qm: EmbeddedQueueManager) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(SW1)\nDEFINE QLOCAL(SW2)")
    async with await qm.connect() as conn:
        await conn.put1("SW1", md(persistence=PERS, expiry=1), b"a")
        await conn.put1("SW2", md(expiry=1), b"b")
        await conn.put1("SW2", md(), b"stays")
        await asyncio.sleep(0.2)
        assert (qm.queue_depth("SW1"), qm.queue_depth("SW2")) == (1, 2)
        assert await qm.sweep_expired() == 2
        assert (qm.queue_depth("SW1"), qm.queue_depth("SW2")) == (0, 1)
        assert qm.stats.expired == 2


async def _settled_count(qm: EmbeddedQueueManager, name: str) -> int:
    """Messages really available on ``name``; the depth must agree (nothing left locked).
    Store writes of a cancelled call finish in the background: wait for them (bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while qm.definitions.uncommitted(name) and loop.time() < deadline:
        await asyncio.sleep(0.01)
    async with await qm.connect() as conn:
        h = await conn.open(name, IO)
        depth = (await h.inquire(QueueAttr.CURRENT_Q_DEPTH))[QueueAttr.CURRENT_Q_DEPTH]
        bodies = []
        while True:
            try:
                bodies.append((await h.get(GetOptions(syncpoint=True))).body)
            except MQError as exc:
                assert exc.reason == Reason.NO_MSG_AVAILABLE
                break
        await conn.backout()
        assert depth == len(bodies), f"depth {depth} but {len(bodies)} messages available"
        return len(bodies)


@pytest.mark.parametrize("yields", range(6))
async def test_cancelled_persistent_put_and_get_lose_nothing(tmp_path: Path, yields: int) -> None:
    """A caller cancelled in the middle of a non-syncpoint persistent put or get (a timeout,
    a stopping task) must leave memory and disk agreeing: a put is either wholly there
    or not at all, a get either returned its message or left it on the queue."""
    path = tmp_path / "qm"
    qm = EmbeddedQueueManager("QM1", path)
    try:
        mqsc_ok(qm, "DEFINE QLOCAL(C.Q)")
        async with await qm.connect() as conn:
            h = await conn.open("C.Q", IO)
            put = asyncio.ensure_future(h.put(md(persistence=PERS), b"p"))
            for _ in range(yields):
                await asyncio.sleep(0)
            put.cancel()
            try:
                await put
                put_done = True
            except asyncio.CancelledError:
                put_done = False
            n = await _settled_count(qm, "C.Q")
            assert n == 1 if put_done else n in (0, 1)
            if n == 0:
                await h.put(md(persistence=PERS), b"p")
            get = asyncio.ensure_future(h.get(GetOptions()))
            for _ in range(yields):
                await asyncio.sleep(0)
            get.cancel()
            try:
                got = await get
                assert got.body == b"p"
                expected = 0
            except asyncio.CancelledError:
                expected = 1
            assert await _settled_count(qm, "C.Q") == expected
    finally:
        await qm.close()
    qm = EmbeddedQueueManager("QM1", path)
    try:
        assert await _settled_count(qm, "C.Q") == expected
    finally:
        await qm.close()


@pytest.mark.parametrize("uow", ["put", "get"])
async def test_delete_purge_refused_while_units_of_work_hold_messages(
    qm: EmbeddedQueueManager, uow: str,
) -> None:
    mqsc_ok(qm, "DEFINE QLOCAL(DEL.Q)")
    async with await qm.connect() as conn:
        if uow == "get":
            await conn.put1("DEL.Q", md(persistence=PERS), b"m")
            h = await conn.open("DEL.Q", OpenOption.INPUT_SHARED)
            await h.get(GetOptions(syncpoint=True))
            await h.close()
        else:
            await conn.put1("DEL.Q", md(persistence=PERS), b"m", PutOptions(syncpoint=True))
        [result] = qm.run_mqsc("DELETE QLOCAL(DEL.Q) PURGE")
        assert not result.ok
        assert any("AMQ8143E" in line and "DEL.Q" in line for line in result.lines)
        assert qm.catalogue.get("DEL.Q") is not None
        await conn.commit()
    [result] = qm.run_mqsc("DELETE QLOCAL(DEL.Q) PURGE")
    assert result.ok, result.lines


async def test_commit_after_queue_deleted_stores_nothing(tmp_path: Path) -> None:
    """Should a queue disappear under a unit of work (the store-level delete, which MQSC
    now refuses), the commit must not store rows for it: a later queue of the same name
    would show them after a restart."""
    path = tmp_path / "qm"
    qm = EmbeddedQueueManager("QM1", path)
    try:
        mqsc_ok(qm, "DEFINE QLOCAL(GONE.Q)")
        async with await qm.connect() as conn:
            await conn.put1("GONE.Q", md(persistence=PERS), b"m", PutOptions(syncpoint=True))
            qm.definitions.delete_queue("GONE.Q", True)
            await conn.commit()
        mqsc_ok(qm, "DEFINE QLOCAL(GONE.Q)")
        assert qm.queue_depth("GONE.Q") == 0
    finally:
        await qm.close()
    qm = EmbeddedQueueManager("QM1", path)
    try:
        assert qm.queue_depth("GONE.Q") == 0
    finally:
        await qm.close()
