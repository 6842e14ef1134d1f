"""MQXQH (+MQMDE), MQDLH and the header chain: wrap/unwrap helpers and faults."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.wire.chain import MAX_HEADERS, build_message, parse_message
from gateway.wire.constants import Report
from gateway.wire.dlh import (
    MQDLH,
    decode_dlh,
    encode_dlh,
    unwrap_from_dlq,
    wrap_for_dlq,
)
from gateway.wire.errors import WireError
from gateway.wire.mqmd import MQMD
from gateway.wire.mqmde import MQMDE, decode_mqmde
from gateway.wire.put_time import put_date_time
from gateway.wire.reasons import Reason
from gateway.wire.rfh import MQRFH
from gateway.wire.rfh2 import MQRFH2
from gateway.wire.xqh import MQXQH, decode_xqh, encode_xqh, unwrap_from_xmitq, wrap_for_xmitq


def _app_md(**kw: object) -> MQMD:
    base = MQMD(
        msg_type=1,
        report=Report.COA | Report.EXCEPTION | Report.PASS_CORREL_ID,
        priority=4,
        persistence=1,
        expiry=300,
        encoding=546,
        coded_char_set_id=1208,
        format="MQSTR",
        msg_id=b"M" * 24,
        correl_id=b"C" * 24,
        reply_to_q="REPLY",
        reply_to_q_mgr="QM1",
        user_identifier="alice",
        put_appl_name="app",
        backout_count=3,
    )
    return base.copy(**kw)


def test_wrap_for_xmitq_separate_md_rules() -> None:
    md = _app_md()
    sep, data = wrap_for_xmitq(md, b"hello", "APP.IN", "QM2", msg_id=b"N" * 24)
    assert sep.format == "MQXMIT" and sep.version == 2
    assert sep.report == Report.EXCEPTION | Report.PASS_CORREL_ID  # COA bits cleared
    assert (sep.msg_type, sep.priority, sep.persistence, sep.expiry) == (1, 4, 1, 300)
    assert (sep.msg_id, sep.correl_id, sep.backout_count) == (b"N" * 24, b"M" * 24, 0)
    assert (sep.encoding, sep.coded_char_set_id) == (546, 819)
    assert len(data) == 428 + 5
    xqh, _ = decode_xqh(data, sep.encoding, ccsid=sep.coded_char_set_id)
    assert (xqh.remote_q_name, xqh.remote_q_mgr_name) == ("APP.IN", "QM2")
    assert xqh.msg_desc.version == 1 and xqh.msg_desc.report == md.report
    msg = unwrap_from_xmitq(sep, data)
    assert msg.md == md.copy(backout_count=0) and msg.body == b"hello" and msg.mde is None


def test_wrap_for_xmitq_adds_mqmde_for_version2_fields() -> None:
    md = _app_md(version=2, group_id=b"G" * 24, msg_seq_number=2, msg_flags=0x08)
    sep, data = wrap_for_xmitq(md, b"x", "Q", "QM2", qmgr_encoding=273, qmgr_ccsid=500)
    assert len(data) == 428 + 72 + 1
    xqh, _ = decode_xqh(data, 273, ccsid=500)
    assert xqh.msg_desc.format == "MQHMDE"
    assert data[428:432] == bytes.fromhex("d4c4c540")  # EBCDIC 'MDE '
    mde, _ = decode_mqmde(data[428:], xqh.msg_desc.encoding, ccsid=500)
    assert (mde.format, mde.encoding, mde.coded_char_set_id) == ("MQSTR", 546, 1208)
    msg = unwrap_from_xmitq(sep, data)
    assert msg.md == md.copy(backout_count=0) and msg.body == b"x"


def test_encode_xqh_refuses_version2_values() -> None:
    with pytest.raises(WireError) as err:
        encode_xqh(MQXQH("Q", "QM", MQMD(version=2, msg_seq_number=5)))
    assert err.value.reason == Reason.XQH_ERROR and "MQMDE" in err.value.message


def test_xqh_faults() -> None:
    data = encode_xqh(MQXQH("Q", "QM"))
    with pytest.raises(WireError) as err:
        decode_xqh(data[:427])
    assert err.value.reason == Reason.XQH_ERROR
    bad = data[:108] + (2).to_bytes(4, "little") + data[112:]
    with pytest.raises(WireError) as err:
        decode_xqh(bad)
    assert (err.value.reason, err.value.offset) == (Reason.XQH_ERROR, 108)
    with pytest.raises(WireError) as err:
        unwrap_from_xmitq(MQMD(format="MQSTR"), data)
    assert err.value.reason == Reason.FORMAT_ERROR


def test_wrap_for_dlq_copies_chain_fields_and_keeps_context() -> None:
    md = _app_md()
    moment = datetime(2025, 3, 4, 5, 6, 7, 890000, tzinfo=UTC)
    dead, data = wrap_for_dlq(md, b"body", Reason.Q_FULL, "APP.IN", "QM1", "mqgw", moment=moment)
    assert dead.format == "MQDEAD" and (dead.encoding, dead.coded_char_set_id) == (546, 819)
    assert dead.msg_id == md.msg_id and dead.msg_type == md.msg_type
    assert dead.user_identifier == "alice"
    dlh, _ = decode_dlh(data)
    assert dlh == MQDLH(
        reason=2053,
        dest_q_name="APP.IN",
        dest_q_mgr_name="QM1",
        encoding=546,
        coded_char_set_id=1208,
        format="MQSTR",
        put_appl_type=7,
        put_appl_name="mqgw",
        put_date="20250304",
        put_time="05060789",
    )
    dlh2, original, body = unwrap_from_dlq(dead, data)
    assert dlh2 == dlh and original == md and body == b"body"


def test_put_date_time_format() -> None:
    assert put_date_time(datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)) == (
        "19991231",
        "23595999",
    )
    date, time = put_date_time()
    assert len(date) == 8 and len(time) == 8 and date.isdigit() and time.isdigit()


def test_dlh_faults() -> None:
    data = encode_dlh(MQDLH(reason=2085))
    for bad, offset in (
        (data[:171], 0),
        (b"DLX " + data[4:], 0),
        (data[:4] + (2).to_bytes(4, "little") + data[8:], 4),
    ):
        with pytest.raises(WireError) as err:
            decode_dlh(bad)
        assert (err.value.reason, err.value.offset) == (Reason.DLH_ERROR, offset)
    with pytest.raises(WireError) as err:
        unwrap_from_dlq(MQMD(format="MQSTR"), data)
    assert err.value.reason == Reason.FORMAT_ERROR
    with pytest.raises(WireError) as err:
        encode_dlh(MQDLH(dest_q_name="Q" * 49))
    assert err.value.reason == Reason.DLH_ERROR and "dest_q_name" in err.value.message


def test_chain_rfh2_then_rfh2_then_payload_with_inherit() -> None:
    first = MQRFH2()
    first.add_folder("mcd", {"Msd": "jms_text"})
    second = MQRFH2()
    second.add_folder("usr", {"a": "1"})
    fmt, enc, ccsid, data = build_message(
        [first, second],
        "héllo".encode("cp850"),
        "MQSTR",
        payload_ccsid=850,
        header_encoding=273,
        header_ccsid=1208,
    )
    assert (fmt, enc, ccsid) == ("MQHRF2", 273, 1208)
    assert first.format == "" and first.encoding == 546  # inputs not mutated
    parsed = parse_message(MQMD(format=fmt, encoding=enc, coded_char_set_id=ccsid), data)
    assert [h.format for h in parsed.headers] == ["MQHRF2", "MQSTR"]  # type: ignore[union-attr]
    assert parsed.header_offsets[0] == 0 and parsed.header_offsets[1] > 0
    assert parsed.text() == "héllo"
    assert parsed.all(MQRFH2)[1].get("usr", "a") == "1"


def test_chain_inherit_resolves_to_preceding_ccsid() -> None:
    rfh2 = MQRFH2(format="MQSTR", coded_char_set_id=-2, encoding=546)
    rfh2.add_folder("usr", {"a": "b"})
    from gateway.wire.rfh2 import encode_rfh2

    data = encode_rfh2(rfh2) + b"p"
    parsed = parse_message(MQMD(format="MQHRF2", coded_char_set_id=1208), data)
    assert parsed.ccsid == 1208 and parsed.payload == b"p"
    parsed0 = parse_message(MQMD(format="MQHRF2", coded_char_set_id=0), data, qmgr_ccsid=819)
    assert parsed0.ccsid == 819


def test_chain_dead_letter_of_an_rfh_message() -> None:
    fmt, enc, ccsid, data = build_message(
        [MQDLH(reason=2085, dest_q_name="X"), MQRFH(name_values=[("MQPSCommand", "Publish")])],
        b"pub",
        "MQSTR",
    )
    parsed = parse_message(MQMD(format=fmt, encoding=enc, coded_char_set_id=ccsid), data)
    dlh = parsed.first(MQDLH)
    assert dlh is not None and dlh.format == "MQHRF" and dlh.reason == 2085
    rfh = parsed.first(MQRFH)
    assert rfh is not None and rfh.get("MQPSCommand") == "Publish"
    assert parsed.first(MQXQH) is None and parsed.payload == b"pub"


def test_chain_unknown_format_is_payload_and_no_headers() -> None:
    parsed = parse_message(MQMD(format="MQADMIN", encoding=273, coded_char_set_id=37), b"\x00\x01")
    assert parsed.headers == [] and (parsed.format, parsed.encoding, parsed.ccsid) == (
        "MQADMIN",
        273,
        37,
    )
    assert build_message([], b"x", "MQSTR", payload_ccsid=1208) == ("MQSTR", 546, 1208, b"x")


def test_chain_errors_carry_offsets_relative_to_body() -> None:
    first = MQRFH2(format="MQHRF2")
    first.add_folder("usr", {"a": "b"})
    _, _, _, data = build_message([first, MQRFH2()], b"", "MQSTR")
    first_len = int.from_bytes(data[8:12], "little")
    broken = data[:first_len] + b"RFX " + data[first_len + 4 :]
    with pytest.raises(WireError) as err:
        parse_message(MQMD(format="MQHRF2"), broken)
    assert err.value.offset == first_len and "MQHRF2" in err.value.message


def test_chain_depth_is_bounded() -> None:
    headers = [MQMDE() for _ in range(MAX_HEADERS + 1)]
    fmt, enc, ccsid, data = build_message(headers, b"", "MQSTR")
    with pytest.raises(WireError) as err:
        parse_message(MQMD(format=fmt, encoding=enc, coded_char_set_id=ccsid), data)
    assert err.value.reason == Reason.HEADER_ERROR


def test_mqmde_faults() -> None:
    from gateway.wire.mqmde import encode_mqmde

    data = encode_mqmde(MQMDE())
    with pytest.raises(WireError) as err:
        decode_mqmde(data[:71])
    assert err.value.reason == Reason.MDE_ERROR
    with pytest.raises(WireError) as err:
        decode_mqmde(data[:4] + (1).to_bytes(4, "little") + data[8:])
    assert (err.value.reason, err.value.offset) == (Reason.MDE_ERROR, 4)
