"""PCF codec: golden bytes laid out by hand from the reference, faults, round trips, fuzz."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.wire.errors import WireError
from gateway.wire.pcf import (
    MQCACF_STREAM_NAME,
    MQCACF_SUPPORTED_STREAM_NAME,
    MQCFC_LAST,
    MQCFC_NOT_LAST,
    MQCFT_COMMAND,
    MQCFT_RESPONSE,
    MQCMD_PUBLISH,
    MQIACF_PUBLICATION_OPTIONS,
    IntParam,
    PCFHeader,
    PCFParam,
    StringListParam,
    StringParam,
    decode_pcf,
    encode_pcf,
)
from gateway.wire.reasons import Reason
from tests.wire import strategies as s

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def le(*words: int) -> bytes:
    """MQLONGs little-endian (MQENC_NATIVE / reversed), written out by hand."""
    return b"".join(w.to_bytes(4, "little", signed=True) for w in words)


def be(*words: int) -> bytes:
    """MQLONGs big-endian (MQENC_NORMAL)."""
    return b"".join(w.to_bytes(4, "big", signed=True) for w in words)


HEADER = PCFHeader(type=MQCFT_COMMAND, command=MQCMD_PUBLISH)
PARAMS: list[PCFParam] = [
    IntParam(MQIACF_PUBLICATION_OPTIONS, 2),
    StringParam(MQCACF_STREAM_NAME, "SYSTEM.BROKER.ADMIN.STREAM"),
    StringListParam(MQCACF_SUPPORTED_STREAM_NAME, ["A", "BBB"]),
]


def golden() -> tuple[bytes, bytes]:
    """The same message in both byte orders, field by field from the reference layouts:
    MQCFH (36), MQCFIN (16), MQCFST (20 + 26 characters + 2 padding = 48),
    MQCFSL (24 + 2 x 3 characters + 2 padding = 32)."""
    text = b"SYSTEM.BROKER.ADMIN.STREAM"
    strings = b"A  BBB"
    out = []
    for w in (le, be):
        out.append(
            # MQCFH: Type, StrucLength, Version, Command, MsgSeqNumber, Control, CompCode,
            # Reason, ParameterCount
            w(1, 36, 1, 63, 1, 1, 0, 0, 3)
            # MQCFIN: Type, StrucLength, Parameter (MQIACF_PUBLICATION_OPTIONS), Value
            + w(3, 16, 1082, 2)
            # MQCFST: Type, StrucLength, Parameter (MQCACF_STREAM_NAME), CCSID, StringLength
            + w(4, 48, 3030, 0, 26)
            + text
            + b"\x00\x00"
            # MQCFSL: Type, StrucLength, Parameter, CCSID, Count, StringLength
            + w(6, 32, 3036, 0, 2, 3)
            + strings
            + b"\x00\x00"
        )
    return out[0], out[1]


def test_golden_bytes_native_and_normal_encodings() -> None:
    little, big = golden()
    assert len(little) == 36 + 16 + 48 + 32
    assert encode_pcf(HEADER, PARAMS) == little
    assert encode_pcf(HEADER, PARAMS, 546) == little
    assert encode_pcf(HEADER, PARAMS, 273) == big
    header, params = decode_pcf(little)
    assert header == HEADER and header.parameter_count == 3
    assert params == PARAMS
    assert decode_pcf(big, 273) == (HEADER, PARAMS)


def test_header_fields_land_at_their_offsets() -> None:
    header = PCFHeader(
        type=MQCFT_RESPONSE,
        command=65,
        msg_seq_number=7,
        control=MQCFC_NOT_LAST,
        comp_code=2,
        reason=3071,
        version=3,
    )
    data = encode_pcf(header, [], 273)
    assert data == be(2, 36, 3, 65, 7, 0, 2, 3071, 0)
    assert decode_pcf(data, 273)[0] == header


def test_string_ccsid_field_chooses_the_text_encoding() -> None:
    # CCSID 500 (EBCDIC) in the structure overrides the governing ASCII CCSID.
    param = StringParam(3031, "AB", ccsid=500)
    data = encode_pcf(PCFHeader(), [param], 546, ccsid=819)
    assert data[36:] == le(4, 24, 3031, 500, 2) + b"\xc1\xc2\x00\x00"
    assert decode_pcf(data, 546, ccsid=819)[1] == [param]
    # UTF-16 follows the integer byte order.
    utf16 = StringParam(3031, "é", ccsid=1200)
    assert encode_pcf(PCFHeader(), [utf16], 273)[36 + 20 : 36 + 22] == b"\x00\xe9"
    assert decode_pcf(encode_pcf(PCFHeader(), [utf16], 273), 273)[1] == [utf16]


def test_string_value_is_exact_but_list_values_lose_padding_blanks() -> None:
    exact = StringParam(3031, "QM1  \x00 ")
    assert decode_pcf(encode_pcf(PCFHeader(), [exact]))[1] == [exact]
    padded = StringListParam(3036, ["S1  ", "STREAM2"])
    assert decode_pcf(encode_pcf(PCFHeader(), [padded]))[1] == [
        StringListParam(3036, ["S1", "STREAM2"])
    ]


def test_empty_list_and_empty_strings() -> None:
    params: list[PCFParam] = [StringListParam(3036, []), StringListParam(3040, ["", ""])]
    data = encode_pcf(PCFHeader(), params)
    assert data[36:] == le(6, 24, 3036, 0, 0, 0) + le(6, 24, 3040, 0, 2, 0)
    assert decode_pcf(data)[1] == params


def _message(*parts: bytes, count: int) -> bytes:
    return le(1, 36, 1, 63, 1, 1, 0, 0, count) + b"".join(parts)


@pytest.mark.parametrize(
    ("data", "reason", "offset"),
    [
        (b"", Reason.CFH_LENGTH_ERROR, 0),
        (le(1, 36, 1, 63, 1, 1, 0, 0), Reason.CFH_LENGTH_ERROR, 0),
        (le(3, 36, 1, 63, 1, 1, 0, 0, 0), Reason.CFH_TYPE_ERROR, 0),
        (le(1, 32, 1, 63, 1, 1, 0, 0, 0), Reason.CFH_LENGTH_ERROR, 4),
        (le(1, 36, 4, 63, 1, 1, 0, 0, 0), Reason.CFH_VERSION_ERROR, 8),
        (le(1, 36, 1, 63, 1, 1, 0, 0, -1), Reason.CFH_PARM_COUNT_ERROR, 32),
        (_message(count=1), Reason.MSG_LENGTH_ERROR, 36),
        (_message(le(3, 16, 1082, 2), b"\x00" * 4, count=1), Reason.MSG_LENGTH_ERROR, 52),
        (_message(le(3, 20, 1082, 2, 0), count=1), Reason.CFIN_LENGTH_ERROR, 40),
        (_message(le(3, 16, 1082), count=1), Reason.CFIN_LENGTH_ERROR, 40),
        (_message(le(5, 16, 1, 0), count=1), Reason.STRUCTURE_TYPE_ERROR, 36),
        (_message(le(4, 16, 3030, 0), count=1), Reason.CFST_LENGTH_ERROR, 40),
        (_message(le(4, 24, 3030, 0, 4), count=1), Reason.CFST_LENGTH_ERROR, 40),
        (_message(le(4, 24, 3030, 0, 5), b"ABCD", count=1), Reason.CFST_STRING_LENGTH_ERR, 52),
        (_message(le(4, 24, 3030, 0, -1), b"ABCD", count=1), Reason.CFST_STRING_LENGTH_ERR, 52),
        (_message(le(4, 24, 3030, 1200, 3), b"ABCD", count=1), Reason.SOURCE_CCSID_ERROR, 58),
        (_message(le(4, 24, 3030, 4242, 1), b"ABCD", count=1), Reason.SOURCE_CCSID_ERROR, -1),
        (_message(le(6, 20, 3036, 0, 0), count=1), Reason.CFSL_LENGTH_ERROR, 40),
        (_message(le(6, 24, 3036, 0, -1, 0), count=1), Reason.CFSL_COUNT_ERROR, 52),
        (_message(le(6, 24, 3036, 0, 10**6, 0), count=1), Reason.CFSL_COUNT_ERROR, 52),
        (_message(le(6, 28, 3036, 0, 2, 3), b"ABCD", count=1), Reason.CFSL_STRING_LENGTH_ERR, 56),
        (_message(le(6, 28, 3036, 0, 1, -4), b"ABCD", count=1), Reason.CFSL_STRING_LENGTH_ERR, 56),
        (_message(le(6, 32, 3036, 0, 1, 4), b"ABCD", count=1), Reason.CFSL_LENGTH_ERROR, 40),
    ],
)
def test_malformed_pcf_is_refused_with_reason_and_offset(
    data: bytes, reason: int, offset: int
) -> None:
    with pytest.raises(WireError) as info:
        decode_pcf(data)
    assert (info.value.reason, info.value.offset) == (reason, offset)
    # every fault is a named Reason (MQRCCF_* for structure faults); the text says which
    name = Reason(reason).ibm_name
    assert name.startswith("MQRCCF_" if reason > 3000 else "MQRC_") and name in str(info.value)


def test_unsupported_encoding_and_out_of_range_values() -> None:
    with pytest.raises(WireError) as info:
        decode_pcf(golden()[0], 0)
    assert info.value.reason == Reason.SOURCE_INTEGER_ENC_ERROR
    with pytest.raises(WireError) as info:
        encode_pcf(PCFHeader(command=2**31), [])
    assert info.value.reason == Reason.PCF_ERROR
    with pytest.raises(WireError) as info:
        encode_pcf(PCFHeader(), [IntParam(1082, -(2**31) - 1)])
    assert info.value.reason == Reason.PCF_ERROR
    with pytest.raises(WireError) as info:
        encode_pcf(PCFHeader(), [StringParam(3031, "€", ccsid=819)])
    assert info.value.reason == Reason.TARGET_CCSID_ERROR
    for bad in (PCFHeader(type=3), PCFHeader(version=4)):
        with pytest.raises(WireError) as info:
            encode_pcf(bad, [])
        assert info.value.reason == Reason.CFH_TYPE_ERROR


# --- properties -------------------------------------------------------------------------

#: Text every supported single-byte CCSID can carry (the hypothesis tests pick the CCSID).
_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60)
_unicode = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)


@st.composite
def headers(draw: st.DrawFn) -> PCFHeader:
    return PCFHeader(
        type=draw(st.sampled_from([1, 2, 7, 8, 10, 12, 16, 21, 22, 26])),
        command=draw(s.INT32),
        msg_seq_number=draw(s.INT32),
        control=draw(st.sampled_from([MQCFC_LAST, MQCFC_NOT_LAST])),
        comp_code=draw(s.INT32),
        reason=draw(s.INT32),
        version=draw(st.sampled_from([1, 2, 3])),
    )


@st.composite
def params(draw: st.DrawFn) -> PCFParam:
    kind = draw(st.sampled_from(["int", "str", "utf8", "list"]))
    parameter = draw(s.INT32)
    if kind == "int":
        return IntParam(parameter, draw(s.INT32))
    if kind == "str":
        return StringParam(parameter, draw(_text), draw(st.sampled_from([0, 819, 437, 500])))
    if kind == "utf8":
        return StringParam(parameter, draw(_unicode), draw(st.sampled_from([1208, 1200])))
    values = draw(st.lists(_text.map(lambda t: t.rstrip(" ")), max_size=6))
    return StringListParam(parameter, values, draw(st.sampled_from([0, 819, 1208, 37])))


@PROPS
@given(
    header=headers(),
    plist=st.lists(params(), max_size=8),
    encoding=st.sampled_from([546, 273, 785, 0x12, 0x21]),
    ccsid=st.sampled_from([0, 819, 1208, 500]),
)
def test_pcf_round_trip(
    header: PCFHeader, plist: list[PCFParam], encoding: int, ccsid: int
) -> None:
    data = encode_pcf(header, plist, encoding, ccsid=ccsid)
    assert len(data) % 4 == 0
    decoded_header, decoded = decode_pcf(data, encoding, ccsid=ccsid)
    assert decoded_header == header and decoded_header.parameter_count == len(plist)
    assert decoded == plist


@PROPS
@given(data=st.binary(max_size=200), encoding=st.sampled_from([546, 273]))
@example(data=le(1, 36, 1, 63, 1, 1, 0, 0, 2**31 - 1), encoding=546)
@example(data=le(1, 36, 1, 63, 1, 1, 0, 0, 1) + le(6, 24, 1, 0, 2**31 - 1, 0), encoding=546)
@example(data=le(1, 36, 1, 63, 1, 1, 0, 0, 1) + le(6, 24, 1, 0, 2**30, 2**3), encoding=546)
def test_arbitrary_bytes_raise_only_wire_error(data: bytes, encoding: int) -> None:
    _decode_or_wire_error(data, encoding)


def _decode_or_wire_error(data: bytes, encoding: int) -> None:
    """Decoding either raises WireError or gives values that survive a re-encoding."""
    try:
        header, plist = decode_pcf(data, encoding)
    except WireError:
        return
    assert decode_pcf(encode_pcf(header, plist, encoding), encoding) == (header, plist)


@PROPS
@given(
    prefix=st.sampled_from([le(1, 36, 1, 63, 1, 1, 0, 0, 3), be(1, 36, 1, 63, 1, 1, 0, 0, 3)]),
    tail=st.binary(max_size=120),
)
def test_valid_header_then_garbage_raises_only_wire_error(prefix: bytes, tail: bytes) -> None:
    for encoding in (546, 273):
        _decode_or_wire_error(prefix + tail, encoding)


def test_every_truncation_and_byte_flip_of_a_valid_message_raises_only_wire_error() -> None:
    rng = random.Random(13)
    for data, encoding in zip(golden(), (546, 273), strict=True):
        for cut in range(len(data)):
            with pytest.raises(WireError):
                decode_pcf(data[:cut], encoding)
        for _ in range(2000):
            mutated = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            _decode_or_wire_error(bytes(mutated), encoding)
