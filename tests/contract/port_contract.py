"""The queue-manager port's contract, written once and run against every implementation.

A test module subclasses :class:`PortContract` and provides a ``backend`` fixture (an
object with ``qm`` and ``async fresh_queue() -> str`` returning an empty local queue
usable for input, browse, output and inquire). The embedded queue manager runs it in
``test_contract_embedded.py``; a real IBM MQ queue manager in ``test_contract_ibmmq.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any, Protocol

import pytest

from gateway.mq.port import (
    Browse,
    GetOptions,
    MQError,
    OpenOption,
    PutOptions,
    QueueAttr,
    QueueManager,
)
from gateway.wire.constants import MsgType, Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

IO = OpenOption.INPUT_SHARED | OpenOption.OUTPUT | OpenOption.BROWSE | OpenOption.INQUIRE


class Backend(Protocol):
    qm: QueueManager

    async def fresh_queue(self) -> str: ...


#: Persistence of the messages the contract puts; every test runs once each way,
#: because persistent messages take the store's path (writes, fsync, cancellation).
_persistence: list[Persistence] = [Persistence.NOT_PERSISTENT]


def md(**kw: Any) -> MQMD:
    kw.setdefault("format", "MQSTR")
    kw.setdefault("persistence", _persistence[0])
    return MQMD(**kw)


async def drain(q: Any) -> list[bytes]:
    out = []
    while True:
        try:
            out.append((await q.get(GetOptions())).body)
        except MQError as exc:
            assert exc.reason == Reason.NO_MSG_AVAILABLE
            return out


class PortContract:
    """Behaviour every queue-manager implementation must show."""

    @pytest.fixture(
        autouse=True,
        params=[Persistence.NOT_PERSISTENT, Persistence.PERSISTENT],
        ids=["nonpersistent", "persistent"],
    )
    def persistence(self, request: pytest.FixtureRequest) -> Iterator[Persistence]:
        _persistence[0] = request.param
        try:
            yield request.param
        finally:
            _persistence[0] = Persistence.NOT_PERSISTENT

    async def test_persistence_is_kept(self, backend: Backend, persistence: Persistence) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            q = await conn.open(name, IO)
            await q.put(md(), b"plain")
            await q.put(md(), b"in-uow", PutOptions(syncpoint=True))
            await conn.commit()
            assert (await q.inquire(QueueAttr.CURRENT_Q_DEPTH))[QueueAttr.CURRENT_Q_DEPTH] == 2
            first = await q.get(GetOptions(syncpoint=True))
            assert first.body == b"plain" and first.md.persistence == persistence
            await conn.backout()
            got = [await q.get(GetOptions()) for _ in range(2)]
            assert [m.body for m in got] == [b"plain", b"in-uow"]
            assert [m.md.backout_count for m in got] == [1, 0]
            assert all(m.md.persistence == persistence for m in got)
            assert (await q.inquire(QueueAttr.CURRENT_Q_DEPTH))[QueueAttr.CURRENT_Q_DEPTH] == 0

    async def test_put_get_round_trip_fills_descriptor(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            q = await conn.open(name, IO)
            sent = await q.put(md(correl_id=b"C" * 24), b"hello")
            assert len(sent.msg_id) == 24 and sent.msg_id != bytes(24)
            assert len(sent.put_date) == 8 and sent.put_date.isdigit()
            assert len(sent.put_time) == 8 and sent.put_time.isdigit()
            got = await q.get(GetOptions())
            assert got.body == b"hello"
            assert got.md.msg_id == sent.msg_id
            assert got.md.correl_id == b"C" * 24
            assert got.md.format == "MQSTR"
            assert got.md.put_date == sent.put_date
            assert got.md.backout_count == 0
            await q.close()

    async def test_msg_ids_are_unique(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            q = await conn.open(name, IO)
            ids = {(await q.put(md(), b"x")).msg_id for _ in range(50)}
            assert len(ids) == 50
            assert len(await drain(q)) == 50

    async def test_priority_then_fifo(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            q = await conn.open(name, IO)
            for i, prio in enumerate([0, 5, 0, 9, 5, 0]):
                await q.put(md(priority=prio), f"{prio}-{i}".encode())
            bodies = await drain(q)
            assert bodies == [b"9-3", b"5-1", b"5-4", b"0-0", b"0-2", b"0-5"]

    async def test_empty_queue_gives_2033(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            q = await conn.open(name, IO)
            with pytest.raises(MQError) as err:
                await q.get(GetOptions(wait_ms=0))
            assert err.value.reason == Reason.NO_MSG_AVAILABLE
            t0 = time.monotonic()
            with pytest.raises(MQError) as err:
                await q.get(GetOptions(wait_ms=300))
            assert err.value.reason == Reason.NO_MSG_AVAILABLE
            assert time.monotonic() - t0 >= 0.25

    async def test_unknown_queue_gives_2085(self, backend: Backend) -> None:
        async with await backend.qm.connect() as conn:
            with pytest.raises(MQError) as err:
                await conn.open("NO.SUCH.QUEUE.CONTRACT", OpenOption.OUTPUT)
            assert err.value.reason == Reason.UNKNOWN_OBJECT_NAME
            with pytest.raises(MQError) as err:
                await conn.put1("NO.SUCH.QUEUE.CONTRACT", md(), b"x")
            assert err.value.reason == Reason.UNKNOWN_OBJECT_NAME

    async def test_open_options_are_enforced(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            out = await conn.open(name, OpenOption.OUTPUT)
            with pytest.raises(MQError) as err:
                await out.get(GetOptions())
            assert err.value.reason == Reason.NOT_OPEN_FOR_INPUT
            with pytest.raises(MQError) as err:
                await out.inquire(QueueAttr.CURRENT_Q_DEPTH)
            assert err.value.reason == Reason.NOT_OPEN_FOR_INQUIRE
            inp = await conn.open(name, OpenOption.INPUT_SHARED)
            with pytest.raises(MQError) as err:
                await inp.put(md(), b"x")
            assert err.value.reason == Reason.NOT_OPEN_FOR_OUTPUT
            with pytest.raises(MQError) as err:
                await inp.get(GetOptions(browse=Browse.FIRST))
            assert err.value.reason == Reason.NOT_OPEN_FOR_BROWSE

    async def test_syncpoint_put_invisible_until_commit(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as a, await backend.qm.connect() as b:
            qa = await a.open(name, OpenOption.OUTPUT)
            qb = await b.open(name, IO)
            await qa.put(md(), b"one", PutOptions(syncpoint=True))
            with pytest.raises(MQError) as err:
                await qb.get(GetOptions())
            assert err.value.reason == Reason.NO_MSG_AVAILABLE
            await a.commit()
            assert (await qb.get(GetOptions())).body == b"one"

    async def test_syncpoint_put_backout_discards(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            q = await conn.open(name, IO)
            await q.put(md(), b"gone", PutOptions(syncpoint=True))
            await conn.backout()
            assert await drain(q) == []

    async def test_syncpoint_get_backout_returns_with_backout_count(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as a, await backend.qm.connect() as b:
            qa = await a.open(name, IO)
            qb = await b.open(name, IO)
            await qa.put(md(), b"m1")
            await qa.put(md(), b"m2")
            got = await qa.get(GetOptions(syncpoint=True))
            assert got.body == b"m1" and got.md.backout_count == 0
            # the locked message is not visible to another connection
            assert (await qb.get(GetOptions(syncpoint=True))).body == b"m2"
            await b.backout()
            await a.backout()
            again = await qa.get(GetOptions(syncpoint=True))
            assert again.body == b"m1" and again.md.backout_count == 1
            await a.backout()
            third = await qa.get(GetOptions(syncpoint=True))
            assert third.body == b"m1" and third.md.backout_count == 2
            await a.commit()
            last = await qa.get(GetOptions())
            assert last.body == b"m2" and last.md.backout_count == 1
            assert await drain(qa) == []

    async def test_commit_of_get_is_final(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            q = await conn.open(name, IO)
            await q.put(md(), b"x")
            await q.get(GetOptions(syncpoint=True))
            await conn.commit()
            await conn.backout()
            assert await drain(q) == []

    async def test_disconnect_backs_out(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        conn = await backend.qm.connect()
        q = await conn.open(name, IO)
        await q.put(md(), b"kept")
        await q.put(md(), b"dropped", PutOptions(syncpoint=True))
        assert (await q.get(GetOptions(syncpoint=True))).body == b"kept"
        await conn.disconnect()
        async with await backend.qm.connect() as conn2:
            q2 = await conn2.open(name, IO)
            got = await q2.get(GetOptions())
            assert got.body == b"kept" and got.md.backout_count == 1
            assert await drain(q2) == []

    async def test_match_by_msg_id_and_correl_id(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            q = await conn.open(name, IO)
            sent = [await q.put(md(correl_id=bytes([i % 2 + 1]) * 24), f"m{i}".encode())
                    for i in range(6)]
            got = await q.get(GetOptions(match_msg_id=sent[4].msg_id))
            assert got.body == b"m4"
            got = await q.get(GetOptions(match_correl_id=b"\x02" * 24))
            assert got.body == b"m1"
            got = await q.get(GetOptions(match_msg_id=sent[3].msg_id, match_correl_id=b"\x02" * 24))
            assert got.body == b"m3"
            with pytest.raises(MQError) as err:
                await q.get(GetOptions(match_msg_id=sent[3].msg_id))
            assert err.value.reason == Reason.NO_MSG_AVAILABLE
            with pytest.raises(MQError) as err:
                await q.get(GetOptions(match_msg_id=sent[0].msg_id, match_correl_id=b"\x02" * 24))
            assert err.value.reason == Reason.NO_MSG_AVAILABLE
            assert await drain(q) == [b"m0", b"m2", b"m5"]

    async def test_browse_first_next_does_not_remove(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            q = await conn.open(name, IO)
            for i in range(3):
                await q.put(md(), f"b{i}".encode())
            seen = [(await q.get(GetOptions(browse=Browse.FIRST))).body]
            for _ in range(2):
                seen.append((await q.get(GetOptions(browse=Browse.NEXT))).body)
            assert seen == [b"b0", b"b1", b"b2"]
            with pytest.raises(MQError) as err:
                await q.get(GetOptions(browse=Browse.NEXT))
            assert err.value.reason == Reason.NO_MSG_AVAILABLE
            # a new message arriving after the cursor is seen by browse next
            await q.put(md(), b"b3")
            assert (await q.get(GetOptions(browse=Browse.NEXT))).body == b"b3"
            assert (await q.get(GetOptions(browse=Browse.FIRST))).body == b"b0"
            assert await drain(q) == [b"b0", b"b1", b"b2", b"b3"]

    async def test_browse_with_match(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            q = await conn.open(name, IO)
            for i in range(4):
                await q.put(md(correl_id=bytes([i % 2 + 1]) * 24), f"b{i}".encode())
            opts = GetOptions(browse=Browse.FIRST, match_correl_id=b"\x02" * 24)
            assert (await q.get(opts)).body == b"b1"
            opts = GetOptions(browse=Browse.NEXT, match_correl_id=b"\x02" * 24)
            assert (await q.get(opts)).body == b"b3"
            assert len(await drain(q)) == 4

    async def test_expired_messages_are_not_returned(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            q = await conn.open(name, IO)
            await q.put(md(expiry=2), b"short")  # 0.2 s
            await q.put(md(expiry=600), b"long")  # 60 s
            await asyncio.sleep(0.5)
            got = await q.get(GetOptions())
            assert got.body == b"long"
            assert 0 < got.md.expiry <= 600
            assert await drain(q) == []

    async def test_get_wait_wakes_on_arrival(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as a, await backend.qm.connect() as b:
            qa = await a.open(name, IO)
            qb = await b.open(name, OpenOption.OUTPUT)
            waiter = asyncio.ensure_future(qa.get(GetOptions(wait_ms=10_000)))
            await asyncio.sleep(0.2)
            assert not waiter.done()
            t0 = time.monotonic()
            await qb.put(md(), b"wake")
            got = await asyncio.wait_for(waiter, 5)
            assert got.body == b"wake"
            assert time.monotonic() - t0 < 2.0

    async def test_get_wait_wakes_on_commit_not_before(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as a, await backend.qm.connect() as b:
            qa = await a.open(name, IO)
            qb = await b.open(name, OpenOption.OUTPUT)
            waiter = asyncio.ensure_future(qa.get(GetOptions(wait_ms=10_000)))
            await qb.put(md(), b"uow", PutOptions(syncpoint=True))
            await asyncio.sleep(0.3)
            assert not waiter.done()
            await b.commit()
            assert (await asyncio.wait_for(waiter, 5)).body == b"uow"

    async def test_inquire_depth_and_attributes(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            q = await conn.open(name, IO)
            for _ in range(3):
                await q.put(md(), b"d")
            attrs = await q.inquire(QueueAttr.CURRENT_Q_DEPTH, QueueAttr.MAX_Q_DEPTH,
                                    QueueAttr.Q_TYPE, QueueAttr.BACKOUT_THRESHOLD,
                                    QueueAttr.BACKOUT_REQ_Q_NAME)
            assert attrs[QueueAttr.CURRENT_Q_DEPTH] == 3
            assert attrs[QueueAttr.Q_TYPE] == 1
            assert isinstance(attrs[QueueAttr.MAX_Q_DEPTH], int)
            assert isinstance(attrs[QueueAttr.BACKOUT_REQ_Q_NAME], str)
            await drain(q)
            assert (await q.inquire(QueueAttr.CURRENT_Q_DEPTH))[QueueAttr.CURRENT_Q_DEPTH] == 0

    async def test_put1_and_context(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            sent = await conn.put1(name, md(msg_type=MsgType.DATAGRAM), b"p1")
            q = await conn.open(name, IO)
            got = await q.get(GetOptions())
            assert got.body == b"p1" and got.md.msg_id == sent.msg_id
            assert got.md.put_appl_type != 0
            assert got.md.user_identifier != ""

    async def test_set_all_context_keeps_callers_fields(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            q = await conn.open(name, IO | OpenOption.SET_ALL_CONTEXT)
            m = md(put_appl_type=26, put_appl_name="broker", put_date="20240102",
                   put_time="03040506", user_identifier="someone")
            await q.put(m, b"ctx", PutOptions(set_all_context=True))
            got = await q.get(GetOptions())
            assert (got.md.put_appl_type, got.md.put_appl_name) == (26, "broker")
            assert (got.md.put_date, got.md.put_time) == ("20240102", "03040506")
            assert got.md.user_identifier == "someone"

    async def test_truncation(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        async with await backend.qm.connect() as conn:
            q = await conn.open(name, IO)
            await q.put(md(), b"0123456789")
            with pytest.raises(MQError) as err:
                await q.get(GetOptions(max_length=4))
            assert err.value.reason == Reason.TRUNCATED_MSG_FAILED
            got = await q.get(GetOptions(max_length=4, accept_truncated=True))
            assert got.body == b"0123"
            assert await drain(q) == []

    async def test_many_concurrent_waiters_each_get_one(self, backend: Backend) -> None:
        name = await backend.fresh_queue()
        n = 20
        conns = [await backend.qm.connect() for _ in range(n)]
        try:
            handles = [await c.open(name, OpenOption.INPUT_SHARED) for c in conns]
            waiters = [asyncio.ensure_future(h.get(GetOptions(wait_ms=10_000))) for h in handles]
            await asyncio.sleep(0.2)
            async with await backend.qm.connect() as p:
                out = await p.open(name, OpenOption.OUTPUT)
                for i in range(n):
                    await out.put(md(), f"w{i}".encode())
            got = await asyncio.wait_for(asyncio.gather(*waiters), 10)
            assert sorted(m.body for m in got) == sorted(f"w{i}".encode() for i in range(n))
        finally:
            for c in conns:
                await c.disconnect()
