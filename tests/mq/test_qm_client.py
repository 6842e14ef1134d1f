"""The embedded queue manager's local client connection (qm_server + client).

Proves: the client is a ``gateway.mq.port.Connection`` and the MQI verbs behave over the
socket as in-process (units of work, waits, browse, matching, put1, inquire, MQSC);
the queue manager stamps UserIdentifier from the peer's OS user, never from the
client's claim, and refuses explicit context to other users; the socket is 0600; hostile
frames (oversize, malformed, unknown op, out of order, cut short) get a clear error
reply and a closed connection while the server keeps serving others.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.mq.embedded.client import ClientConnection, connect_local
from gateway.mq.embedded.qm_protocol import MAX_FRAME, SOCKET_NAME, encode_frame
from gateway.mq.embedded.qm_server import QueueManagerServer
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import (
    Browse,
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

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedQueueManager, QueueManagerServer]]:
    qm = EmbeddedQueueManager("QMC", tmp_path / "qm")
    qm.run_mqsc("DEFINE QLOCAL(APP.Q)\nDEFINE QLOCAL(OTHER.Q)\n")
    server = QueueManagerServer(qm)
    await server.start()
    try:
        yield qm, server
    finally:
        await server.stop()
        await qm.close()


@pytest.fixture
async def conn(served: tuple[EmbeddedQueueManager, QueueManagerServer]
               ) -> AsyncIterator[ClientConnection]:
    c = await connect_local(served[0].path)
    try:
        yield c
    finally:
        await c.disconnect()


def _md(**kw: object) -> MQMD:
    return MQMD(format="MQSTR", coded_char_set_id=1208, **kw)  # type: ignore[arg-type]


async def test_the_client_is_a_port_connection(conn: ClientConnection) -> None:
    assert isinstance(conn, Connection)
    assert conn.q_mgr_name == "QMC"
    q = await conn.open("APP.Q", OpenOption.OUTPUT)
    assert isinstance(q, QueueHandle)
    assert (q.resolved_q_name, q.resolved_q_mgr_name) == ("APP.Q", "QMC")
    await q.close()


async def test_socket_is_private_and_a_stale_one_is_replaced(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QMS", tmp_path / "qm")
    stale = qm.path / SOCKET_NAME
    stale.write_text("left by a killed gateway")
    server = QueueManagerServer(qm)
    await server.start()
    try:
        mode = os.stat(stale).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        c = await connect_local(qm.path)
        await c.disconnect()
    finally:
        await server.stop()
        await qm.close()
    assert not stale.exists()
    with pytest.raises(MQError) as info:
        await connect_local(qm.path)
    assert info.value.reason == Reason.Q_MGR_NOT_AVAILABLE


async def test_units_of_work_over_the_socket(
    served: tuple[EmbeddedQueueManager, QueueManagerServer], conn: ClientConnection
) -> None:
    qm = served[0]
    out = await conn.open("APP.Q", OpenOption.OUTPUT)
    await out.put(_md(), b"one", PutOptions(syncpoint=True))
    other = await connect_local(qm.path)
    peek = await other.open("APP.Q", OpenOption.INPUT_SHARED)
    with pytest.raises(MQError) as info:
        await peek.get()  # not visible to another connection before MQCMIT
    assert info.value.reason == Reason.NO_MSG_AVAILABLE
    await other.disconnect()
    await conn.commit()
    assert qm.queue_depth("APP.Q") == 1
    inp = await conn.open("APP.Q", OpenOption.INPUT_SHARED)
    msg = await inp.get(GetOptions(syncpoint=True))
    assert msg.body == b"one" and msg.md.backout_count == 0
    await conn.backout()
    again = await inp.get(GetOptions(syncpoint=True))
    assert again.body == b"one" and again.md.backout_count == 1
    await conn.commit()
    assert qm.queue_depth("APP.Q") == 0
    with pytest.raises(MQError) as info:
        await inp.get(GetOptions(wait_ms=0))
    assert info.value.reason == Reason.NO_MSG_AVAILABLE


async def test_a_waiting_get_receives_a_later_put(
    served: tuple[EmbeddedQueueManager, QueueManagerServer], conn: ClientConnection
) -> None:
    other = await connect_local(served[0].path)
    inp = await conn.open("APP.Q", OpenOption.INPUT_SHARED)
    waiting = asyncio.create_task(inp.get(GetOptions(wait_ms=5000)))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await other.put1("APP.Q", _md(), b"late")
    msg = await asyncio.wait_for(waiting, 5)
    assert msg.body == b"late"
    await other.disconnect()


async def test_browse_match_put1_inquire(conn: ClientConnection) -> None:
    ids = []
    for i in range(3):
        md = await conn.put1("APP.Q", _md(correl_id=bytes([i + 1]) * 24), f"m{i}".encode())
        ids.append(md.msg_id)
    q = await conn.open("APP.Q", OpenOption.BROWSE | OpenOption.INPUT_SHARED
                        | OpenOption.INQUIRE)
    assert (await q.inquire(QueueAttr.CURRENT_Q_DEPTH, QueueAttr.Q_NAME)) == {
        QueueAttr.CURRENT_Q_DEPTH: 3, QueueAttr.Q_NAME: "APP.Q"}
    seen = [(await q.get(GetOptions(browse=Browse.FIRST))).body]
    for _ in range(2):
        seen.append((await q.get(GetOptions(browse=Browse.NEXT))).body)
    assert seen == [b"m0", b"m1", b"m2"]
    with pytest.raises(MQError) as info:
        await q.get(GetOptions(browse=Browse.NEXT))
    assert info.value.reason == Reason.NO_MSG_AVAILABLE
    by_msg_id = await q.get(GetOptions(match_msg_id=ids[2]))
    assert by_msg_id.body == b"m2"
    by_correl = await q.get(GetOptions(match_correl_id=bytes([2]) * 24))
    assert by_correl.body == b"m1"
    assert (await q.inquire(QueueAttr.CURRENT_Q_DEPTH))[QueueAttr.CURRENT_Q_DEPTH] == 1
    with pytest.raises(MQError) as info:
        await conn.open("NO.SUCH.Q", OpenOption.OUTPUT)
    assert info.value.reason == Reason.UNKNOWN_OBJECT_NAME


async def test_mqsc_over_the_socket(conn: ClientConnection) -> None:
    await conn.put1("APP.Q", _md(), b"x")
    output, results = await conn.mqsc("DEFINE QLOCAL(NEW.Q)\nDISPLAY QSTATUS(APP.Q)\n"
                                      "DISPLAY QLOCAL(APP.Q) CURDEPTH\nDISPLAY CHSTATUS(*)\n")
    assert [r["ok"] for r in results] == [True, True, True, False]
    assert "AMQ8006I" in output and "CURDEPTH(1)" in output
    assert "AMQ8420I: Channel Status not found." in output


async def test_disconnect_without_commit_backs_out(
    served: tuple[EmbeddedQueueManager, QueueManagerServer]
) -> None:
    qm = served[0]
    c = await connect_local(qm.path)
    await c.put1("APP.Q", _md(persistence=1), b"keep")
    q = await c.open("APP.Q", OpenOption.INPUT_SHARED)
    await q.get(GetOptions(syncpoint=True))
    await c.put1("APP.Q", _md(), b"vanish", PutOptions(syncpoint=True))
    c._writer.transport.abort()  # the program dies: no MQDISC
    for _ in range(50):
        if qm.queue_depth("APP.Q") == 1:
            break
        await asyncio.sleep(0.05)
    check = await qm.connect()
    msg = await (await check.open("APP.Q", OpenOption.INPUT_SHARED)).get()
    assert msg.body == b"keep" and msg.md.backout_count == 1
    assert qm.queue_depth("APP.Q") == 0
    await check.disconnect()


async def test_user_identifier_is_the_peer_user_not_the_claim(
    served: tuple[EmbeddedQueueManager, QueueManagerServer], conn: ClientConnection
) -> None:
    me = pwd.getpwuid(os.getuid()).pw_name[:12]
    assert conn.user == me
    out = await conn.put1("APP.Q", _md(user_identifier="spoofer"), b"x")
    assert out.user_identifier == me
    msg = await (await conn.open("APP.Q", OpenOption.INPUT_SHARED)).get()
    assert msg.md.user_identifier == me
    assert msg.md.put_appl_name  # this program's name, as a local binding records it
    # the gateway's own user may set context (as mqm may): the broker forwards this way
    out = await conn.put1("APP.Q", _md(user_identifier="forwarded"), b"y",
                          PutOptions(set_identity_context=True))
    assert out.user_identifier == "forwarded"


_OTHER_USER_CHILD = """
import asyncio, os, pwd, sys
from gateway.mq.embedded.client import connect_local
from gateway.mq.port import MQError, PutOptions
from gateway.wire.mqmd import MQMD
nobody = pwd.getpwnam("nobody")  # imports done as root; the connection is nobody's
os.setgid(nobody.pw_gid)
os.setuid(nobody.pw_uid)

async def main():
    try:
        c = await connect_local(sys.argv[1])
    except MQError as exc:
        print("connect", exc.reason); return
    out = await c.put1("APP.Q", MQMD(format="MQSTR", user_identifier="root"), b"x")
    print("user", out.user_identifier)
    try:
        await c.put1("APP.Q", MQMD(user_identifier="root"), b"y", PutOptions(set_all_context=True))
    except MQError as exc:
        print("setall", exc.reason)
    try:
        await c.mqsc("DEFINE QLOCAL(EVIL)")
    except MQError as exc:
        print("mqsc", exc.reason)
    await c.disconnect()
asyncio.run(main())
"""


def _as_nobody(served_path: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _OTHER_USER_CHILD, str(served_path)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\n")


async def test_another_os_user(served: tuple[EmbeddedQueueManager, QueueManagerServer]
                               ) -> None:
    """Mode 0600 keeps other users out; let in (chmod), they are who the kernel says and
    may not set context or run MQSC. Needs root to become another user; otherwise the
    same checks run on the server's decision function with a foreign uid."""
    server = served[1]
    if os.getuid() != 0:
        from gateway.mq.embedded import qm_server

        session = qm_server._Session(server, None)
        session.uid, session.user = os.getuid() + 1, "other"
        assert not session.may_set_context
        with pytest.raises(MQError) as info:
            session._stamp(_md(), PutOptions(set_all_context=True))
        assert info.value.reason == Reason.NOT_AUTHORIZED
        return
    # a directory other users may traverse (pytest's own are private to root)
    public = Path(tempfile.mkdtemp(prefix="qm-peer-"))
    os.chmod(public, 0o755)
    other = EmbeddedQueueManager("QMP", public / "qm")
    other.run_mqsc("DEFINE QLOCAL(APP.Q)\n")
    os.chmod(other.path, 0o755)
    srv = QueueManagerServer(other)
    await srv.start()
    try:
        lines = await asyncio.to_thread(_as_nobody, other.path)
        assert lines[0] == f"connect {Reason.NOT_AUTHORIZED}"
        os.chmod(srv.path, 0o666)
        lines = await asyncio.to_thread(_as_nobody, other.path)
        assert lines[:3] == ["user nobody", f"setall {Reason.NOT_AUTHORIZED}",
                             f"mqsc {Reason.NOT_AUTHORIZED}"]
        assert "EVIL" not in other.catalogue.queues
    finally:
        await srv.stop()
        await other.close()
        shutil.rmtree(public)


# ---------------------------------------------------------------- hostile input ----


async def _raw(path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(str(path))


async def _reply(reader: asyncio.StreamReader) -> dict[str, object]:
    (total,) = struct.unpack("!I", await reader.readexactly(4))
    payload = await reader.readexactly(total)
    (hlen,) = struct.unpack_from("!I", payload)
    reply: dict[str, object] = json.loads(payload[4 : 4 + hlen])
    return reply


async def _closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(1), 5) == b""


_CONNECT = {"op": "connect", "version": 1}


@pytest.mark.parametrize(
    ("name", "frames", "reason", "words"),
    [
        ("oversize", [struct.pack("!I", MAX_FRAME + 1)], Reason.DATA_LENGTH_ERROR, "exceeds"),
        ("too short", [struct.pack("!I", 2) + b"ab"], Reason.DATA_LENGTH_ERROR, "too short"),
        ("header overruns", [struct.pack("!II", 8, 999) + b"abcd"], Reason.DATA_LENGTH_ERROR,
         "does not fit"),
        ("not json", [struct.pack("!II", 10, 6) + b"{nope!"], Reason.UNEXPECTED_ERROR,
         "not JSON"),
        ("not an object", [encode_frame([1, 2])], Reason.UNEXPECTED_ERROR,  # type: ignore[arg-type]
         "not a JSON object"),
        ("unknown op", [encode_frame(_CONNECT), encode_frame({"op": "format_disk"})],
         Reason.UNEXPECTED_ERROR, "unknown operation"),
        ("before connect", [encode_frame({"op": "put1", "q_name": "APP.Q"})],
         Reason.HCONN_ERROR, "before connect"),
        ("wrong version", [encode_frame({"op": "connect", "version": 99})],
         Reason.UNEXPECTED_ERROR, "protocol version"),
        ("bad mqmd", [encode_frame(_CONNECT),
                      encode_frame({"op": "put1", "q_name": "APP.Q"}, b"\x00" * 400)],
         Reason.MD_ERROR, "MQMD"),
        ("bad options", [encode_frame(_CONNECT), encode_frame(
            {"op": "open", "q_name": "APP.Q", "options": "all"})], Reason.OPTIONS_ERROR,
         "open needs"),
        ("deeply nested json", [struct.pack("!II", 4 + 200_000, 200_000) + b"[" * 200_000],
         Reason.UNEXPECTED_ERROR, "not JSON"),
        ("wait out of range", [encode_frame(_CONNECT),
                               encode_frame({"op": "open", "q_name": "APP.Q", "options": 2}),
                               encode_frame({"op": "get", "hobj": 1,
                                             "options": {"wait_ms": 10**400}})],
         Reason.GMO_ERROR, "out of range"),
        ("bad get options", [encode_frame(_CONNECT),
                             encode_frame({"op": "open", "q_name": "APP.Q", "options": 2}),
                             encode_frame({"op": "get", "hobj": 1,
                                           "options": {"match_msg_id": "zz"}})],
         Reason.OPTIONS_ERROR, "hexadecimal"),
    ],
)
async def test_hostile_frames_get_an_error_and_a_closed_connection(
    served: tuple[EmbeddedQueueManager, QueueManagerServer],
    name: str, frames: list[bytes], reason: int, words: str,
) -> None:
    qm, server = served
    reader, writer = await _raw(server.path)
    for frame in frames:
        writer.write(frame)
    await writer.drain()
    reply: dict[str, object] = {"ok": True}
    while reply.get("ok"):  # replies to the valid frames first
        reply = await _reply(reader)
    assert reply["reason"] == reason, reply
    assert words in str(reply["message"]) and "client broke" in str(reply["message"])
    assert reply["closing"] is True
    assert await _closed(reader)
    writer.close()
    assert server.protocol_errors == 1
    # the server is unharmed: a well-behaved client still works
    c = await connect_local(qm.path)
    await c.put1("APP.Q", _md(), b"still here")
    await c.disconnect()
    assert qm.queue_depth("APP.Q") == 1


async def test_a_frame_cut_short_and_garbage_leave_the_server_serving(
    served: tuple[EmbeddedQueueManager, QueueManagerServer]
) -> None:
    qm, server = served
    for junk in (struct.pack("!I", 1000) + b"x" * 10, b"\x00\x01", os.urandom(4096)):
        _reader, writer = await _raw(server.path)
        writer.write(junk)
        await writer.drain()
        writer.close()
    c = await connect_local(qm.path)
    q = await c.open("APP.Q", OpenOption.OUTPUT | OpenOption.INQUIRE)
    await q.put(_md(), b"ok")
    assert (await q.inquire(QueueAttr.CURRENT_Q_DEPTH))[QueueAttr.CURRENT_Q_DEPTH] == 1
    await c.disconnect()


async def test_mq_errors_do_not_close_the_connection(conn: ClientConnection) -> None:
    q = await conn.open("APP.Q", OpenOption.OUTPUT)
    with pytest.raises(MQError) as info:
        await q.get(GetOptions())
    assert info.value.reason == Reason.NOT_OPEN_FOR_INPUT
    with pytest.raises(MQError) as info:
        await conn._call({"op": "close", "hobj": 999})
    assert info.value.reason == Reason.HOBJ_ERROR
    await q.put(_md(), b"after errors")  # same connection, still usable


async def test_a_client_gone_during_a_waiting_get_takes_nothing(
    served: tuple[EmbeddedQueueManager, QueueManagerServer]
) -> None:
    """amqsget killed while it waits: the message put afterwards stays on the queue."""
    qm = served[0]
    c = await connect_local(qm.path)
    q = await c.open("APP.Q", OpenOption.INPUT_SHARED)
    waiting = asyncio.create_task(q.get(GetOptions(wait_ms=30_000)))
    await asyncio.sleep(0.2)
    c._writer.transport.abort()  # killed: no MQDISC
    with pytest.raises(MQError):
        await asyncio.wait_for(waiting, 5)
    await asyncio.sleep(0.2)
    other = await connect_local(qm.path)
    await other.put1("APP.Q", _md(persistence=1), b"for the next reader")
    msg = await (await other.open("APP.Q", OpenOption.INPUT_SHARED)).get(GetOptions(wait_ms=1000))
    assert msg.body == b"for the next reader"
    await other.disconnect()


async def test_one_client_too_many_is_told_2025_and_the_others_carry_on(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QMC", tmp_path / "qm")
    qm.run_mqsc("DEFINE QLOCAL(APP.Q)\n")
    server = QueueManagerServer(qm, max_clients=2)
    await server.start()
    try:
        first, second = await connect_local(qm.path), await connect_local(qm.path)
        with pytest.raises(MQError) as refused:
            await connect_local(qm.path)
        assert refused.value.reason == Reason.MAX_CONNS_LIMIT_REACHED
        await first.put1("APP.Q", _md(), b"still served")
        await second.disconnect()
        third = await connect_local(qm.path)  # a freed slot is taken again
        await third.disconnect()
        await first.disconnect()
        assert qm.queue_depth("APP.Q") == 1
    finally:
        await server.stop()
        await qm.close()


async def test_a_get_that_cannot_wait_costs_the_server_no_task(
    served: tuple[EmbeddedQueueManager, QueueManagerServer], conn: ClientConnection
) -> None:
    """A subscriber's gets under syncpoint without a wait (a batch after its first get)
    are answered straight away: no socket watch, no task per get, on the server's loop
    (the gateway's own). A waiting get is still watched
    (test_a_client_gone_during_a_waiting_get_takes_nothing)."""
    qm = served[0]
    out = await conn.open("APP.Q", OpenOption.OUTPUT)
    for i in range(50):
        await out.put(_md(persistence=1), b"m%02d" % i, PutOptions(syncpoint=True))
    await conn.commit()
    inp = await conn.open("APP.Q", OpenOption.INPUT_SHARED)
    loop = asyncio.get_running_loop()
    created: list[str] = []
    factory = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        created.append(getattr(coro, "__qualname__", repr(coro)))
        if factory is not None:
            return factory(loop, coro, **kwargs)
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(counting)
    try:
        got = [(await inp.get(GetOptions(syncpoint=True))).body for _ in range(50)]
    finally:
        loop.set_task_factory(factory)
    await conn.commit()
    assert got == [b"m%02d" % i for i in range(50)]
    assert qm.queue_depth("APP.Q") == 0
    assert created == []
