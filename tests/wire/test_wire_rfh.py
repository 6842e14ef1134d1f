"""MQRFH v1: NameValueString quoting, padding, StrucLength rules and faults."""

from __future__ import annotations

import pytest

from gateway.wire.errors import WireError
from gateway.wire.reasons import Reason
from gateway.wire.rfh import (
    MQRFH,
    decode_rfh,
    encode_rfh,
    format_name_value_string,
    parse_name_value_string,
    quote_token,
)


def _rfh_bytes(nvs: bytes, length: int | None = None, version: int = 1) -> bytes:
    total = 32 + len(nvs) if length is None else length
    return (
        b"RFH "
        + version.to_bytes(4, "little")
        + total.to_bytes(4, "little")
        + (546).to_bytes(4, "little")
        + bytes(4)
        + b" " * 8
        + bytes(4)
        + nvs
    )


@pytest.mark.parametrize(
    ("token", "wire"),
    [
        ("plain", "plain"),
        ("two words", '"two words"'),
        ('say "hi"', '"say ""hi"""'),
        ('"', '""""'),
        ("", '""'),
        ("a\tb", "a\tb"),
    ],
)
def test_quote_token(token: str, wire: str) -> None:
    assert quote_token(token) == wire
    assert parse_name_value_string(f"n {wire}") == [("n", token)]


def test_multiple_blanks_are_insignificant_outside_quotes() -> None:
    assert parse_name_value_string('  a   b  c "d  e"   ') == [("a", "b"), ("c", "d  e")]


def test_nul_ends_the_string() -> None:
    assert parse_name_value_string("a b\x00c d e") == [("a", "b")]


@pytest.mark.parametrize(
    ("text", "pos"),
    [("MQPSCommand", 0), ("a b c", 4), ('a "unterminated', 2), ('a "x"y', 5)],
)
def test_string_errors_carry_the_character_position(text: str, pos: int) -> None:
    with pytest.raises(WireError) as err:
        parse_name_value_string(text)
    assert err.value.reason == Reason.RFH_STRING_ERROR and err.value.offset == pos


def test_decode_reports_string_error_offset_in_the_buffer() -> None:
    with pytest.raises(WireError) as err:
        decode_rfh(_rfh_bytes(b"MQPSCommand Publish MQPSTopic"))
    assert err.value.reason == Reason.RFH_STRING_ERROR
    assert err.value.offset == 32 + len("MQPSCommand Publish ")


def test_encode_pads_with_blanks_to_multiple_of_four() -> None:
    rfh = MQRFH(name_values=[("MQPSCommand", "Publish"), ("MQPSTopic", "a")])
    data = encode_rfh(rfh)
    nvs = "MQPSCommand Publish MQPSTopic a"
    assert len(data) == 32 + len(nvs) + 1 and data.endswith(b"a ")
    assert int.from_bytes(data[8:12], "little") == len(data)


def test_struc_length_rules() -> None:
    with pytest.raises(WireError) as err:
        decode_rfh(_rfh_bytes(b"a b", length=31))
    assert (err.value.reason, err.value.offset) == (Reason.RFH_ERROR, 8)
    with pytest.raises(WireError) as err:
        decode_rfh(_rfh_bytes(b"a b", length=100))
    assert (err.value.reason, err.value.offset) == (Reason.RFH_ERROR, 8)
    rfh, used = decode_rfh(_rfh_bytes(b"", length=32))
    assert (rfh.name_values, used) == ([], 32)


def test_version_2_is_refused_by_the_v1_decoder() -> None:
    with pytest.raises(WireError) as err:
        decode_rfh(_rfh_bytes(b"", version=2))
    assert err.value.reason == Reason.RFH_ERROR and "MQRFH2" in err.value.message


def test_ccsid_alias_and_accessors() -> None:
    rfh = MQRFH(name_values=[("MQPSRegOpts", "Anon"), ("MQPSRegOpts", "Local")])
    rfh.ccsid = 1208
    assert rfh.coded_char_set_id == 1208
    assert rfh.get("MQPSRegOpts") == "Anon" and rfh.get("nope") is None
    assert rfh.get_all("MQPSRegOpts") == ["Anon", "Local"]


@pytest.mark.parametrize("ccsid", [819, 1208, 437, 850, 500, 37, 1140])
def test_character_sets(ccsid: int) -> None:
    rfh = MQRFH(name_values=[("MQPSTopic", "Café/Zürich")], format="MQSTR")
    data = encode_rfh(rfh, 546, ccsid=ccsid)
    assert decode_rfh(data, 546, ccsid=ccsid)[0] == rfh


def test_utf16_structures_and_unknown_ccsids_are_refused() -> None:
    rfh = MQRFH(name_values=[("a", "b")])
    for ccsid in (1200, 933):
        with pytest.raises(WireError) as err:
            encode_rfh(rfh, ccsid=ccsid)
        assert err.value.reason in (Reason.SOURCE_CCSID_ERROR, Reason.TARGET_CCSID_ERROR)
        assert str(ccsid) in err.value.message


def test_invalid_utf8_is_a_ccsid_error_with_offset() -> None:
    with pytest.raises(WireError) as err:
        decode_rfh(_rfh_bytes(b"a \xff\xfe  "), ccsid=1208)
    assert err.value.reason == Reason.SOURCE_CCSID_ERROR and err.value.offset == 34


def test_character_outside_ccsid_is_named() -> None:
    with pytest.raises(WireError) as err:
        encode_rfh(MQRFH(name_values=[("t", "€")]), ccsid=819)
    assert err.value.reason == Reason.TARGET_CCSID_ERROR and "819" in err.value.message


def test_format_name_value_string_single_blank_separated() -> None:
    assert format_name_value_string([("a", "b c"), ("d", "")]) == 'a "b c" d ""'
