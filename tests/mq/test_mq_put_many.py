"""``put_many`` (issue 16, fan-out): the embedded queue manager's one-pass put of many
messages, against the same puts made one by one.

What must hold: the unit of work is the caller's (a backout leaves nothing, a commit
makes all durable), a put that fails (queue full, put inhibited, unknown queue) fails
alone with the reason a single put gives and leaves its descriptor untouched, the stored
descriptor bytes are exactly those a single put stores (MsgId/CorrelId patched into a
shared packing), and the queues end up holding what a sequence of puts leaves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.queues import MDPacker, pack_md_for_store
from gateway.mq.port import (
    GetOptions,
    Message,
    MQError,
    OpenOption,
    PutItem,
    PutOptions,
    put_each,
    put_many,
)
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

PERS = Persistence.PERSISTENT
NPERS = Persistence.NOT_PERSISTENT
SYNC = PutOptions(syncpoint=True, set_all_context=True)


def mqsc_ok(qm: EmbeddedQueueManager, script: str) -> None:
    for r in qm.run_mqsc(script):
        assert r.ok, (r.line, r.text, r.lines)


def delivery_md(i: int, **kw: object) -> MQMD:
    """One publication's delivery to subscriber ``i``: all alike but the CorrelId."""
    fields: dict[str, object] = dict(
        format="MQHRF2  ", persistence=PERS, priority=4, correl_id=b"SUB" + i.to_bytes(21, "big"),
        user_identifier="app", put_appl_type=26, put_appl_name="QM1", put_date="20261126",
        put_time="13000000", reply_to_q_mgr="QM1", version=1,
    )
    fields.update(kw)
    return MQMD(**fields)  # type: ignore[arg-type]


async def drain(qm: EmbeddedQueueManager, queue: str) -> list[Message]:
    out: list[Message] = []
    async with await qm.connect() as conn:
        h = await conn.open(queue, OpenOption.INPUT_SHARED)
        while True:
            try:
                out.append(await h.get(GetOptions(wait_ms=0)))
            except MQError as exc:
                assert exc.reason == Reason.NO_MSG_AVAILABLE
                return out


def test_packer_matches_a_full_packing() -> None:
    packer = MDPacker()
    mds = [delivery_md(i) for i in range(5)] + [
        delivery_md(9, priority=7),
        delivery_md(10, msg_id=b"M" * 24),
        delivery_md(11, correl_id=b"short"),  # not 24 bytes: packed in full
        delivery_md(12, version=2),
        delivery_md(13),
    ]
    for md in mds:
        md.msg_id = md.msg_id if md.msg_id != bytes(24) else b"A" * 23 + bytes([len(md.format)])
        assert packer.pack(md) == pack_md_for_store(md)


async def test_put_many_stores_exact_bytes_and_patched_correl_ids(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    try:
        mqsc_ok(qm, "DEFINE QLOCAL(SUB.0)\nDEFINE QLOCAL(SUB.1)")
        items: list[PutItem] = [(f"SUB.{i % 2}", "", delivery_md(i), b"body%d" % i)
                                for i in range(50)]
        async with await qm.connect() as conn:
            results = await put_many(conn, items, SYNC)
            await conn.commit()
        assert all(isinstance(r, MQMD) for r in results)
        rows = qm._store.load_messages()
        assert len(rows) == 50
        msg_ids = set()
        for i, row in enumerate(rows):
            assert row.queue == f"SUB.{i % 2}" and row.body == b"body%d" % i
            assert row.correl_id == b"SUB" + i.to_bytes(21, "big")
            stored = MQMD.unpack(row.md, 0, 546)
            assert stored.correl_id == row.correl_id and stored.msg_id == row.msg_id
            # byte for byte what a single put stores for the completed descriptor
            assert row.md == pack_md_for_store(results[i])  # type: ignore[arg-type]
            msg_ids.add(row.msg_id)
        assert len(msg_ids) == 50 and bytes(24) not in msg_ids
        # and what a single put stores for the same descriptor
        async with await qm.connect() as conn:
            one = await conn.put1("SUB.0", delivery_md(0), b"x", SYNC)
            await conn.commit()
        row = qm._store.load_messages()[-1]
        patched = dataclasses.replace(results[0], msg_id=one.msg_id)  # type: ignore[arg-type]
        assert row.md == pack_md_for_store(patched)
    finally:
        await qm.close()


async def test_put_many_is_one_unit_of_work_with_the_rest(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    try:
        mqsc_ok(qm, "DEFINE QLOCAL(SUB.0)\nDEFINE QLOCAL(SUB.1)")
        items: list[PutItem] = [(f"SUB.{i % 2}", "", delivery_md(i), b"b") for i in range(20)]
        async with await qm.connect() as conn:
            await put_many(conn, items, SYNC)
            assert qm.queue_depth("SUB.0") == 10  # counted, not yet gettable
            assert await drain(qm, "SUB.0") == []
            await conn.backout()
        assert qm.queue_depth("SUB.0") == qm.queue_depth("SUB.1") == 0
        assert qm._store.load_messages() == []
    finally:
        await qm.close()
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    try:
        assert qm.queue_depth("SUB.0") == qm.queue_depth("SUB.1") == 0
    finally:
        await qm.close()


async def test_put_many_reports_each_failure_and_leaves_its_descriptor(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    try:
        mqsc_ok(qm, "DEFINE QLOCAL(OK.Q)\nDEFINE QLOCAL(FULL.Q) MAXDEPTH(2)\n"
                    "DEFINE QLOCAL(SHUT.Q) PUT(DISABLED)\nDEFINE QLOCAL(SMALL.Q) MAXMSGL(4)")
        names = ["OK.Q", "FULL.Q", "SHUT.Q", "NO.SUCH.Q", "FULL.Q", "FULL.Q", "SMALL.Q", "OK.Q"]
        items: list[PutItem] = [(n, "", delivery_md(i), b"12345") for i, n in enumerate(names)]
        before = [dataclasses.replace(md) for _, _, md, _ in items]
        async with await qm.connect() as conn:
            results = await put_many(conn, items, SYNC)
            reasons = [r.reason if isinstance(r, MQError) else 0 for r in results]
            assert reasons == [0, 0, Reason.PUT_INHIBITED, Reason.UNKNOWN_OBJECT_NAME, 0,
                               Reason.Q_FULL, Reason.MSG_TOO_BIG_FOR_Q, 0]
            for (_, _, md, _), was, reason in zip(items, before, reasons, strict=True):
                if reason:
                    assert md == was  # a failed put hands its descriptor back untouched
            # the same reasons as single puts give
            for name, reason in (("SHUT.Q", Reason.PUT_INHIBITED),
                                 ("NO.SUCH.Q", Reason.UNKNOWN_OBJECT_NAME),
                                 ("FULL.Q", Reason.Q_FULL), ("SMALL.Q", Reason.MSG_TOO_BIG_FOR_Q)):
                try:
                    await conn.put1(name, delivery_md(99), b"12345", SYNC)
                except MQError as exc:
                    assert exc.reason == reason
                else:
                    raise AssertionError(f"put to {name} did not fail")
            await conn.commit()
        assert [m.md.correl_id for m in await drain(qm, "OK.Q")] == [
            delivery_md(0).correl_id, delivery_md(7).correl_id]
        assert len(await drain(qm, "FULL.Q")) == 2
    finally:
        await qm.close()


async def test_put_many_is_durable_after_reopen(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    try:
        mqsc_ok(qm, "DEFINE QLOCAL(SUB.0)\nDEFINE QLOCAL(SUB.1)")
        items: list[PutItem] = [
            (f"SUB.{i % 2}", "", delivery_md(i, persistence=PERS if i % 3 else NPERS), b"%d" % i)
            for i in range(30)
        ]
        async with await qm.connect() as conn:
            results = await put_many(conn, items, SYNC)
            await conn.commit()
        kept = {i: r for i, r in enumerate(results) if i % 3}
    finally:
        await qm.close()
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    try:
        got = await drain(qm, "SUB.0") + await drain(qm, "SUB.1")
        assert sorted(int(m.body) for m in got) == sorted(kept)
        for m in got:
            want = kept[int(m.body)]
            assert isinstance(want, MQMD)
            assert m.md.msg_id == want.msg_id and m.md.correl_id == want.correl_id
            assert m.md.persistence == PERS and m.md.put_appl_name == "QM1"
    finally:
        await qm.close()


async def test_put_many_same_descriptor_twice_and_outside_syncpoint(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    try:
        mqsc_ok(qm, "DEFINE QLOCAL(SUB.0)\nDEFINE QLOCAL(SUB.1)")
        shared = delivery_md(1)
        async with await qm.connect() as conn:
            twice: list[PutItem] = [("SUB.0", "", shared, b"a"), ("SUB.1", "", shared, b"b")]
            results = await put_many(conn, twice, SYNC)
            await conn.commit()
            assert results[0] is not results[1]
            free = await put_many(conn, [("SUB.0", "", delivery_md(2), b"c")],
                                  PutOptions(set_all_context=True))
            assert isinstance(free[0], MQMD)
        a, c = await drain(qm, "SUB.0")
        (b,) = await drain(qm, "SUB.1")
        assert (a.body, b.body, c.body) == (b"a", b"b", b"c")
        assert a.md.msg_id != b.md.msg_id and a.md.correl_id == b.md.correl_id
    finally:
        await qm.close()


# ------------------------------------------------------------------ property

_item = st.tuples(
    st.integers(0, 3),  # queue: 0-1 plain, 2 MAXDEPTH(3), 3 put inhibited
    st.sampled_from([PERS, NPERS, Persistence.PERSISTENCE_AS_Q_DEF, 7]),
    st.integers(-2, 9),  # priority (-1 as queue default, -2 invalid)
    st.binary(min_size=24, max_size=24) | st.just(bytes(24)),  # CorrelId
    st.binary(max_size=8),  # body
)


def _run_both(items: list[tuple[int, int, int, bytes, bytes]]) -> None:
    async def scenario(directory: Path) -> None:
        qm = EmbeddedQueueManager("QM1", directory)
        try:
            script = []
            for side in "AB":
                script += [f"DEFINE QLOCAL({side}.0) DEFPSIST(YES) DEFPRTY(3)",
                           f"DEFINE QLOCAL({side}.1)", f"DEFINE QLOCAL({side}.2) MAXDEPTH(3)",
                           f"DEFINE QLOCAL({side}.3) PUT(DISABLED)"]
            mqsc_ok(qm, "\n".join(script))

            def batch(side: str) -> list[PutItem]:
                return [(f"{side}.{q}", "", delivery_md(0, persistence=p, priority=pr,
                                                        correl_id=c), body)
                        for q, p, pr, c, body in items]

            async with await qm.connect() as conn:
                many = await put_many(conn, batch("A"), SYNC)
                each = await put_each(conn, batch("B"), SYNC)
                await conn.commit()
            assert [r.reason if isinstance(r, MQError) else 0 for r in many] == [
                r.reason if isinstance(r, MQError) else 0 for r in each]
            for q in range(3):
                a, b = await drain(qm, f"A.{q}"), await drain(qm, f"B.{q}")
                assert [(m.body, dataclasses.replace(m.md, msg_id=b"")) for m in a] == [
                    (m.body, dataclasses.replace(m.md, msg_id=b"")) for m in b]
        finally:
            await qm.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp) / "qm"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_item, max_size=12))
def test_put_many_leaves_what_a_sequence_of_puts_leaves(
    items: list[tuple[int, int, int, bytes, bytes]],
) -> None:
    _run_both(items)
