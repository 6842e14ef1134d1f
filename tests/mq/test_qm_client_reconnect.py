"""A local-socket client with a connection list that reconnects (MQCNO_RECONNECT_Q_MGR).

Proves, over real sockets of queue managers served in this process: the client takes the
first listed address that accepts; when its queue manager goes away it reconnects
through the list and its open queues work again; a unit of work open at the break is
backed out where it was (its syncpoint get back on the queue: nothing lost) and the
application is told (MQRC_BACKED_OUT on the unit's next call and on its MQCMIT, not a
silent partial commit); the reconnection gives up after its timeout (2548); a socket
serving another queue manager is not reconnected to; malformed lists are refused.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gateway.mq.conname import ConnameError, parse_conname_list
from gateway.mq.embedded.client_reconnect import (
    ReconnectPolicy,
    connect_reconnecting,
    parse_socket_list,
)
from gateway.mq.embedded.qm_server import QueueManagerServer
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import (
    Connection,
    GetOptions,
    MQError,
    OpenOption,
    PutOptions,
    QueueAttr,
    QueueHandle,
)
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason

FAST = ReconnectPolicy(initial_s=0.02, max_s=0.1, timeout_s=30.0)


class Served:
    """One queue manager and its socket server, stoppable and startable again."""

    def __init__(self, name: str, path: Path) -> None:
        self.qm = EmbeddedQueueManager(name, path)
        self.qm.run_mqsc("DEFINE QLOCAL(APP.Q)\n")
        self.server: QueueManagerServer | None = None

    async def start(self) -> None:
        self.server = QueueManagerServer(self.qm)
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()
            self.server = None

    async def depth(self, q_name: str = "APP.Q") -> int:
        conn = await self.qm.connect()
        try:
            q = await conn.open(q_name, OpenOption.INQUIRE)
            return int((await q.inquire(QueueAttr.CURRENT_Q_DEPTH))[QueueAttr.CURRENT_Q_DEPTH])
        finally:
            await conn.disconnect()


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Served, Served]]:
    a, b = Served("QMR", tmp_path / "a"), Served("QMR", tmp_path / "b")
    try:
        yield a, b
    finally:
        for s in (a, b):
            await s.stop()
            await s.qm.close()


def _md() -> MQMD:
    return MQMD(format="MQSTR", coded_char_set_id=1208)


async def test_the_first_address_that_accepts_is_taken(pair: tuple[Served, Served],
                                                       tmp_path: Path) -> None:
    a, b = pair
    await b.start()  # a does not listen (a standby)
    conn = await connect_reconnecting([a.qm.path, b.qm.path], policy=FAST)
    try:
        assert conn.address == b.qm.path and conn.q_mgr_name == "QMR"
        assert isinstance(conn, Connection)  # code written against the port runs on it
        assert isinstance(await conn.open("APP.Q", OpenOption.OUTPUT), QueueHandle)
        await conn.put1("APP.Q", _md(), b"to b")
        assert await b.depth() == 1 and await a.depth() == 0
    finally:
        await conn.disconnect()
    with pytest.raises(MQError) as info:  # nothing listens: MQ's 2059 at MQCONN
        await connect_reconnecting([a.qm.path, tmp_path / "nowhere"], policy=FAST)
    assert info.value.reason == Reason.Q_MGR_NOT_AVAILABLE


async def test_reconnects_through_the_list_and_reopens_queues(
        pair: tuple[Served, Served]) -> None:
    a, b = pair
    await a.start()
    conn = await connect_reconnecting([a.qm.path, b.qm.path], policy=FAST)
    try:
        q = await conn.open("APP.Q", OpenOption.OUTPUT)
        await q.put(_md(), b"one")
        await a.stop()  # the active instance goes
        await b.start()  # the standby takes over
        await q.put(_md(), b"two")  # no unit of work open: reconnected, reopened, done
        assert conn.address == b.qm.path and conn.reconnects == 1
        assert (await a.depth(), await b.depth()) == (1, 1)
    finally:
        await conn.disconnect()


async def test_a_unit_of_work_open_at_the_break_is_backed_out_and_reported(
        pair: tuple[Served, Served]) -> None:
    a, b = pair
    await a.start()
    conn = await connect_reconnecting([a.qm.path, b.qm.path], policy=FAST)
    try:
        await conn.put1("APP.Q", _md(), b"waiting")
        q = await conn.open("APP.Q", OpenOption.INPUT_SHARED | OpenOption.OUTPUT)
        got = await q.get(GetOptions(wait_ms=0, syncpoint=True))
        assert got.body == b"waiting"
        await a.stop()
        await b.start()
        # the unit's next call and its commit say it was backed out; nothing of it commits
        with pytest.raises(MQError) as info:
            await q.put(_md(), b"reply", PutOptions(syncpoint=True))
        assert info.value.reason == Reason.BACKED_OUT
        with pytest.raises(MQError) as info:
            await conn.commit()
        assert info.value.reason == Reason.BACKED_OUT
        assert await b.depth() == 0
        # the got message is back where it was: not lost
        assert await a.depth() == 1
        # a new unit of work on the new connection commits
        await q.put(_md(), b"again", PutOptions(syncpoint=True))
        await conn.commit()
        assert await b.depth() == 1
    finally:
        await conn.disconnect()


async def test_backout_ends_a_broken_unit_of_work(pair: tuple[Served, Served]) -> None:
    a, b = pair
    await a.start()
    conn = await connect_reconnecting([a.qm.path, b.qm.path], policy=FAST)
    try:
        q = await conn.open("APP.Q", OpenOption.OUTPUT)
        await q.put(_md(), b"in the unit", PutOptions(syncpoint=True))
        await a.stop()
        await b.start()
        await conn.backout()
        await q.put(_md(), b"next unit", PutOptions(syncpoint=True))
        await conn.commit()
        assert (await a.depth(), await b.depth()) == (0, 1)
    finally:
        await conn.disconnect()


async def test_reconnection_gives_up_after_its_timeout(pair: tuple[Served, Served]) -> None:
    a, b = pair
    await a.start()
    conn = await connect_reconnecting(
        [a.qm.path, b.qm.path], policy=ReconnectPolicy(initial_s=0.02, max_s=0.05,
                                                        timeout_s=0.3))
    q = await conn.open("APP.Q", OpenOption.OUTPUT)
    await a.stop()
    with pytest.raises(MQError) as info:
        await q.put(_md(), b"x")
    assert info.value.reason == Reason.RECONNECT_FAILED
    assert "within 0.3 s" in str(info.value)
    with pytest.raises(MQError) as info:
        await q.put(_md(), b"y")
    assert info.value.reason == Reason.HCONN_ERROR


async def test_another_queue_manager_is_not_reconnected_to(tmp_path: Path) -> None:
    a, other = Served("QMR", tmp_path / "a"), Served("QMX", tmp_path / "x")
    try:
        await a.start()
        await other.start()
        conn = await connect_reconnecting(
            [a.qm.path, other.qm.path],
            policy=ReconnectPolicy(initial_s=0.02, max_s=0.05, timeout_s=0.3))
        await a.stop()
        with pytest.raises(MQError) as info:
            await conn.put1("APP.Q", _md(), b"x")
        assert info.value.reason == Reason.RECONNECT_FAILED
        assert "serves queue manager QMX, not QMR" in str(info.value)
        assert await other.depth() == 0
    finally:
        for s in (a, other):
            await s.stop()
            await s.qm.close()


def test_malformed_lists_are_refused() -> None:
    assert parse_socket_list("/a, /b/qm.sock") == [Path("/a"), Path("/b/qm.sock")]
    for bad, says in {"/a,,/b": "address 2", "": "address 1", "/a,": "address 2",
                      ",".join(["/x"] * 9): "at most 8"}.items():
        with pytest.raises(ValueError, match=says):
            parse_socket_list(bad)
    assert parse_conname_list("h1(1414), h2 (1415)") == [("h1", 1414), ("h2", 1415)]
    assert parse_conname_list("h1", default_port=1414) == [("h1", 1414)]
    cases = {
        "h1(1414),,h2(1)": "address 2 is empty",
        "h1(1414),": "address 2 is empty",
        "": "empty",
        "h1": "not host(port)",
        "h1(0)": "not 1-65535",
        "h1(70000)": "not 1-65535",
        "h1(14x)": "not host(port)",
        "h(1(2))": "not host(port)",
        ",".join(f"h{i}(1)" for i in range(9)): "at most 8",
        "h" * 260 + "(1414)": "at most 264",
    }
    for bad, says in cases.items():
        with pytest.raises(ConnameError, match=re.escape(says)):
            parse_conname_list(bad)


async def test_disconnect_ends_a_reconnection_in_progress(pair: tuple[Served, Served]) -> None:
    a, b = pair
    await a.start()
    conn = await connect_reconnecting([a.qm.path, b.qm.path], policy=FAST)
    await a.stop()
    put = asyncio.create_task(conn.put1("APP.Q", _md(), b"x"))
    await _until(lambda: conn._lock.locked())  # the put is reconnecting (none listens)
    await conn.disconnect()
    await b.start()
    with pytest.raises(MQError) as info:
        await asyncio.wait_for(put, 10)
    assert info.value.reason == Reason.HCONN_ERROR
    assert b.server is not None and b.server.connections == 0  # none left connected
    assert await b.depth() == 0


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("not within 5 s")
