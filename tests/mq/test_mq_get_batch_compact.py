"""The compact ``get_batch`` reply of the queue manager's local protocol (issue 16,
bridge with a worker): one descriptor per batch and each message's changed fields
instead of a packed MQMD per message. It must give exactly the messages the packed
form gives, and refuse every malformed value a server could send."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gateway.mq.embedded import qm_server
from gateway.mq.embedded.client import connect_local
from gateway.mq.embedded.qm_protocol import (
    ProtocolError,
    decode_frame,
    encode_frame,
    frame_length,
    pack_batch,
    pack_messages,
    unpack_batch,
    unpack_messages,
)
from gateway.mq.embedded.qm_server import QueueManagerServer
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption, PutOptions
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason
from tests.support.served_qm import served_queue_manager


def _batch() -> list[tuple[MQMD, bytes]]:
    """Descriptors that share most fields, then ones that differ in every way."""
    out = [(MQMD(msg_id=os.urandom(24), format="MQGWBKLG", persistence=1, priority=0,
                 put_appl_type=6, put_appl_name="app", put_date="20261126",
                 put_time=f"1730{i:04d}", user_identifier="mqm", backout_count=i % 3),
            b"x" * (i * 7)) for i in range(20)]
    out.append((MQMD(), b""))  # every default, version 1
    out.append((MQMD(version=2, group_id=b"g" * 24, msg_seq_number=3, offset=10,
                     msg_flags=8, original_length=99, reply_to_q="R.Q  ",
                     reply_to_q_mgr="QM2", correl_id=b"c" * 24, accounting_token=b"a" * 32,
                     appl_identity_data="id", appl_origin_data="o", expiry=-1, feedback=5,
                     report=0x4000, msg_type=2, encoding=273, coded_char_set_id=819),
                 b"last"))
    out.append((MQMD(msg_id=b"\x00" * 24), b"y"))
    return out


def test_the_compact_reply_gives_what_the_packed_reply_gives() -> None:
    msgs = _batch()
    lengths, data = pack_messages(msgs)
    packed = unpack_messages(lengths, data)
    fields, body = pack_batch(msgs)
    frame = encode_frame({"ok": True, **fields}, body)  # through JSON, as on the socket
    got = decode_frame(frame[4:])
    assert frame_length(frame[:4]) == len(frame) - 4
    compact = unpack_batch(got.header, got.data)
    assert compact == packed
    assert [m.struc_ccsid for m, _ in compact] == [m.struc_ccsid for m, _ in packed]
    assert {m.version for m, _ in compact} == {2}
    assert compact[21][0].reply_to_q == "R.Q"  # blank-trimmed, as a packed field decodes
    # shared fields are sent once: the second message's changes are MsgId, time, count
    assert sorted(fields["diffs"][1][::2]) == [11, 13, 22]
    assert len(frame) < len(encode_frame({"ok": True, "lengths": lengths}, data))


def test_a_batch_of_equal_descriptors_sends_no_changes() -> None:
    md = MQMD(msg_id=b"m" * 24)
    fields, _ = pack_batch([(md, b"a"), (md, b"b"), (md, b"c")])
    assert fields["diffs"] == [[], [], []]
    assert [b for _, b in unpack_batch(fields, b"abc")] == [b"a", b"b", b"c"]


def _good() -> dict[str, Any]:
    fields, _ = pack_batch([(MQMD(msg_id=b"m" * 24), b"ab"), (MQMD(), b"c")])
    return fields


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda h: h.update(md=h["md"][:-1]), Reason.MD_ERROR),
        (lambda h: h["md"].__setitem__(0, "XX"), Reason.MD_ERROR),
        (lambda h: h["md"].__setitem__(1, 1), Reason.MD_ERROR),
        (lambda h: h["md"].__setitem__(2, True), Reason.MD_ERROR),  # bool, not an MQLONG
        (lambda h: h["md"].__setitem__(2, 2**31), Reason.MD_ERROR),
        (lambda h: h["md"].__setitem__(8, "FORMAT123"), Reason.MD_ERROR),  # CHAR8
        (lambda h: h["md"].__setitem__(11, "zz" * 24), Reason.MD_ERROR),  # not hex
        (lambda h: h["md"].__setitem__(11, "00" * 23), Reason.MD_ERROR),  # 23 bytes
        # bytes.fromhex skips whitespace: 48 characters that would make 16 bytes
        (lambda h: h["md"].__setitem__(11, "01" * 16 + " " * 16), Reason.MD_ERROR),
        (lambda h: h["md"].__setitem__(11, " 0" * 24), Reason.MD_ERROR),
        (lambda h: h.update(sizes=[2, 2]), Reason.DATA_LENGTH_ERROR),
        (lambda h: h.update(sizes=[2, -1, 2]), Reason.DATA_LENGTH_ERROR),
        (lambda h: h.update(sizes="3"), Reason.DATA_LENGTH_ERROR),
        (lambda h: h.update(diffs=[[]]), Reason.MD_ERROR),
        (lambda h: h.update(diffs=[[], [11]]), Reason.MD_ERROR),
        (lambda h: h.update(diffs=[[], {"11": 1}]), Reason.MD_ERROR),
        (lambda h: h.update(diffs=[[], [29, 1]]), Reason.MD_ERROR),
        (lambda h: h.update(diffs=[[], [-1, 1]]), Reason.MD_ERROR),
        (lambda h: h.update(diffs=[[], [0, "MD  "]]), Reason.MD_ERROR),
        (lambda h: h.update(diffs=[[], [1, 1]]), Reason.MD_ERROR),
        (lambda h: h.update(diffs=[[], [False, 1]]), Reason.MD_ERROR),
        (lambda h: h.update(diffs=[[], [13, "1"]]), Reason.MD_ERROR),
        (lambda h: h.update(diffs=[[], [11, "0" * 47 + "g"]]), Reason.MD_ERROR),
        (lambda h: h.update(diffs=[[], [11, "ab" * 16 + "\t" * 16]]), Reason.MD_ERROR),
        (lambda h: h.update(diffs=[[], [11, "ab" * 8 + " " * 32]]), Reason.MD_ERROR),
        (lambda h: h.update(diffs=[[], [11, b"x"]]), Reason.MD_ERROR),
    ],
)
def test_every_malformed_value_is_refused(change: Any, reason: int) -> None:
    header = _good()
    header["diffs"] = [list(d) for d in header["diffs"]]
    change(header)
    with pytest.raises(ProtocolError) as exc:
        unpack_batch(header, b"abc", "server")
    assert exc.value.reason == reason
    assert exc.value.who == "server"


async def test_the_client_asks_for_the_compact_form_and_others_get_the_packed_one(
    tmp_path: Path,
) -> None:
    async with served_queue_manager(tmp_path / "qm", "DEFINE QLOCAL(Q1)"):
        conn = await connect_local(tmp_path / "qm")
        h = await conn.open("Q1", OpenOption.INPUT_SHARED | OpenOption.OUTPUT)
        sent = []
        for i in range(6):
            sent.append(await h.put(MQMD(correl_id=bytes([i]) * 24, persistence=i % 2),
                                    f"m{i}".encode(), PutOptions(new_msg_id=True)))
        got = await h.get_batch(GetOptions(wait_ms=0, syncpoint=True), 10)
        assert [m.body for m in got] == [f"m{i}".encode() for i in range(6)]
        assert [m.md.msg_id for m in got] == [md.msg_id for md in sent]
        assert [m.md.correl_id for m in got] == [bytes([i]) * 24 for i in range(6)]
        assert [m.md.persistence for m in got] == [i % 2 for i in range(6)]
        assert {m.md.user_identifier for m in got} == {conn.user}
        await conn.backout()
        # a client that does not ask (an older one) still gets a packed MQMD per message
        reply, data = await conn._call({"op": "get_batch", "hobj": h._hobj, "max_msgs": 10,
                                        "options": {"wait_ms": 0, "syncpoint": True}})
        assert "sizes" not in reply
        packed = unpack_messages(reply["lengths"], data, "server")
        assert [md for md, _ in packed] == [m.md.copy(backout_count=1) for m in got]
        await conn.backout()
        await conn.disconnect()


async def test_a_compact_header_past_the_limit_is_sent_packed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(qm_server, "COMPACT_UNCHECKED_MSGS", 2)
    monkeypatch.setattr(qm_server, "COMPACT_HEADER_LIMIT", 2000)
    async with served_queue_manager(tmp_path / "qm", "DEFINE QLOCAL(Q1)"):
        conn = await connect_local(tmp_path / "qm")
        h = await conn.open("Q1", OpenOption.INPUT_SHARED | OpenOption.OUTPUT)
        for i in range(30):
            await h.put(MQMD(correl_id=bytes([i]) * 24), f"m{i}".encode(),
                        PutOptions(new_msg_id=True))
        reply, _ = await conn._call({"op": "get_batch", "hobj": h._hobj, "max_msgs": 30,
                                     "compact": True, "options": {"wait_ms": 0,
                                                                  "syncpoint": True}})
        assert "lengths" in reply and "sizes" not in reply  # 30 x ~150 bytes > 2,000
        await conn.backout()
        got = await h.get_batch(GetOptions(wait_ms=0, syncpoint=True), 30)
        assert [m.body for m in got] == [f"m{i}".encode() for i in range(30)]
        assert [m.md.correl_id for m in got] == [bytes([i]) * 24 for i in range(30)]
        with pytest.raises(MQError) as empty:  # the batch above took all 30
            await h.get_batch(GetOptions(wait_ms=0, syncpoint=True), 30)
        assert empty.value.reason == Reason.NO_MSG_AVAILABLE
        await conn.commit()
        await conn.disconnect()


def test_the_worst_descriptor_change_fits_the_unchecked_batch() -> None:
    """Every field different, at its longest, in characters JSON escapes (12 bytes
    each for a character outside the BMP): 256 such changes fit MAX_HEADER."""
    wide = "\U0001F600"
    worst = MQMD(version=2, report=-2**31, msg_type=-2**31, expiry=-2**31,
                 feedback=-2**31, encoding=-2**31, coded_char_set_id=-2**31,
                 format=wide * 8, priority=-2**31, persistence=-2**31,
                 msg_id=b"\xff" * 24, correl_id=b"\xff" * 24, backout_count=-2**31,
                 reply_to_q=wide * 48, reply_to_q_mgr=wide * 48, user_identifier=wide * 12,
                 accounting_token=b"\xff" * 32, appl_identity_data=wide * 32,
                 put_appl_type=-2**31, put_appl_name=wide * 28, put_date=wide * 8,
                 put_time=wide * 8, appl_origin_data=wide * 4, group_id=b"\xff" * 24,
                 msg_seq_number=-2**31, offset=-2**31, msg_flags=-2**31,
                 original_length=-2**31)
    n = qm_server.COMPACT_UNCHECKED_MSGS
    fields, _ = pack_batch([(worst if i % 2 else MQMD(), b"") for i in range(n)])
    frame = encode_frame({"ok": True, **fields})
    assert len(frame) - 8 <= qm_server.COMPACT_HEADER_LIMIT


async def test_a_batch_longer_than_asked_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F5: a server returning more messages than ``max_msgs`` breaks the protocol."""
    real = qm_server._get_batch_of

    async def greedy(handle: Any, req: dict[str, Any], **kw: Any) -> Any:
        return await real(handle, {**req, "max_msgs": 10}, **kw)

    monkeypatch.setattr(qm_server, "_get_batch_of", greedy)
    qm = EmbeddedQueueManager("QMB", tmp_path / "qm")
    qm.run_mqsc("DEFINE QLOCAL(Q1)\nDEFINE QLOCAL(Q2)", stop_on_error=True)
    server = QueueManagerServer(qm)
    await server.start()
    try:
        for q_name, compact in (("Q1", True), ("Q2", False)):
            conn = await connect_local(tmp_path / "qm")
            h = await conn.open(q_name, OpenOption.INPUT_SHARED | OpenOption.OUTPUT)
            for i in range(6):
                await h.put(MQMD(), f"m{i}".encode())
            with pytest.raises(MQError) as info:
                await h.get_batch(GetOptions(wait_ms=0, syncpoint=True), 2, compact=compact)
            assert info.value.reason == Reason.DATA_LENGTH_ERROR
            assert "6 messages" in str(info.value) and not conn._open
    finally:
        await server.stop()  # the refused batches' units are backed out
        try:
            assert qm.queue_depth("Q1") == qm.queue_depth("Q2") == 6
        finally:
            await qm.close()


async def test_the_compact_form_only_from_a_server_announcing_it(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QMB", tmp_path / "qm")
    qm.run_mqsc("DEFINE QLOCAL(Q1)", stop_on_error=True)
    server = QueueManagerServer(qm, features=("put_async",))
    await server.start()
    try:
        conn = await connect_local(tmp_path / "qm")
        assert "compact_batch" not in conn.features
        h = await conn.open("Q1", OpenOption.INPUT_SHARED | OpenOption.OUTPUT)
        await h.put(MQMD(), b"a")
        reply, _ = await conn._call({"op": "get_batch", "hobj": h._hobj, "max_msgs": 5,
                                     "compact": True, "options": {"wait_ms": 0}})
        assert "lengths" in reply and "sizes" not in reply
        await conn.disconnect()
    finally:
        await server.stop()
        await qm.close()
