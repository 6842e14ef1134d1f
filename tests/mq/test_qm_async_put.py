"""Asynchronous put (MQPMO_ASYNC_RESPONSE) over the embedded queue manager's local socket.

Proves: an asynchronous put gets no reply, yet keeps its order with every call around it;
the descriptor it returns carries the MsgId the queue holds; a failed one (unknown queue,
MAXMSGL, put inhibited) makes the unit of work's commit back out everything and fail with
2003 naming the reason, while MQSTAT (``async_put_status``) reports the first failure and
the counts, then resets; outside syncpoint a failure only goes to MQSTAT; a client killed
in the middle of a unit loses nothing it committed and leaves nothing of the open unit,
and so does a queue-manager process killed while it holds a client's asynchronous puts
or during its commit (the client is told, never that the commit worked); random
sequences of puts, commits and backouts leave the same queues with asynchronous as with
synchronous puts (hypothesis); the in-process connection accepts the option.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.mq.embedded.client import ASYNC_FLUSH_BYTES, ClientConnection, connect_local
from gateway.mq.embedded.qm_protocol import (
    ProtocolError,
    encode_frame,
    pack_message,
    status_from_json,
)
from gateway.mq.embedded.qm_server import QueueManagerServer
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import (
    AsyncPutStatus,
    GetOptions,
    MQError,
    OpenOption,
    PutOptions,
    QueueAttr,
    QueueHandle,
    async_put_status,
)
from gateway.wire.constants import CompCode, Persistence
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.support.served_qm import served_queue_manager

ROOT = Path(__file__).resolve().parents[2]
ASYNC_SP = PutOptions(syncpoint=True, async_response=True)
ASYNC = PutOptions(async_response=True)
DEFS = ("DEFINE QLOCAL(APP.Q)\nDEFINE QLOCAL(OTHER.Q)\nDEFINE QLOCAL(SMALL.Q) MAXMSGL(16)\n"
        "DEFINE QLOCAL(SHUT.Q) PUT(DISABLED)\n")


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[EmbeddedQueueManager]:
    async with served_queue_manager(tmp_path / "qm", DEFS, name="QMA") as qm:
        yield qm


@pytest.fixture
async def conn(served: EmbeddedQueueManager) -> AsyncIterator[ClientConnection]:
    c = await connect_local(served.path)
    try:
        yield c
    finally:
        await c.disconnect()


def _md(**kw: object) -> MQMD:
    return MQMD(format="MQSTR", coded_char_set_id=1208, **kw)  # type: ignore[arg-type]


async def _drain(qm: EmbeddedQueueManager, q_name: str) -> list[bytes]:
    """Every message on ``q_name``, got by another connection (what others can see)."""
    c = await qm.connect()
    try:
        q = await c.open(q_name, OpenOption.INPUT_SHARED)
        out: list[bytes] = []
        while True:
            try:
                out.append((await q.get()).body)
            except MQError as exc:
                assert exc.reason == Reason.NO_MSG_AVAILABLE
                return out
    finally:
        await c.disconnect()


async def test_async_puts_keep_their_order_and_commit(
    served: EmbeddedQueueManager, conn: ClientConnection
) -> None:
    out = await conn.open("APP.Q", OpenOption.OUTPUT)
    bodies = [f"{i:05d}".encode().ljust(1024, b"x") for i in range(600)]  # > flush bytes
    assert sum(map(len, bodies)) > ASYNC_FLUSH_BYTES
    for b in bodies[:300]:
        await out.put(_md(), b, ASYNC_SP)
    await out.put(_md(), bodies[300], PutOptions(syncpoint=True))  # a synchronous one between
    for b in bodies[301:]:
        await out.put(_md(), b, ASYNC_SP)
    assert await _drain(served, "APP.Q") == []
    await conn.commit()
    assert await _drain(served, "APP.Q") == bodies
    status = await async_put_status(conn)
    assert status == AsyncPutStatus(put_success_count=599)


async def test_an_async_put_is_done_before_the_next_call_of_the_connection(
    conn: ClientConnection,
) -> None:
    q = await conn.open("APP.Q", OpenOption.OUTPUT | OpenOption.INPUT_SHARED)
    await q.put(_md(), b"first", ASYNC)
    await q.put(_md(), b"second", ASYNC)
    assert (await q.get()).body == b"first"  # the get's frame follows the puts'
    assert (await q.get(GetOptions(wait_ms=0))).body == b"second"


async def test_an_async_put_during_a_waiting_get_waits_for_it(
    served: EmbeddedQueueManager, conn: ClientConnection
) -> None:
    """Two tasks on one connection: the put issued while a get waits is written after the
    get's reply (a frame during a get would break the protocol), and nothing is lost."""
    inp = await conn.open("APP.Q", OpenOption.INPUT_SHARED)
    out = await conn.open("OTHER.Q", OpenOption.OUTPUT)
    waiting = asyncio.create_task(inp.get(GetOptions(wait_ms=300)))
    await asyncio.sleep(0.05)
    await out.put(_md(), b"later", ASYNC)
    with pytest.raises(MQError) as info:
        await waiting
    assert info.value.reason == Reason.NO_MSG_AVAILABLE
    assert await async_put_status(conn) == AsyncPutStatus(put_success_count=1)
    assert await _drain(served, "OTHER.Q") == [b"later"]


async def test_the_returned_descriptor_has_the_ids_the_queue_holds(
    served: EmbeddedQueueManager, conn: ClientConnection
) -> None:
    q = await conn.open("APP.Q", OpenOption.OUTPUT)
    a = await q.put(_md(), b"a", ASYNC)
    b = await q.put(_md(), b"b", PutOptions(async_response=True, new_correl_id=True))
    mine = bytes(range(24))
    c = await q.put(_md(msg_id=mine), b"c", ASYNC)
    assert len({a.msg_id, b.msg_id}) == 2 and b.correl_id != bytes(24)
    assert c.msg_id == mine
    got = []
    inp = await conn.open("APP.Q", OpenOption.INPUT_SHARED)
    for _ in range(3):
        got.append((await inp.get()).md)
    assert [(m.msg_id, m.correl_id) for m in got] == [
        (a.msg_id, a.correl_id), (b.msg_id, b.correl_id), (c.msg_id, c.correl_id)]
    assert got[0].user_identifier == conn.user  # the peer's identity, as for a sync put


@pytest.mark.parametrize(
    ("target", "body", "reason"),
    [
        ("NO.SUCH.Q", b"x", Reason.UNKNOWN_OBJECT_NAME),
        ("SMALL.Q", b"y" * 17, Reason.MSG_TOO_BIG_FOR_Q),
        ("SHUT.Q", b"z", Reason.PUT_INHIBITED),
    ],
    ids=["unknown-queue", "maxmsgl", "put-inhibited"],
)
async def test_a_failed_async_put_backs_out_the_whole_unit_at_commit(
    served: EmbeddedQueueManager, conn: ClientConnection, target: str, body: bytes,
    reason: int,
) -> None:
    out = await conn.open("APP.Q", OpenOption.OUTPUT)
    await out.put(_md(), b"before", ASYNC_SP)
    await conn.put1(target, _md(), body, ASYNC_SP)  # returns at once: no error yet
    await out.put(_md(), b"after", ASYNC_SP)
    await conn.put1("OTHER.Q", _md(), b"other", ASYNC_SP)
    with pytest.raises(MQError) as info:
        await conn.commit()
    assert info.value.reason == Reason.BACKED_OUT
    assert info.value.comp_code == CompCode.WARNING
    assert str(int(reason)) in str(info.value) and target in str(info.value)
    assert await _drain(served, "APP.Q") == [] and await _drain(served, "OTHER.Q") == []
    status = await async_put_status(conn)
    assert (status.comp_code, status.reason, status.object_name) == (
        CompCode.FAILED, reason, target)
    assert (status.put_success_count, status.put_failure_count) == (3, 1)
    assert await async_put_status(conn) == AsyncPutStatus()  # MQSTAT resets
    # the connection carries on: the next unit commits
    await out.put(_md(), b"next", ASYNC_SP)
    await conn.commit()
    assert await _drain(served, "APP.Q") == [b"next"]


async def test_mqstat_keeps_the_first_failure_and_counts_all(
    served: EmbeddedQueueManager, conn: ClientConnection
) -> None:
    small = await conn.open("SMALL.Q", OpenOption.OUTPUT)
    await small.put(_md(), b"m" * 40, ASYNC)
    await conn.put1("NO.SUCH.Q", _md(), b"x", ASYNC)
    await small.put(_md(), b"fits", ASYNC)
    status = await async_put_status(conn)
    assert (status.reason, status.object_name, status.resolved_object_name,
            status.resolved_q_mgr_name) == (Reason.MSG_TOO_BIG_FOR_Q, "SMALL.Q", "SMALL.Q", "QMA")
    assert (status.put_success_count, status.put_failure_count) == (1, 2)
    # outside syncpoint a failure is only reported: the good put is there, commit is fine
    await conn.commit()
    assert await _drain(served, "SMALL.Q") == [b"fits"]


async def test_backout_and_disconnect_forget_a_failed_async_put(
    served: EmbeddedQueueManager, conn: ClientConnection
) -> None:
    out = await conn.open("APP.Q", OpenOption.OUTPUT)
    await conn.put1("NO.SUCH.Q", _md(), b"x", ASYNC_SP)
    await out.put(_md(), b"gone", ASYNC_SP)
    await conn.backout()
    await out.put(_md(), b"kept", ASYNC_SP)
    await conn.commit()
    assert await _drain(served, "APP.Q") == [b"kept"]
    # puts queued by the client and then a disconnect: the open unit is backed out, the
    # puts outside syncpoint are there
    other = await connect_local(served.path)
    q = await other.open("APP.Q", OpenOption.OUTPUT)
    await q.put(_md(), b"unit", ASYNC_SP)
    await q.put(_md(), b"outside", ASYNC)
    await other.disconnect()
    assert await _drain(served, "APP.Q") == [b"outside"]


async def test_the_in_process_connection_accepts_the_option(
    served: EmbeddedQueueManager,
) -> None:
    c = await served.connect()
    try:
        q = await c.open("APP.Q", OpenOption.OUTPUT)
        md = await q.put(_md(), b"in-process", ASYNC_SP)  # put synchronously, as MQ may
        assert md.msg_id != bytes(24)
        with pytest.raises(MQError) as info:
            await (await c.open("SMALL.Q", OpenOption.OUTPUT)).put(_md(), b"s" * 40, ASYNC_SP)
        assert info.value.reason == Reason.MSG_TOO_BIG_FOR_Q
        await c.commit()
        assert await async_put_status(c) == AsyncPutStatus()  # nothing asynchronous to tell
    finally:
        await c.disconnect()
    assert await _drain(served, "APP.Q") == [b"in-process"]


async def test_async_frames_break_the_protocol_like_any_other(
    served: EmbeddedQueueManager,
) -> None:
    reader, writer = await asyncio.open_unix_connection(str(served.path / "qm.sock"))
    try:
        writer.write(encode_frame({"op": "put_async", "hobj": 1, "options": {}}))
        await writer.drain()
        prefix = await asyncio.wait_for(reader.readexactly(8), 10)
        rest = await reader.read()
    finally:
        writer.close()
    assert b"before connect" in prefix + rest and b'"closing":true' in prefix + rest
    with pytest.raises(ProtocolError):
        status_from_json({"comp_code": "2"})
    with pytest.raises(ProtocolError):
        status_from_json({"object_name": 5})


async def test_a_frame_cut_short_still_times_out(
    served: EmbeddedQueueManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The frame read's timeout (asyncio.timeout since the asynchronous-put pass) still
    ends a connection whose frame stalls."""
    import gateway.mq.embedded.qm_server as qm_server

    monkeypatch.setattr(qm_server, "FRAME_READ_TIMEOUT_S", 0.2)
    reader, writer = await asyncio.open_unix_connection(str(served.path / "qm.sock"))
    try:
        frame = encode_frame({"op": "connect", "version": 1})
        writer.write(frame[:-3])  # the last bytes never come
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    assert b"was not complete" in reply and b'"closing":true' in reply


async def test_a_client_never_sends_async_frames_to_a_server_without_the_feature(
    tmp_path: Path,
) -> None:
    """F2: a server that does not announce ``put_async`` (one from before it, which
    closes the connection on the unknown operation) gets synchronous puts: every put
    lands, a failure raises at once, and the connection stays up."""
    qm = EmbeddedQueueManager("QMO", tmp_path / "qm")
    qm.run_mqsc(DEFS)
    server = QueueManagerServer(qm, features=("compact_batch",))
    await server.start()
    try:
        c = await connect_local(qm.path)
        assert not c.async_put_supported
        q = await c.open("APP.Q", OpenOption.OUTPUT | OpenOption.INQUIRE)
        ids = [(await q.put(_md(), f"m{i}".encode(), ASYNC)).msg_id for i in range(3)]
        ids.append((await c.put1("APP.Q", _md(), b"m3", ASYNC)).msg_id)
        await q.put(_md(), b"unit", ASYNC_SP)
        with pytest.raises(MQError) as info:  # synchronous: the failure is told at once
            await c.put1("NO.SUCH.Q", _md(), b"x", ASYNC_SP)
        assert info.value.reason == Reason.UNKNOWN_OBJECT_NAME
        await c.commit()
        depth = await q.inquire(QueueAttr.CURRENT_Q_DEPTH)
        assert depth[QueueAttr.CURRENT_Q_DEPTH] == 5
        await c.disconnect()
        assert server.protocol_errors == 0
        got = await _drain(qm, "APP.Q")
        assert got == [b"m0", b"m1", b"m2", b"m3", b"unit"]
        # such a server does refuse the frames (what an older one does)
        reader, writer = await asyncio.open_unix_connection(str(qm.path / "qm.sock"))
        try:
            writer.write(encode_frame({"op": "connect", "version": 1})
                         + encode_frame({"op": "put_async", "hobj": 1, "options": {}}))
            await writer.drain()
            reply = await asyncio.wait_for(reader.read(), 10)
        finally:
            writer.close()
        assert b"unknown operation 'put_async'" in reply
    finally:
        await server.stop()
        await qm.close()
    # the current server announces it, and the client uses it
    assert ASYNC_FLUSH_BYTES > 0


async def test_the_server_announces_its_features(conn: ClientConnection) -> None:
    assert conn.async_put_supported and "compact_batch" in conn.features


async def test_async_puts_wait_when_the_server_does_not_read(tmp_path: Path) -> None:
    """F3: one put per loop step to a server that stopped reading: the puts stop
    returning once ASYNC_FLUSH_BYTES are not taken by the socket (back-pressure), and
    what the client holds stays near that bound."""
    stalled = asyncio.Event()

    async def stalled_server(reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        for reply in ({"ok": True, "q_mgr_name": "QM", "user": "u",
                       "features": ["put_async"]},
                      {"ok": True, "hobj": 1, "resolved_q_name": "Q",
                       "resolved_q_mgr_name": "QM"}):
            n = int.from_bytes(await reader.readexactly(4), "big")
            await reader.readexactly(n)
            writer.write(encode_frame(reply))
            await writer.drain()
        await stalled.wait()
        writer.close()

    path = tmp_path / "qm.sock"
    srv = await asyncio.start_unix_server(stalled_server, path=str(path))
    body = b"x" * 10240
    done = 0
    try:
        c = await connect_local(path)
        q = await c.open("Q", OpenOption.OUTPUT)

        async def put_many() -> None:
            nonlocal done
            for _ in range(3000):
                await q.put(_md(), body, ASYNC)
                done += 1
                await asyncio.sleep(0)  # one put per loop step

        task = asyncio.ensure_future(put_many())
        await asyncio.sleep(1.0)
        held = c._pending_bytes + c._writer.transport.get_write_buffer_size()
        assert not task.done() and done < 300, done  # waiting, not returning success
        assert held <= ASYNC_FLUSH_BYTES + 2 * len(body), held
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        c._writer.transport.abort()
    finally:
        stalled.set()
        srv.close()
        await srv.wait_closed()


async def test_a_bad_hobj_on_put_async_is_a_failure_not_a_crash(
    served: EmbeddedQueueManager, conn: ClientConnection, caplog: pytest.LogCaptureFixture,
) -> None:
    """F6: a list or dict ``hobj`` is MQRC 2019 in the MQSTAT record, the connection
    carries on, and nothing is logged as an unexpected failure."""
    data = pack_message(_md(), b"x")
    await conn._send_async({"op": "put_async", "hobj": [1], "options": {}}, data)
    await conn._send_async({"op": "put_async", "hobj": {"a": 1}, "options": {}}, data)
    status = await async_put_status(conn)
    assert (status.reason, status.put_failure_count) == (Reason.HOBJ_ERROR, 2)
    assert "unexpected failure" not in caplog.text
    q = await conn.open("APP.Q", OpenOption.OUTPUT)
    await q.put(_md(), b"still up", ASYNC)
    await conn.commit()
    assert await _drain(served, "APP.Q") == [b"still up"]


async def test_a_doomed_unit_whose_backout_fails_stays_doomed(
    served: EmbeddedQueueManager, conn: ClientConnection, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """F7: the server forgets a doomed unit only after its backout succeeded."""
    from gateway.mq.embedded.connection import EmbeddedConnection

    real = EmbeddedConnection.backout
    failures = [1]

    async def backout(self: EmbeddedConnection) -> None:
        if failures:
            failures.pop()
            raise MQError(Reason.RESOURCE_PROBLEM, "the store could not write")
        await real(self)

    q = await conn.open("APP.Q", OpenOption.OUTPUT)
    await q.put(_md(), b"good", ASYNC_SP)
    await conn.put1("NO.SUCH.Q", _md(), b"x", ASYNC_SP)
    monkeypatch.setattr(EmbeddedConnection, "backout", backout)
    with pytest.raises(MQError) as first:
        await conn.commit()
    assert first.value.reason == Reason.RESOURCE_PROBLEM
    with pytest.raises(MQError) as again:  # retried: still backs out, never commits
        await conn.commit()
    assert again.value.reason == Reason.BACKED_OUT
    assert await _drain(served, "APP.Q") == []


async def test_an_async_put_behind_a_disconnect_is_refused(
    served: EmbeddedQueueManager,
) -> None:
    """F9: a put that waited for the lock while disconnect held it raises; it is not
    reported as made and then dropped."""
    c = await connect_local(served.path)
    q = await c.open("APP.Q", OpenOption.OUTPUT)
    closing = asyncio.ensure_future(c.disconnect())
    await asyncio.sleep(0)  # disconnect holds the lock, waiting for its reply
    assert c._lock.locked()
    with pytest.raises(MQError) as info:
        await q.put(_md(), b"late", ASYNC)
    assert info.value.reason == Reason.HCONN_ERROR
    await closing
    assert await _drain(served, "APP.Q") == []


CHILD = r"""
import asyncio, os, signal, sys
from gateway.mq.embedded.client import connect_local
from gateway.mq.port import OpenOption, PutOptions, QueueAttr
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD

async def main(where):
    conn = await connect_local(where)
    q = await conn.open("APP.Q", OpenOption.OUTPUT | OpenOption.INQUIRE)
    opts = PutOptions(syncpoint=True, async_response=True)
    for unit in range(3):
        for i in range(20):
            await q.put(MQMD(persistence=Persistence.PERSISTENT), f"c{unit}-{i}".encode(), opts)
        await conn.commit()
    for i in range(20):
        await q.put(MQMD(persistence=Persistence.PERSISTENT), f"open-{i}".encode(), opts)
    # a synchronous call flushes the frames: the depth counts the open unit's 20 puts
    depth = (await q.inquire(QueueAttr.CURRENT_Q_DEPTH))[QueueAttr.CURRENT_Q_DEPTH]
    print("putting", depth, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main(sys.argv[1]))
"""


async def test_a_client_killed_mid_unit_loses_nothing_committed(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QMK", tmp_path / "qm")
    qm.run_mqsc("DEFINE QLOCAL(APP.Q)")
    server = QueueManagerServer(qm)
    await server.start()
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, str(qm.path), cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        out, _ = await asyncio.wait_for(child.communicate(), 60)
        # the server had the open unit's 20 puts (uncommitted) when the child died
        assert child.returncode == -signal.SIGKILL and out == b"putting 80\n"
        for _ in range(100):  # the server sees the socket close and backs the unit out
            if server.qm.queue_depth("APP.Q") == 60 and not server._clients:
                break
            await asyncio.sleep(0.05)
    finally:
        await server.stop()
        await qm.close()
    again = EmbeddedQueueManager("QMK", tmp_path / "qm")  # what is on disk
    try:
        expected = [f"c{u}-{i}".encode() for u in range(3) for i in range(20)]
        assert await _drain(again, "APP.Q") == expected
    finally:
        await again.close()


SERVER_CHILD = r"""
import asyncio, sys
from gateway.mq.embedded.qm_server import QueueManagerServer
from gateway.mq.embedded.qmgr import EmbeddedQueueManager

async def main(where):
    qm = EmbeddedQueueManager("QMS", where)
    qm.run_mqsc("DEFINE QLOCAL(APP.Q) REPLACE", stop_on_error=True)
    await QueueManagerServer(qm).start()
    print("serving", flush=True)
    await asyncio.Event().wait()

asyncio.run(main(sys.argv[1]))
"""


async def _serve_in_child(where: Path) -> asyncio.subprocess.Process:
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVER_CHILD, str(where), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert server.stdout is not None
    assert await asyncio.wait_for(server.stdout.readline(), 60) == b"serving\n"
    return server


async def _committed_units(conn: ClientConnection, q: QueueHandle, units: int) -> list[bytes]:
    out: list[bytes] = []
    for unit in range(units):
        bodies = [f"c{unit}-{i}".encode() for i in range(20)]
        for body in bodies:
            await q.put(_md(persistence=Persistence.PERSISTENT), body, ASYNC_SP)
        await conn.commit()
        out += bodies
    return out


@pytest.mark.parametrize("when", ["holding the open unit", "during the commit"])
async def test_a_queue_manager_killed_under_async_puts_keeps_every_acknowledged_commit(
    tmp_path: Path, when: str
) -> None:
    """The other side's outage: the process serving the queue manager is SIGKILLed while
    it holds an application's open unit of asynchronous puts (checked: its depth counts
    them), or while the application's commit of that unit is in progress. Every unit
    whose commit returned is in the directory, in order; the open unit is not (its commit
    was never carried out: the server was stopped before it could read it); the
    application is told by a connection error, never that its commit worked."""
    where = tmp_path / "qm"
    server = await _serve_in_child(where)
    try:
        conn = await connect_local(where)
        q = await conn.open("APP.Q", OpenOption.OUTPUT | OpenOption.INQUIRE)
        committed = await _committed_units(conn, q, 3)
        for i in range(20):
            await q.put(_md(persistence=Persistence.PERSISTENT), f"open-{i}".encode(), ASYNC_SP)
        # a synchronous call: the frames are written and the server has the 20 puts
        depth = (await q.inquire(QueueAttr.CURRENT_Q_DEPTH))[QueueAttr.CURRENT_Q_DEPTH]
        assert depth == 80
        if when == "during the commit":
            server.send_signal(signal.SIGSTOP)  # the commit is sent, never answered
            commit = asyncio.ensure_future(conn.commit())
            await asyncio.sleep(0.2)
            assert not commit.done()
            server.kill()
        else:
            server.kill()
            commit = asyncio.ensure_future(conn.commit())
        assert await server.wait() == -signal.SIGKILL
        with pytest.raises(MQError) as broken:
            await asyncio.wait_for(commit, 30)
        assert broken.value.reason in (Reason.CONNECTION_BROKEN, Reason.HCONN_ERROR)
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
    again = EmbeddedQueueManager("QMS", where)  # what is in the directory
    try:
        assert await _drain(again, "APP.Q") == committed
    finally:
        await again.close()


# ------------------------------------------------------------------ hypothesis ------

QUEUES = ("APP.Q", "OTHER.Q")
put_op = st.tuples(st.just("put"), st.sampled_from((*QUEUES, "SMALL.Q", "NO.SUCH.Q")),
                   st.booleans(), st.booleans())
op = st.one_of(put_op, st.just(("commit",)), st.just(("backout",)))


async def _play(path: Path, ops: list[tuple[object, ...]], async_put: bool
                ) -> tuple[dict[str, list[bytes]], list[bool]]:
    """Run ``ops`` through a client; the queues' contents and each commit's outcome. A
    synchronous application that is told of a failed syncpoint put backs its unit out at
    commit time: what the queue manager does for an asynchronous one."""
    qm = EmbeddedQueueManager("QMH", path)
    qm.run_mqsc(DEFS)
    server = QueueManagerServer(qm)
    await server.start()
    commits: list[bool] = []
    try:
        c = await connect_local(qm.path)
        doomed = False
        for n, step in enumerate(ops):
            if step[0] == "put":
                _, q_name, syncpoint, big = step
                body = f"{n:04d}".encode() * (8 if big else 1)  # 32 bytes > SMALL.Q's 16
                opts = PutOptions(syncpoint=bool(syncpoint), async_response=async_put)
                try:
                    await c.put1(str(q_name), _md(persistence=Persistence.PERSISTENT), body, opts)
                except MQError:
                    assert not async_put
                    doomed = doomed or bool(syncpoint)
            elif step[0] == "commit":
                try:
                    if doomed:
                        await c.backout()
                        raise MQError(Reason.BACKED_OUT)
                    await c.commit()
                    commits.append(True)
                except MQError as exc:
                    assert exc.reason == Reason.BACKED_OUT
                    commits.append(False)
                doomed = False
            else:
                await c.backout()
                doomed = False
        await c.backout()  # an unfinished last unit is not kept, in either mode
        await c.disconnect()
        return {q: await _drain(qm, q) for q in (*QUEUES, "SMALL.Q")}, commits
    finally:
        await server.stop()
        await qm.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=25))
def test_async_and_sync_puts_leave_the_same_queues(ops: list[tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sync = asyncio.run(_play(Path(tmp) / "sync", ops, False))
        asynchronous = asyncio.run(_play(Path(tmp) / "async", ops, True))
    assert asynchronous == sync
