"""``put_all`` tells its DeliveryReport once per queue between failures (issue 16,
fan-out pass 2): the engine's failure runs end and grow exactly as with one call per
delivery, and every failure is still told and dead-lettered in order."""

from __future__ import annotations

from pathlib import Path

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, OpenOption
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.store import MemoryStore
from gateway.runtime.pubsub_service.dead_letter import Put, put_all
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason


class Recorder:
    """The DeliveryReport calls, in order; passed on to ``engine`` when one is given."""

    def __init__(self, engine: PubSubEngine | None = None) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.engine = engine

    def delivered(self, q_mgr: str, queue: str) -> None:
        self.calls.append(("ok", q_mgr, queue))
        if self.engine is not None:
            self.engine.delivered(q_mgr, queue)

    def delivery_failed(self, q_mgr: str, queue: str, reason: int) -> None:
        self.calls.append(("failed", q_mgr, queue, str(reason)))
        if self.engine is not None:
            self.engine.delivery_failed(q_mgr, queue, reason)


def put(queue: str, i: int) -> Put:
    md = MQMD(persistence=Persistence.PERSISTENT, correl_id=i.to_bytes(24, "big"))
    return Put("", queue, md, b"m%d" % i)


async def test_report_once_per_queue_between_failures(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    try:
        for r in qm.run_mqsc(
            "DEFINE QLOCAL(A)\nDEFINE QLOCAL(B) MAXDEPTH(2)\nDEFINE QLOCAL(DLQ)\n"
            "ALTER QMGR DEADQ(DLQ)"
        ):
            assert r.ok, r.lines
        # A ok x3, B ok x2 then full x2, A ok, B full, A ok: B's failures are each told,
        # A is told delivered once (nothing failed on A in between)
        queues = ["A", "A", "B", "A", "B", "B", "A", "B", "B", "A"]
        rec = Recorder()
        async with await qm.connect() as conn:
            done = await put_all(conn, [put(q, i) for i, q in enumerate(queues)], "DLQ", rec)
            await conn.commit()
        full = str(int(Reason.Q_FULL))
        assert rec.calls == [
            ("ok", "QM1", "A"),
            ("ok", "QM1", "B"),
            ("failed", "QM1", "B", full),
            ("failed", "QM1", "B", full),
            ("failed", "QM1", "B", full),
        ]
        assert [p.kind for p in done] == ["dead_letter"] * 3
        assert qm.queue_depth("A") == 5 and qm.queue_depth("B") == 2
        assert qm.queue_depth("DLQ") == 3
    finally:
        await qm.close()


async def test_delivered_after_a_failure_is_told_again(tmp_path: Path) -> None:
    """A queue that fails and then takes a message again ends its run of failures: the
    engine's counter for it is cleared, as with one call per delivery."""
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    try:
        for r in qm.run_mqsc("DEFINE QLOCAL(C) MAXDEPTH(1)\nDEFINE QLOCAL(DLQ)"):
            assert r.ok, r.lines
        engine = PubSubEngine("QM1", MemoryStore())
        rec = Recorder(engine)

        async with await qm.connect() as conn:
            await put_all(conn, [put("C", 0), put("C", 1)], "DLQ", rec)
            await conn.commit()
            assert engine._failures == {("QM1", "C"): 1}
            h = await conn.open("C", OpenOption.INPUT_SHARED)
            await h.get(GetOptions(wait_ms=0, syncpoint=True))
            await conn.commit()
            await h.close()
            await put_all(conn, [put("C", 2), put("C", 3)], "DLQ", rec)
            await conn.commit()
        assert engine._failures == {("QM1", "C"): 1}  # ok (cleared), then full again
        full = str(int(Reason.Q_FULL))
        assert rec.calls == [
            ("ok", "QM1", "C"), ("failed", "QM1", "C", full),
            ("ok", "QM1", "C"), ("failed", "QM1", "C", full),
        ]
    finally:
        await qm.close()



async def test_ok_fail_ok_to_one_queue_in_one_run_is_told_three_times(tmp_path: Path) -> None:
    """Within one put_many run: a delivery, a failure that depends on the message (not on
    the queue's state), then a delivery again to the same queue. The second delivery ends
    the failure run, so it is told, and the engine keeps no failure count for the queue."""
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    try:
        for r in qm.run_mqsc("DEFINE QLOCAL(C) MAXMSGL(10)\nDEFINE QLOCAL(DLQ)"):
            assert r.ok, r.lines
        engine = PubSubEngine("QM1", MemoryStore())
        rec = Recorder(engine)

        def sized(i: int, body: bytes) -> Put:
            md = MQMD(persistence=Persistence.PERSISTENT, correl_id=i.to_bytes(24, "big"))
            return Put("", "C", md, body)

        async with await qm.connect() as conn:
            done = await put_all(conn, [sized(0, b"a"), sized(1, b"b" * 20), sized(2, b"c")],
                                 "DLQ", rec)
            await conn.commit()
        too_big = str(int(Reason.MSG_TOO_BIG_FOR_Q))
        assert rec.calls == [
            ("ok", "QM1", "C"), ("failed", "QM1", "C", too_big), ("ok", "QM1", "C"),
        ]
        assert engine._failures == {}
        assert [p.kind for p in done] == ["dead_letter"]
        assert qm.queue_depth("C") == 2 and qm.queue_depth("DLQ") == 1
    finally:
        await qm.close()
