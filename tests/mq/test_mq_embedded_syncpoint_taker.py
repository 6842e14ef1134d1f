"""The embedded queue handle's ``syncpoint_taker`` (issue 16, batched service gets): each
call gets exactly what a get under syncpoint with no wait would have got, in the same
unit of work (a backout puts them all back, BackoutCount + 1), 2033 when the queue is
empty; no taker for other gets or when the checks fail."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, Message, MQError, OpenOption, PutOptions
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

SYNC = GetOptions(wait_ms=0, syncpoint=True)


async def _load(qm: EmbeddedQueueManager, queue: str, n: int) -> None:
    async with await qm.connect() as conn:
        for i in range(n):
            md = MQMD(persistence=Persistence.PERSISTENT if i % 2 else Persistence.NOT_PERSISTENT,
                      priority=i % 3, correl_id=bytes([i]) * 24, format="MQSTR")
            await conn.put1(queue, md, b"m%d" % i, PutOptions())


def _key(m: Message) -> tuple[object, ...]:
    md = dataclasses.asdict(m.md)
    for differs in ("msg_id", "put_date", "put_time"):  # two queue managers, two times
        del md[differs]
    return (m.body, tuple(sorted(md.items())))


async def _all(qm: EmbeddedQueueManager, use_taker: bool) -> list[tuple[object, ...]]:
    """Get everything under syncpoint twice (backed out once in between)."""
    out = []
    async with await qm.connect() as conn:
        h = await conn.open("Q", OpenOption.INPUT_SHARED)
        for rnd in range(2):
            got = [await h.get(SYNC)]
            take = h.syncpoint_taker(SYNC) if use_taker else None
            assert (take is not None) == use_taker
            while True:
                try:
                    got.append(take() if take is not None else await h.get(SYNC))
                except MQError as exc:
                    assert exc.reason == Reason.NO_MSG_AVAILABLE
                    break
            out.extend(_key(m) for m in got)
            if rnd == 0:
                await conn.backout()
            else:
                await conn.commit()
        await h.close()
    return out


async def test_taker_gets_what_single_gets_get(tmp_path: Path) -> None:
    results = []
    for use_taker in (False, True):
        qm = EmbeddedQueueManager("QM1", tmp_path / f"qm{use_taker}")
        try:
            qm.run_mqsc("DEFINE QLOCAL(Q)", stop_on_error=True)
            await _load(qm, "Q", 12)
            results.append(await _all(qm, use_taker))
            assert qm.queue_depth("Q") == 0
        finally:
            await qm.close()
    single, taken = results
    assert len(taken) == 24 and taken == single  # same order, bodies, descriptors
    # after the backout each message came back with BackoutCount 1
    assert {dict(k[1])["backout_count"] for k in taken[12:]} == {1}


async def test_no_taker_for_other_gets_or_failed_checks(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    try:
        qm.run_mqsc("DEFINE QLOCAL(Q)\nDEFINE QLOCAL(OUT)", stop_on_error=True)
        await _load(qm, "Q", 2)
        async with await qm.connect() as conn:
            h = await conn.open("Q", OpenOption.INPUT_SHARED | OpenOption.BROWSE)
            assert h.syncpoint_taker(GetOptions(wait_ms=0)) is None  # not under syncpoint
            assert h.syncpoint_taker(GetOptions(wait_ms=10, syncpoint=True)) is None
            assert h.syncpoint_taker(SYNC) is not None
            qm.run_mqsc("ALTER QLOCAL(Q) GET(DISABLED)", stop_on_error=True)
            assert h.syncpoint_taker(SYNC) is None  # the get itself says GET_INHIBITED
            qm.run_mqsc("ALTER QLOCAL(Q) GET(ENABLED)", stop_on_error=True)
            out = await conn.open("OUT", OpenOption.OUTPUT)
            assert out.syncpoint_taker(SYNC) is None  # not open for input
            await h.close()
            assert h.syncpoint_taker(SYNC) is None  # closed handle
    finally:
        await qm.close()


async def test_a_taker_kept_across_a_change_raises_and_takes_nothing(tmp_path: Path) -> None:
    """Review 18d F1: a taker kept past an await must not take messages into a unit of
    work nothing will end: GET(DISABLED), a closed handle and a closed connection each
    make the next call raise what get would, with the messages left on the queue."""
    qm = EmbeddedQueueManager("QM1", tmp_path / "qm")
    try:
        for r in qm.run_mqsc("DEFINE QLOCAL(Q)"):
            assert r.ok, r.lines
        await _load(qm, "Q", 6)
        conn = await qm.connect()
        h = await conn.open("Q", OpenOption.INPUT_SHARED)
        take = h.syncpoint_taker(SYNC)
        assert take is not None
        take()  # one taken under syncpoint
        for r in qm.run_mqsc("ALTER QLOCAL(Q) GET(DISABLED)"):
            assert r.ok, r.lines
        with pytest.raises(MQError) as info:
            take()
        assert info.value.reason == Reason.GET_INHIBITED
        for r in qm.run_mqsc("ALTER QLOCAL(Q) GET(ENABLED)"):
            assert r.ok, r.lines
        await h.close()
        with pytest.raises(MQError) as info:
            take()
        assert info.value.reason == Reason.HOBJ_ERROR
        h2 = await conn.open("Q", OpenOption.INPUT_SHARED)
        take2 = h2.syncpoint_taker(SYNC)
        assert take2 is not None
        await conn.disconnect()  # backs the one taken message out
        with pytest.raises(MQError) as info:
            take2()
        assert info.value.reason != Reason.NO_MSG_AVAILABLE
        assert qm.queue_depth("Q") == 6
    finally:
        await qm.close()
