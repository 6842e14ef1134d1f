"""MQMD: defaults, lengths, byte order, character sets and faults."""

from __future__ import annotations

import struct

import pytest

from gateway.wire.constants import MsgType, Persistence, Report
from gateway.wire.errors import WireError
from gateway.wire.mqmd import MQMD, MQMD_LENGTH_1, MQMD_LENGTH_2
from gateway.wire.reasons import Reason


def test_defaults_are_ibm_initial_values() -> None:
    md = MQMD()
    assert (md.version, md.report, md.msg_type, md.expiry, md.feedback) == (1, 0, 8, -1, 0)
    assert (md.encoding, md.coded_char_set_id, md.format) == (546, 0, "")
    assert (md.priority, md.persistence, md.backout_count) == (-1, 2, 0)
    assert md.msg_id == md.correl_id == md.group_id == bytes(24)
    assert md.accounting_token == bytes(32)
    assert (md.msg_seq_number, md.offset, md.msg_flags, md.original_length) == (1, 0, 0, -1)
    assert md.length == MQMD_LENGTH_1 and MQMD(version=2).length == MQMD_LENGTH_2


@pytest.mark.parametrize(("version", "length"), [(1, 324), (2, 364)])
@pytest.mark.parametrize("encoding", [546, 273])
def test_pack_lengths_and_integer_order(version: int, length: int, encoding: int) -> None:
    md = MQMD(version=version, msg_type=MsgType.REQUEST, priority=7, expiry=600)
    data = md.pack(encoding)
    assert len(data) == length
    order = "<" if encoding == 546 else ">"
    assert struct.unpack_from(order + "i", data, 12)[0] == 1
    assert struct.unpack_from(order + "i", data, 40)[0] == 7
    assert struct.unpack_from(order + "i", data, 16)[0] == 600
    assert MQMD.unpack(data, 0, encoding) == md


def test_unpack_at_offset_and_ignores_trailing_data() -> None:
    md = MQMD(version=2, reply_to_q="R.Q", correl_id=b"\x01" * 24)
    data = b"\xff" * 7 + md.pack() + b"body"
    assert MQMD.unpack(data, 7) == md


def test_char_fields_are_blank_padded_on_the_wire() -> None:
    data = MQMD(format="MQSTR", reply_to_q_mgr="QM1", put_appl_name="app").pack()
    assert data[32:40] == b"MQSTR   "
    assert data[148:196] == b"QM1" + b" " * 45
    assert data[276:304] == b"app" + b" " * 25


def test_short_ids_are_zero_filled_and_long_ids_refused() -> None:
    data = MQMD(msg_id=b"abc").pack()
    assert data[48:72] == b"abc" + bytes(21)
    with pytest.raises(WireError) as err:
        MQMD(msg_id=b"x" * 25).pack()
    assert err.value.reason == Reason.MD_ERROR and "msg_id" in err.value.message


def test_too_long_name_is_refused_naming_the_field() -> None:
    with pytest.raises(WireError) as err:
        MQMD(reply_to_q="Q" * 49).pack()
    assert err.value.reason == Reason.MD_ERROR and "reply_to_q" in err.value.message


def test_version1_with_version2_values_is_refused_not_truncated() -> None:
    with pytest.raises(WireError) as err:
        MQMD(group_id=b"g" * 24).pack()
    assert err.value.reason == Reason.MD_ERROR
    assert len(MQMD(version=2, group_id=b"g" * 24).pack()) == 364


def test_ebcdic_descriptor_round_trip_and_autodetect() -> None:
    md = MQMD(reply_to_q="REPLY.Q", put_appl_name="CICSAPP", struc_ccsid=500)
    data = md.pack(785)
    assert data[:4] == bytes.fromhex("d4c44040")
    assert data[100:107] == "REPLY.Q".encode("cp500")
    assert data[107] == 0x40
    back = MQMD.unpack(data, 0, 785)
    assert back == md and back.struc_ccsid == 500


@pytest.mark.parametrize(
    ("mutate", "reason", "offset"),
    [
        (lambda b: b[:100], Reason.MD_ERROR, 0),
        (lambda b: b"XX  " + b[4:], Reason.MD_ERROR, 0),
        (lambda b: b[:4] + struct.pack("<i", 0) + b[8:], Reason.MD_ERROR, 4),
        (lambda b: b[:4] + struct.pack("<i", 2) + b[8:], Reason.MD_ERROR, 0),
    ],
)
def test_faults_raise_md_error_with_offset(mutate: object, reason: int, offset: int) -> None:
    data = MQMD().pack()
    with pytest.raises(WireError) as err:
        MQMD.unpack(mutate(data))  # type: ignore[operator]
    assert err.value.reason == reason and err.value.offset == offset


@pytest.mark.parametrize("encoding", [0, 3, 0x110, -16])
def test_unknown_integer_encoding_is_named(encoding: int) -> None:
    with pytest.raises(WireError) as err:
        MQMD.unpack(MQMD().pack(), 0, encoding)
    assert err.value.reason == Reason.SOURCE_INTEGER_ENC_ERROR
    assert str(encoding) in err.value.message
    with pytest.raises(WireError) as err2:
        MQMD().pack(encoding)
    assert err2.value.reason == Reason.TARGET_INTEGER_ENC_ERROR


def test_integer_out_of_range_is_a_wire_error() -> None:
    with pytest.raises(WireError) as err:
        MQMD(priority=2**31).pack()
    assert err.value.reason == Reason.MD_ERROR


def test_unsupported_structure_ccsid_is_named() -> None:
    with pytest.raises(WireError) as err:
        MQMD(struc_ccsid=933).pack()
    assert (
        err.value.reason == Reason.TARGET_CCSID_ERROR
        or err.value.reason == Reason.SOURCE_CCSID_ERROR
    )
    assert "933" in err.value.message


def test_enums_are_ibm_values() -> None:
    assert (MsgType.REQUEST, MsgType.REPLY, MsgType.REPORT, MsgType.DATAGRAM) == (1, 2, 4, 8)
    assert Persistence.PERSISTENCE_AS_Q_DEF == 2
    assert Report.PASS_CORREL_ID == 0x40 and Report.EXCEPTION_WITH_FULL_DATA == 0x7000000


def test_copy_changes_fields_without_touching_original() -> None:
    md = MQMD(reply_to_q="A")
    other = md.copy(reply_to_q="B")
    assert (md.reply_to_q, other.reply_to_q) == ("A", "B")
