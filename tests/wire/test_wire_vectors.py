"""Hex vectors: the reference's annotated TV1–TV11 plus independently derived ones.

TV* come from tests/wire/vectors/*.hex (copied from the protocol reference §8). IV*
vectors are built in this file field by field from IBM's published field tables with
plain ``int.to_bytes`` / codec calls (not through gateway.wire), so a layout mistake in
the codecs cannot also be in the expectation. See tests/wire/vectors/README.md.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.wire.chain import parse_message
from gateway.wire.dlh import MQDLH, decode_dlh, encode_dlh, unwrap_from_dlq, wrap_for_dlq
from gateway.wire.errors import WireError
from gateway.wire.folder import Element
from gateway.wire.mqmd import MQMD
from gateway.wire.mqmde import MQMDE, decode_mqmde, encode_mqmde
from gateway.wire.reasons import Reason
from gateway.wire.rfh import MQRFH, decode_rfh, encode_rfh
from gateway.wire.rfh2 import MQRFH2, decode_rfh2, encode_rfh2
from gateway.wire.xqh import MQXQH, decode_xqh, encode_xqh
from tests.wire import hexvectors


def le(n: int) -> bytes:
    return n.to_bytes(4, "little", signed=True)


def be(n: int) -> bytes:
    return n.to_bytes(4, "big", signed=True)


def chars(text: str, width: int, codec: str = "ascii", pad: bytes = b" ") -> bytes:
    raw = text.encode(codec)
    return raw + pad * (width - len(raw))


# --- TV1–TV4: MQRFH2 -------------------------------------------------------------------


def test_tv1_rfh2_publish_little_endian_decodes_and_reencodes() -> None:
    data = hexvectors.load("tv01_rfh2_publish_le")
    rfh2, used = decode_rfh2(data, 546)
    assert used == 104
    assert (rfh2.encoding, rfh2.coded_char_set_id, rfh2.format) == (546, 1208, "MQSTR")
    assert rfh2.name_value_ccsid == 1208 and rfh2.flags == 0
    assert [f.name for f in rfh2.folders] == ["psc"]
    assert rfh2.get("psc", "Command") == "Publish"
    assert rfh2.get("psc", "Topic") == "IBM/Latest"
    assert data[used:] == b"Hello"
    assert encode_rfh2(rfh2, 546) == data[:used]
    parsed = parse_message(MQMD(format="MQHRF2", encoding=546, coded_char_set_id=1208), data)
    assert parsed.payload == b"Hello" and parsed.format == "MQSTR" and parsed.ccsid == 1208


def test_tv1_built_from_scratch_matches() -> None:
    rfh2 = MQRFH2(encoding=546, coded_char_set_id=1208, format="MQSTR")
    rfh2.add_folder("psc", {"Command": "Publish", "Topic": "IBM/Latest"})
    assert encode_rfh2(rfh2, 546) + b"Hello" == hexvectors.load("tv01_rfh2_publish_le")


def test_tv2_rfh2_publish_big_endian_prefix() -> None:
    prefix = hexvectors.load("tv02_rfh2_publish_be_prefix")
    tv1 = hexvectors.load("tv01_rfh2_publish_le")
    rfh2, _ = decode_rfh2(tv1, 546)
    rfh2.encoding = 273  # TV2 is a big-endian publisher: its payload Encoding is 273 too
    encoded = encode_rfh2(rfh2, 273)
    assert encoded[: len(prefix)] == prefix
    assert encoded[0x28:] == tv1[0x28:104]  # folder bytes unchanged by integer order
    again, used = decode_rfh2(encoded, 273)
    assert again == rfh2 and used == 104


def test_tv3_two_folders_inherit_and_no_format() -> None:
    data = hexvectors.load("tv03_rfh2_two_folders_inherit")
    rfh2, used = decode_rfh2(data, 546)
    assert used == 184 == len(data)
    assert rfh2.coded_char_set_id == -2 and rfh2.format == ""
    assert [f.name for f in rfh2.folders] == ["mcd", "psc"]
    assert rfh2.get("mcd", "Msd") == "none"
    psc = rfh2.folder("psc")
    assert psc is not None
    assert psc.to_dict() == {
        "Command": "RegSub",
        "Topic": "IBM/Latest",
        "QName": "MY.SUBQ",
        "RegOpt": "PersAsPub",
    }
    assert encode_rfh2(rfh2, 546) == data


def test_tv4_pscr_ok_response() -> None:
    data = hexvectors.load("tv04_rfh2_pscr_ok")
    rfh2, used = decode_rfh2(data, 546)
    assert used == 80 and rfh2.get("pscr", "Completion") == "ok"
    built = MQRFH2(coded_char_set_id=1208)
    built.set("pscr", "Completion", "ok")
    assert encode_rfh2(built, 546) == data


# --- TV5–TV7: MQRFH v1 -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "pairs", "length"),
    [
        ("tv05_rfh1_publish", [("MQPSCommand", "Publish"), ("MQPSTopic", "IBM/Latest")], 72),
        (
            "tv05_rfh1_publish_variant1",
            [
                ("MQPSCommand", "Publish"),
                ("MQPSPubOpts", "RetainPub"),
                ("MQPSTopic", "IBM/Latest"),
            ],
            96,
        ),
    ],
)
def test_tv5_rfh1_publish(name: str, pairs: list[tuple[str, str]], length: int) -> None:
    data = hexvectors.load(name)
    rfh, used = decode_rfh(data, 546)
    assert used == length == len(data)
    assert rfh.name_values == pairs
    assert (rfh.encoding, rfh.ccsid, rfh.format) == (546, 1208, "MQSTR")
    built = MQRFH(name_values=pairs, encoding=546, coded_char_set_id=1208, format="MQSTR")
    assert encode_rfh(built, 546) == data


def test_tv6_rfh1_quoted_topic_with_doubled_quotes() -> None:
    data = hexvectors.load("tv06_rfh1_regsub_quoted")
    rfh, used = decode_rfh(data, 546)
    assert used == 144
    assert rfh.get("MQPSTopic") == 'Sport "Live" Scores'
    assert rfh.get_all("MQPSRegOpts") == ["NewPubsOnly", "Local"]
    assert encode_rfh(rfh, 546) == data


def test_tv7_rfh1_ok_response() -> None:
    data = hexvectors.load("tv07_rfh1_response_ok")
    rfh, used = decode_rfh(data, 546)
    assert used == 84
    assert rfh.name_values == [
        ("MQPSCompCode", "0"),
        ("MQPSReason", "0"),
        ("MQPSReasonText", "MQRC_NONE"),
    ]
    assert encode_rfh(rfh, 546) == data


# --- TV8: MQDLH --------------------------------------------------------------------------


def test_tv8_dlh_unknown_object_name() -> None:
    data = hexvectors.load("tv08_dlh_2085")
    dlh, used = decode_dlh(data, 546)
    assert used == 172 == len(data)
    assert dlh == MQDLH(
        reason=Reason.UNKNOWN_OBJECT_NAME,
        dest_q_name="APP.IN",
        dest_q_mgr_name="QM2",
        encoding=546,
        coded_char_set_id=1208,
        format="MQSTR",
        put_appl_type=6,
        put_appl_name="amqrmppa",
        put_date="20240102",
        put_time="03040506",
    )
    assert encode_dlh(dlh, 546) == data


def test_tv8_via_wrap_for_dlq() -> None:
    md = MQMD(encoding=546, coded_char_set_id=1208, format="MQSTR")
    moment = datetime(2024, 1, 2, 3, 4, 5, 60000, tzinfo=UTC)
    new_md, body = wrap_for_dlq(
        md, b"payload", 2085, "APP.IN", "QM2", "amqrmppa", put_appl_type=6, moment=moment
    )
    assert body == hexvectors.load("tv08_dlh_2085") + b"payload"
    assert new_md.format == "MQDEAD"
    dlh, original, rest = unwrap_from_dlq(new_md, body)
    assert dlh.reason == 2085 and original == md and rest == b"payload"


# --- TV9–TV11: MQMD / MQXQH ------------------------------------------------------------


def test_tv9_mqmd_v1_defaults() -> None:
    data = hexvectors.load("tv09_mqmd_v1_defaults_le")
    assert len(data) == 324
    assert MQMD().pack(546) == data
    assert MQMD.unpack(data, 0, 546) == MQMD()


def test_tv10_xqh_prefix_and_embedded_md() -> None:
    md = MQMD(
        msg_type=8,
        encoding=546,
        coded_char_set_id=1208,
        format="MQSTR",
        priority=0,
        persistence=0,
        reply_to_q_mgr="QM1",
        user_identifier="app",
        put_appl_type=6,
        put_appl_name="pubapp",
        put_date="20240102",
        put_time="03040506",
    )
    encoded = encode_xqh(MQXQH("APP.IN", "QM2", md), 546)
    assert len(encoded) == 428
    ((off, expected),) = hexvectors.load_segments("tv10_xqh_prefix")
    assert encoded[off : off + len(expected)] == expected
    xqh, used = decode_xqh(encoded, 546)
    assert used == 428 and xqh.msg_desc == md and xqh.remote_q_mgr_name == "QM2"


def test_tv11_mqmd_v2_tail_big_endian() -> None:
    ((off, expected),) = hexvectors.load_segments("tv11_mqmd_v2_tail_be")
    packed = MQMD(version=2).pack(273)
    assert len(packed) == 364
    assert packed[off:] == expected


# --- Independently derived vectors ------------------------------------------------------


def _iv1_dlh_big_endian() -> bytes:
    # MQDLH field table (IBM q096130): modelled on the AIX DLQ dump cited in the reference
    # §6.3 — big-endian DLH, Reason 2085, original data Encoding 546 / CCSID 850 / MQSTR.
    return (
        b"DLH "
        + be(1)
        + be(2085)
        + chars("ASDF2", 48)
        + chars("QMAIX", 48)
        + be(546)
        + be(850)
        + chars("MQSTR", 8)
        + be(6)
        + chars("amqcrsta", 28)
        + chars("20020115", 8)
        + chars("10305912", 8)
    )


def test_iv1_dlh_big_endian_from_field_table() -> None:
    data = _iv1_dlh_big_endian()
    assert len(data) == 172
    dlh, _ = decode_dlh(data, 273, ccsid=819)
    assert (dlh.reason, dlh.dest_q_name, dlh.encoding, dlh.coded_char_set_id) == (
        2085,
        "ASDF2",
        546,
        850,
    )
    assert encode_dlh(dlh, 273, ccsid=819) == data
    md = MQMD(encoding=546, coded_char_set_id=850, format="MQSTR", put_appl_type=11)
    moment = datetime(2002, 1, 15, 10, 30, 59, 120000, tzinfo=UTC)
    dead_md, body = wrap_for_dlq(
        md,
        b"x",
        2085,
        "ASDF2",
        "QMAIX",
        "amqcrsta",
        put_appl_type=6,
        moment=moment,
        qmgr_encoding=273,
        qmgr_ccsid=819,
    )
    assert body == data + b"x"
    # As in the dump: MQMD Encoding 273, CCSID 819, Format MQDEAD, MsgType and context kept.
    assert (dead_md.encoding, dead_md.coded_char_set_id, dead_md.format) == (273, 819, "MQDEAD")
    assert dead_md.msg_type == 8 and dead_md.put_appl_type == 11


def _iv2_rfh1_ebcdic_s390() -> bytes:
    # MQRFH field table (q099070) in EBCDIC CCSID 500 with MQENC_S390 (785 → big-endian
    # integers), as a z/OS publisher would send it. Text 33 chars + 3 EBCDIC blanks (0x40).
    text = "MQPSCommand Publish MQPSTopic A/B"
    nvs = text.encode("cp500") + b"\x40" * 3
    return (
        "RFH ".encode("cp500")
        + be(1)
        + be(32 + len(nvs))
        + be(785)
        + be(500)
        + "MQSTR   ".encode("cp500")
        + be(0)
        + nvs
    )


def test_iv2_rfh1_ebcdic_s390_encoding() -> None:
    data = _iv2_rfh1_ebcdic_s390()
    assert data[:4] == bytes.fromhex("d9c6c840")  # EBCDIC 'RFH ' per the reference §1.2
    rfh, used = decode_rfh(data, 785, ccsid=500)
    assert used == 68
    assert rfh.name_values == [("MQPSCommand", "Publish"), ("MQPSTopic", "A/B")]
    assert (rfh.encoding, rfh.ccsid, rfh.format) == (785, 500, "MQSTR")
    assert encode_rfh(rfh, 785, ccsid=500) == data
    # Without a CCSID hint the EBCDIC StrucId is recognised.
    assert decode_rfh(data, 785)[0] == rfh


@pytest.mark.parametrize(
    ("encoding", "order", "codec"), [(546, "little", "utf-16-le"), (273, "big", "utf-16-be")]
)
def test_iv3_rfh2_utf16_name_value_data(encoding: int, order: str, codec: str) -> None:
    # NameValueCCSID 1200: NameValueData is UTF-16 in the header's integer byte order
    # (q099310). Folder 30 chars = 60 bytes (multiple of 4, no pad).
    folder = "<usr><Colour>Grün</Colour></usr>"
    nvd = folder.encode(codec)
    nvd += " ".encode(codec) * ((-len(nvd) % 4) // 2)

    def i(n: int) -> bytes:
        return n.to_bytes(4, order, signed=True)  # type: ignore[arg-type]

    data = (
        b"RFH "
        + i(2)
        + i(36 + 4 + len(nvd))
        + i(encoding)
        + i(1208)
        + b"MQSTR   "
        + i(0)
        + i(1200)
        + i(len(nvd))
        + nvd
    )
    rfh2, used = decode_rfh2(data, encoding)
    assert used == len(data)
    assert rfh2.name_value_ccsid == 1200
    assert rfh2.get("usr", "Colour") == "Grün"
    assert encode_rfh2(rfh2, encoding) == data


def _iv4_mqmde_le() -> bytes:
    # MQMDE layout (q097790 / reference §6.2): a message in a group, segment 3.
    return (
        b"MDE "
        + le(2)
        + le(72)
        + le(546)
        + le(1208)
        + b"MQSTR   "
        + le(0)
        + bytes(range(1, 25))
        + le(3)
        + le(100)
        + le(0x08 | 0x02)
        + le(4096)
    )


def test_iv4_mqmde() -> None:
    data = _iv4_mqmde_le()
    mde, used = decode_mqmde(data, 546)
    assert used == 72
    assert mde == MQMDE(
        encoding=546,
        coded_char_set_id=1208,
        format="MQSTR",
        group_id=bytes(range(1, 25)),
        msg_seq_number=3,
        offset=100,
        msg_flags=0x0A,
        original_length=4096,
    )
    assert encode_mqmde(mde, 546) == data


def test_iv5_nul_padded_mqmd_as_c_and_pymqi_write_it() -> None:
    # C MQMD_DEFAULT / pymqi pack names with NULs: the decoder must read them as blanks.
    data = (
        b"MD  "
        + le(1)
        + le(0)
        + le(8)
        + le(-1)
        + le(0)
        + le(546)
        + le(0)
        + chars("", 8)
        + le(-1)
        + le(2)
        + bytes(48)
        + le(0)
        + chars("REPLY.Q", 48, pad=b"\0")
        + bytes(48)
        + bytes(12)
        + bytes(32)
        + bytes(32)
        + le(0)
        + chars("app", 28, pad=b"\0")
        + bytes(8)
        + bytes(8)
        + bytes(4)
    )
    assert len(data) == 324
    md = MQMD.unpack(data)
    assert md == MQMD(reply_to_q="REPLY.Q", put_appl_name="app")
    # Re-encoding gives MQ's canonical blank padding.
    assert md.pack()[100:148] == chars("REPLY.Q", 48)


def test_iv6_rfh1_nul_terminated_and_unaligned_length() -> None:
    # StrucLength need not be a multiple of 4 on input (IBM i: "recommended"); a NUL ends
    # the NameValueString and whatever follows it up to StrucLength is ignored.
    nvs = b"MQPSCommand DeletePub MQPSTopic x\x00junk"
    data = b"RFH " + le(1) + le(32 + len(nvs)) + le(546) + le(0) + b" " * 8 + le(0) + nvs
    rfh, used = decode_rfh(data + b"PAYLOAD", 546)
    assert used == 32 + len(nvs)
    assert rfh.name_values == [("MQPSCommand", "DeletePub"), ("MQPSTopic", "x")]


def test_iv7_xqh_with_mqmde_chain() -> None:
    app_md_v1 = (
        b"MD  "
        + le(1)
        + le(0)
        + le(8)
        + le(-1)
        + le(0)
        + le(546)
        + le(819)
        + b"MQHMDE  "
        + le(0)
        + le(1)
        + b"\x11" * 24
        + bytes(24)
        + le(0)
        + chars("", 48)
        + chars("", 48)
        + chars("", 12)
        + bytes(32)
        + chars("", 32)
        + le(0)
        + chars("", 28)
        + chars("", 8)
        + chars("", 8)
        + chars("", 4)
    )
    data = (
        b"XQH "
        + le(1)
        + chars("APP.IN", 48)
        + chars("QM2", 48)
        + app_md_v1
        + _iv4_mqmde_le()
        + b"seg"
    )
    parsed = parse_message(MQMD(format="MQXMIT", encoding=546, coded_char_set_id=819), data)
    assert [type(h).__name__ for h in parsed.headers] == ["MQXQH", "MQMDE"]
    assert parsed.header_offsets == [0, 428]
    assert parsed.payload == b"seg" and parsed.format == "MQSTR" and parsed.ccsid == 1208
    xqh = parsed.first(MQXQH)
    assert xqh is not None and xqh.msg_desc.msg_id == b"\x11" * 24


def test_folder_builder_equals_parsed_vector() -> None:
    built = Element.from_pairs("psc", [("Command", "Publish"), ("Topic", "IBM/Latest")])
    parsed, _ = decode_rfh2(hexvectors.load("tv01_rfh2_publish_le"), 546)
    assert parsed.folders == [built]


def test_vector_garbled_struc_id_is_a_wire_error() -> None:
    data = bytearray(hexvectors.load("tv01_rfh2_publish_le"))
    data[0:4] = b"RFX "
    with pytest.raises(WireError) as err:
        decode_rfh2(bytes(data), 546)
    assert err.value.reason == Reason.RFH_ERROR and err.value.offset == 0
