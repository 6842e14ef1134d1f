"""The embedded queue manager's in-process ``get_batch`` and ``clone_md`` (issue 16,
service CPU pass): a batch is exactly what as many single gets would have returned, in
the same unit of work, and the descriptors handed out are never the queued ones."""

from __future__ import annotations

import dataclasses
import random

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.embedded.queues import clone_md
from gateway.mq.port import Browse, GetOptions, Message, MQError, OpenOption, PutOptions
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

SYNC = GetOptions(wait_ms=0, syncpoint=True)


def _md(i: int) -> MQMD:
    return MQMD(
        persistence=Persistence.PERSISTENT if i % 2 else Persistence.NOT_PERSISTENT,
        priority=i % 3,
        expiry=-1 if i % 4 else 36000,
        correl_id=bytes([i % 256]) * 24,
        format="MQSTR",
    )


async def _load(qm: EmbeddedQueueManager, queue: str, n: int) -> None:
    conn = await qm.connect()
    for i in range(n):
        await conn.put1(queue, _md(i), f"m{i}".encode() * (i % 7 + 1), PutOptions(syncpoint=True))
    await conn.commit()
    await conn.disconnect()


def _same(a: Message, b: Message) -> bool:
    # MsgId and the put stamps are each put's own; expiry counts down: compared apart
    apart = {"msg_id": b"", "expiry": 0, "put_date": "", "put_time": ""}
    return (
        dataclasses.replace(a.md, **apart) == dataclasses.replace(b.md, **apart)
        and a.body == b.body
        and (a.md.expiry > 0) == (b.md.expiry > 0)
    )


async def test_a_batch_is_what_single_gets_return_in_order(qm: EmbeddedQueueManager) -> None:
    qm.run_mqsc("DEFINE QLOCAL(A)\nDEFINE QLOCAL(B)", stop_on_error=True)
    await _load(qm, "A", 40)
    await _load(qm, "B", 40)
    conn = await qm.connect()
    a = await conn.open("A", OpenOption.INPUT_SHARED)
    b = await conn.open("B", OpenOption.INPUT_SHARED)
    batched = await a.get_batch(SYNC, 25)
    batched += await a.get_batch(SYNC, 25)
    singles = [await b.get(SYNC) for _ in range(40)]
    assert len(batched) == 40
    assert all(_same(x, y) for x, y in zip(batched, singles, strict=True))
    with pytest.raises(MQError) as empty:
        await a.get_batch(SYNC, 5)
    assert empty.value.reason == Reason.NO_MSG_AVAILABLE
    assert qm.queue_depth("A") == 40  # locked in the unit of work, not gone
    await conn.backout()
    again = await a.get_batch(SYNC, 100)
    assert [m.body for m in again] == [m.body for m in singles]
    assert {m.md.backout_count for m in again} == {1}
    await conn.commit()
    assert qm.queue_depth("A") == 0
    await conn.disconnect()


async def test_a_batch_stops_at_a_message_too_long_and_leaves_it(
    qm: EmbeddedQueueManager,
) -> None:
    qm.run_mqsc("DEFINE QLOCAL(A)", stop_on_error=True)
    conn = await qm.connect()
    for body in (b"a" * 5, b"b" * 5, b"c" * 50, b"d" * 5):
        await conn.put1("A", MQMD(), body)
    h = await conn.open("A", OpenOption.INPUT_SHARED)
    got = await h.get_batch(dataclasses.replace(SYNC, max_length=10), 10)
    assert [m.body for m in got] == [b"a" * 5, b"b" * 5]
    cut = await h.get_batch(dataclasses.replace(SYNC, max_length=10, accept_truncated=True), 10)
    assert [m.body for m in cut] == [b"c" * 10, b"d" * 5]
    await conn.commit()
    assert qm.queue_depth("A") == 0
    await conn.disconnect()


async def test_outside_syncpoint_and_refusals(qm: EmbeddedQueueManager) -> None:
    qm.run_mqsc("DEFINE QLOCAL(A)", stop_on_error=True)
    await _load(qm, "A", 6)
    conn = await qm.connect()
    h = await conn.open("A", OpenOption.INPUT_SHARED | OpenOption.BROWSE)
    with pytest.raises(MQError) as browse:
        await h.get_batch(GetOptions(browse=Browse.FIRST), 3)
    assert browse.value.reason == Reason.GMO_ERROR
    got = await h.get_batch(GetOptions(wait_ms=0), 4)
    assert len(got) == 4
    await conn.backout()  # nothing to back out: they were got outside syncpoint
    assert qm.queue_depth("A") == 2
    assert len(await h.get_batch(GetOptions(wait_ms=10), 1)) == 1
    await conn.disconnect()


async def test_the_descriptor_got_is_a_copy(qm: EmbeddedQueueManager) -> None:
    qm.run_mqsc("DEFINE QLOCAL(A)", stop_on_error=True)
    await _load(qm, "A", 3)
    conn = await qm.connect()
    h = await conn.open("A", OpenOption.INPUT_SHARED)
    first = (await h.get_batch(SYNC, 3))[0]
    correl_id = first.md.correl_id
    first.md.format = "CHANGED"
    first.md.correl_id = b"x" * 24
    await conn.backout()
    again = (await h.get_batch(SYNC, 1))[0]
    assert again.md.format == "MQSTR"
    assert again.md.correl_id == correl_id
    await conn.commit()
    await conn.disconnect()


def test_clone_md_copies_every_slot() -> None:
    rng = random.Random(7)
    for _ in range(200):
        md = MQMD(
            version=rng.choice((1, 2)),
            msg_id=rng.randbytes(24),
            correl_id=rng.randbytes(24),
            priority=rng.randint(0, 9),
            put_date=str(rng.randint(10**7, 10**8 - 1)),
            msg_seq_number=rng.randint(1, 99),
            struc_ccsid=rng.choice((0, 1208, 819)),
        )
        copy = clone_md(md)
        assert copy is not md
        for name in MQMD.__slots__:
            assert getattr(copy, name) == getattr(md, name), name
        copy.priority = 42
        assert md.priority != 42
