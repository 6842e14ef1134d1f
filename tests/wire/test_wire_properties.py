"""Property tests: encode∘decode is the identity; arbitrary bytes raise only WireError."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.wire.chain import build_message, parse_message
from gateway.wire.dlh import MQDLH, decode_dlh, encode_dlh, unwrap_from_dlq, wrap_for_dlq
from gateway.wire.errors import WireError
from gateway.wire.folder import parse_folder, serialize_folder
from gateway.wire.mqmd import MQMD
from gateway.wire.mqmde import decode_mqmde, encode_mqmde
from gateway.wire.rfh import (
    decode_rfh,
    encode_rfh,
    format_name_value_string,
    parse_name_value_string,
)
from gateway.wire.rfh2 import MQRFH2, decode_rfh2, encode_rfh2
from gateway.wire.xqh import decode_xqh, encode_xqh, unwrap_from_xmitq, wrap_for_xmitq
from tests.wire import strategies as s

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(md=s.mqmds(), encoding=s.ENCODINGS, ccsid=s.STRUCT_CCSIDS)
def test_mqmd_round_trip(md: MQMD, encoding: int, ccsid: int) -> None:
    md.struc_ccsid = ccsid
    data = md.pack(encoding)
    assert len(data) == (324 if md.version == 1 else 364)
    assert MQMD.unpack(data, 0, encoding, ccsid) == md


@PROPS
@given(rfh=s.rfhs(), encoding=s.ENCODINGS, ccsid=st.sampled_from([0, 819, 1208, 850]))
def test_rfh_round_trip(rfh: Any, encoding: int, ccsid: int) -> None:
    if ccsid == 850:  # restrict to characters CCSID 850 has
        rfh.name_values = [
            (
                n.encode("cp850", "ignore").decode("cp850"),
                v.encode("cp850", "ignore").decode("cp850"),
            )
            for n, v in rfh.name_values
        ]
    data = encode_rfh(rfh, encoding, ccsid=ccsid)
    assert len(data) % 4 == 0
    decoded, used = decode_rfh(data + b"trailing payload", encoding, ccsid=ccsid)
    assert used == len(data)
    assert decoded == rfh


@PROPS
@given(pairs=st.lists(st.tuples(s.nv_token, s.nv_token), max_size=10))
@example(pairs=[("a", ""), ('"', '""'), (" ", "x y")])
def test_name_value_string_round_trip(pairs: list[tuple[str, str]]) -> None:
    assert parse_name_value_string(format_name_value_string(pairs)) == pairs


@PROPS
@given(rfh2=s.rfh2s(), encoding=s.ENCODINGS, ccsid=st.sampled_from([0, 819, 1208, 500]))
def test_rfh2_round_trip(rfh2: MQRFH2, encoding: int, ccsid: int) -> None:
    data = encode_rfh2(rfh2, encoding, ccsid=ccsid)
    assert len(data) % 4 == 0
    decoded, used = decode_rfh2(data + b"payload", encoding, ccsid=ccsid)
    assert used == len(data)
    assert decoded == rfh2


@PROPS
@given(folder=s.elements())
def test_folder_serialize_parse_round_trip(folder: Any) -> None:
    assert parse_folder(serialize_folder(folder)) == folder


@PROPS
@given(dlh=s.dlhs(), encoding=s.ENCODINGS, ccsid=s.STRUCT_CCSIDS)
def test_dlh_round_trip(dlh: MQDLH, encoding: int, ccsid: int) -> None:
    data = encode_dlh(dlh, encoding, ccsid=ccsid)
    assert len(data) == 172
    assert decode_dlh(data, encoding, ccsid=ccsid) == (dlh, 172)


@PROPS
@given(mde=s.mqmdes(), encoding=s.ENCODINGS, ccsid=s.STRUCT_CCSIDS)
def test_mqmde_round_trip(mde: Any, encoding: int, ccsid: int) -> None:
    data = encode_mqmde(mde, encoding, ccsid=ccsid)
    assert decode_mqmde(data, encoding, ccsid=ccsid) == (mde, 72)


@PROPS
@given(xqh=s.xqhs(), encoding=s.ENCODINGS, ccsid=s.STRUCT_CCSIDS)
def test_xqh_round_trip(xqh: Any, encoding: int, ccsid: int) -> None:
    xqh.msg_desc.struc_ccsid = ccsid
    data = encode_xqh(xqh, encoding, ccsid=ccsid)
    assert len(data) == 428
    assert decode_xqh(data, encoding, ccsid=ccsid) == (xqh, 428)


@PROPS
@given(md=s.mqmds(), body=st.binary(max_size=64), encoding=st.sampled_from([546, 273]))
def test_xmitq_wrap_unwrap_restores_the_message(md: MQMD, body: bytes, encoding: int) -> None:
    md.encoding = encoding
    separate, data = wrap_for_xmitq(md, body, "Q", "QM", qmgr_encoding=encoding)
    assert separate.format == "MQXMIT" and separate.correl_id == md.msg_id
    msg = unwrap_from_xmitq(separate, data)
    expected = md.copy(version=2 if md.has_v2_values() else 1, backout_count=0)
    assert (msg.remote_q_name, msg.remote_q_mgr_name, msg.body) == ("Q", "QM", body)
    assert msg.md == expected


@PROPS
@given(md=s.mqmds(), body=st.binary(max_size=64), reason=s.INT32)
def test_dlq_wrap_unwrap_restores_the_message(md: MQMD, body: bytes, reason: int) -> None:
    dead, data = wrap_for_dlq(md, body, reason, "DEST.Q", "QM", "gateway")
    dlh, original, rest = unwrap_from_dlq(dead, data)
    assert (dlh.reason, original, rest) == (reason, md, body)


@PROPS
@given(
    headers=st.lists(st.one_of(s.rfhs(), s.rfh2s(), s.dlhs(), s.mqmdes()), max_size=4),
    payload=st.binary(max_size=64),
    encoding=st.sampled_from([546, 273]),
)
def test_build_then_parse_message(headers: list[Any], payload: bytes, encoding: int) -> None:
    fmt, enc, ccsid, data = build_message(
        headers,
        payload,
        "MQSTR",
        payload_encoding=546,
        payload_ccsid=1208,
        header_encoding=encoding,
        header_ccsid=819,
    )
    parsed = parse_message(MQMD(format=fmt, encoding=enc, coded_char_set_id=ccsid), data)
    assert parsed.payload == payload
    assert (parsed.format, parsed.encoding, parsed.ccsid) == ("MQSTR", 546, 1208)
    assert [type(h) for h in parsed.headers] == [type(h) for h in headers]
    for original, got in zip(headers, parsed.headers, strict=True):
        if hasattr(original, "name_values"):
            assert got.name_values == original.name_values
        if hasattr(original, "folders"):
            assert got.folders == original.folders


# --- arbitrary bytes: only WireError -------------------------------------------------

DECODERS: dict[str, Callable[..., object]] = {
    "mqmd": lambda b, e, c: MQMD.unpack(b, 0, e, c),
    "rfh": lambda b, e, c: decode_rfh(b, e, ccsid=c),
    "rfh2": lambda b, e, c: decode_rfh2(b, e, ccsid=c),
    "xqh": lambda b, e, c: decode_xqh(b, e, ccsid=c),
    "dlh": lambda b, e, c: decode_dlh(b, e, ccsid=c),
    "mqmde": lambda b, e, c: decode_mqmde(b, e, ccsid=c),
    "folder": lambda b, e, c: parse_folder(b.decode("latin-1")),
    "chain": lambda b, e, c: parse_message(
        MQMD(
            format=["MQHRF2", "MQHRF", "MQXMIT", "MQDEAD", "MQHMDE"][e % 5],
            encoding=e,
            coded_char_set_id=c,
        ),
        b,
    ),
}

_PREFIXES = [
    b"",
    b"RFH \x02\x00\x00\x00",
    b"RFH \x01\x00\x00\x00",
    b"MD  \x02\x00\x00\x00",
    b"XQH \x01\x00\x00\x00",
    b"DLH \x01\x00\x00\x00",
    b"MDE \x02\x00\x00\x00",
    b"<psc><a>",
    b"RFH \x00\x00\x00\x02",
]


@pytest.mark.parametrize("name", sorted(DECODERS))
@settings(max_examples=200, deadline=None)
@given(
    prefix=st.sampled_from(_PREFIXES),
    data=st.binary(max_size=600),
    encoding=st.sampled_from([546, 273, 0, 3, -1, 2**31 - 1, 1]),
    ccsid=st.sampled_from([0, -2, 1208, 819, 500, 1200, 1, 65535, 437]),
)
def test_arbitrary_bytes_decode_or_raise_wire_error(
    name: str, prefix: bytes, data: bytes, encoding: int, ccsid: int
) -> None:
    try:
        DECODERS[name](prefix + data, encoding, ccsid)
    except WireError as exc:
        assert exc.reason > 0
        assert str(exc)


@st.composite
def mutated_vectors(draw: st.DrawFn) -> tuple[str, bytes, int]:
    """A valid encoding with a few bytes overwritten/truncated (reaches deeper code)."""
    kind = draw(st.sampled_from(["rfh", "rfh2", "dlh", "xqh", "mqmde", "mqmd"]))
    encoding = draw(st.sampled_from([546, 273]))
    if kind == "rfh":
        data = encode_rfh(draw(s.rfhs()), encoding)
    elif kind == "rfh2":
        data = encode_rfh2(draw(s.rfh2s()), encoding)
    elif kind == "dlh":
        data = encode_dlh(draw(s.dlhs()), encoding)
    elif kind == "xqh":
        data = encode_xqh(draw(s.xqhs()), encoding)
    elif kind == "mqmde":
        data = encode_mqmde(draw(s.mqmdes()), encoding)
    else:
        data = draw(s.mqmds()).pack(encoding)
    buf = bytearray(data)
    for _ in range(draw(st.integers(0, 6))):
        if buf:
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(buf)))
    return kind, bytes(buf[: cut if draw(st.booleans()) else len(buf)]), encoding


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vector=mutated_vectors())
def test_mutated_valid_structures_decode_or_raise_wire_error(
    vector: tuple[str, bytes, int],
) -> None:
    kind, data, encoding = vector
    try:
        DECODERS[kind](data, encoding, 0)
    except WireError as exc:
        assert exc.reason > 0
