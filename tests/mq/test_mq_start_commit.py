"""A commit begun without waiting (``gateway.mq.port.start_commit``; the embedded queue
manager's ``start_commit``), and the store's transaction in few statements.

What must hold: the unit of work leaves the connection at once, so the next unit is
independent of it (its gets and its backout); the begun commit ends durable, or fails
as MQCMIT does (MQRC_BACKED_OUT, its messages back on the queue); a unit of many
messages (more than one statement's worth of rows) is written and read back whole."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.store import DB_FILE, SHARED_BODY_MIN
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions, start_commit
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

SYNC_GET = GetOptions(wait_ms=0, syncpoint=True)


async def _load(qm: EmbeddedQueueManager, queue: str, count: int) -> None:
    qm.run_mqsc(f"DEFINE QLOCAL({queue}) DEFPSIST(YES) MAXDEPTH(100000)", stop_on_error=True)
    async with await qm.connect() as conn:
        handle = await conn.open(queue, OpenOption.OUTPUT)
        for i in range(count):
            await handle.put(
                MQMD(persistence=Persistence.PERSISTENT), b"%d" % i, PutOptions(syncpoint=True)
            )
        await conn.commit()


async def test_a_begun_commit_frees_the_connection_for_the_next_unit(
    qm: EmbeddedQueueManager, tmp_path: Path
) -> None:
    await _load(qm, "Q", 4)
    conn = await qm.connect()
    handle = await conn.open("Q", OpenOption.INPUT_SHARED)
    first = [(await handle.get(SYNC_GET)).body for _ in range(2)]
    done = start_commit(conn)
    assert done is not None
    # the next unit begins at once, on the same connection, with the next messages
    second = [(await handle.get(SYNC_GET)).body for _ in range(2)]
    await conn.backout()  # backs out only the second unit
    await done
    assert first == [b"0", b"1"] and second == [b"2", b"3"]
    assert qm.queue_depth("Q") == 2
    await conn.disconnect()
    await qm.close()
    again = EmbeddedQueueManager("QM1", tmp_path / "qm1")
    try:
        async with await again.connect() as conn2:
            h = await conn2.open("Q", OpenOption.INPUT_SHARED)
            left = [(await h.get(SYNC_GET)).body for _ in range(2)]
        assert left == [b"2", b"3"]  # the committed gets are gone for good
    finally:
        await again.close()


async def test_a_begun_commit_that_fails_is_backed_out(qm: EmbeddedQueueManager) -> None:
    await _load(qm, "Q", 3)
    store = qm._store
    real = store.apply

    def failing(*args: object) -> None:
        raise OSError("disk gone")

    conn = await qm.connect()
    handle = await conn.open("Q", OpenOption.INPUT_SHARED)
    got = [(await handle.get(SYNC_GET)).body for _ in range(2)]
    store.apply = failing  # type: ignore[method-assign]
    try:
        done = start_commit(conn)
        assert done is not None
        with pytest.raises(MQError) as caught:
            await done
    finally:
        store.apply = real  # type: ignore[method-assign]
    assert caught.value.reason == Reason.BACKED_OUT
    assert got == [b"0", b"1"] and qm.queue_depth("Q") == 3
    again = [(await handle.get(SYNC_GET)).body for _ in range(3)]
    assert again == [b"0", b"1", b"2"]  # back in their order
    await conn.commit()
    await conn.disconnect()


async def test_start_commit_is_none_where_the_adapter_has_no_such_verb() -> None:
    class Plain:
        async def commit(self) -> None:  # pragma: no cover - never called
            raise AssertionError

    assert start_commit(Plain()) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [1, 89, 90, 91, 1_000, 2_500])
async def test_units_of_many_messages_are_written_and_read_back_whole(
    tmp_path: Path, count: int
) -> None:
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    try:
        await _load(qm, "Q", count)  # one unit of ``count`` inserts
        async with await qm.connect() as conn:
            handle = await conn.open("Q", OpenOption.INPUT_SHARED)
            for _ in range(count // 2):
                await handle.get(SYNC_GET)
            await conn.commit()  # one unit of ``count // 2`` deletes
    finally:
        await qm.close()
    reopened = EmbeddedQueueManager("QM1", tmp_path / "qm")
    try:
        assert reopened.queue_depth("Q") == count - count // 2
        async with await reopened.connect() as conn:
            handle = await conn.open("Q", OpenOption.INPUT_SHARED)
            bodies = [(await handle.get(SYNC_GET)).body for _ in range(count - count // 2)]
        assert bodies == [b"%d" % i for i in range(count // 2, count)]
    finally:
        await reopened.close()


async def test_a_shared_body_over_many_statements_is_stored_once_and_dropped_with_its_last(
    tmp_path: Path,
) -> None:
    """One body object in 200 messages of one unit (more rows than one INSERT takes):
    one ``bodies`` row referred to 200 times; gone with the delete of the last."""
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    body = b"b" * (SHARED_BODY_MIN + 44)
    db = tmp_path / "qm" / DB_FILE
    try:
        qm.run_mqsc("DEFINE QLOCAL(Q) DEFPSIST(YES)", stop_on_error=True)
        async with await qm.connect() as conn:
            handle = await conn.open("Q", OpenOption.OUTPUT)
            for _ in range(200):
                await handle.put(
                    MQMD(persistence=Persistence.PERSISTENT), body, PutOptions(syncpoint=True)
                )
            await conn.commit()
        with sqlite3.connect(db) as check:
            assert check.execute("SELECT COUNT(*), SUM(refs) FROM bodies").fetchone() == (1, 200)
            shared = "SELECT COUNT(*) FROM messages WHERE body_id IS NOT NULL"
            assert check.execute(shared).fetchone() == (200,)
        async with await qm.connect() as conn:
            handle = await conn.open("Q", OpenOption.INPUT_SHARED)
            got = [(await handle.get(SYNC_GET)).body for _ in range(200)]
            await conn.commit()
        assert got == [body] * 200
        with sqlite3.connect(db) as check:
            assert check.execute("SELECT COUNT(*) FROM bodies").fetchone() == (0,)
            assert check.execute("SELECT COUNT(*) FROM messages").fetchone() == (0,)
    finally:
        await qm.close()
