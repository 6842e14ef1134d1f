"""Broker administration publications (PCF on SYSTEM.BROKER.ADMIN.STREAM)."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.pubsub import streams
from gateway.pubsub.admin_messages import (
    ADMIN_STREAM,
    INTER_BROKER_QUEUE,
    NAME_PARAMETERS,
    AdminKind,
    AdminPublication,
    admin_topic,
    decode_admin_publication,
    encode_admin_publication,
    metatopic,
    parse_admin_topic,
    publish_timestamp,
)
from gateway.wire.chain import build_message
from gateway.wire.errors import WireError
from gateway.wire.mqmd import MQMD
from gateway.wire.pcf import (
    MQCACF_STREAM_NAME,
    MQCACF_SUPPORTED_STREAM_NAME,
    MQCACF_TOPIC,
    MQCFT_COMMAND,
    MQCFT_RESPONSE,
    MQCMD_PUBLISH,
    MQCMD_REGISTER_SUBSCRIBER,
    MQIACF_PUBLICATION_OPTIONS,
    IntParam,
    PCFHeader,
    PCFParam,
    StringListParam,
    StringParam,
    encode_pcf,
)
from gateway.wire.reasons import Reason
from gateway.wire.rfh import MQRFH
from gateway.wire.rfh2 import MQRFH2

PROPS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS: tuple[AdminKind, ...] = get_args(AdminKind)
PADDED_BROKERA = "BROKERA" + " " * 41


def test_constants_have_one_home_and_are_re_exported() -> None:
    assert ADMIN_STREAM == streams.ADMIN_STREAM == "SYSTEM.BROKER.ADMIN.STREAM"
    assert INTER_BROKER_QUEUE == streams.INTER_BROKER_QUEUE
    assert INTER_BROKER_QUEUE == "SYSTEM.BROKER.INTER.BROKER.COMMUNICATIONS"


def test_metatopic_pads_the_queue_manager_name_to_48_blanks() -> None:
    topic = metatopic("BROKERA", "StreamSupport")
    assert topic == f"MQ/{PADDED_BROKERA}/StreamSupport"
    assert len(topic) == 3 + 48 + 1 + len("StreamSupport")
    assert metatopic("Q" * 48, "Parent") == "MQ/" + "Q" * 48 + "/Parent"
    assert admin_topic("StreamDeleted", "QM1") == f"MQ/{'QM1':<48}/Event/StreamDeleted"
    for bad in ("", "Q" * 49, "QM1 "):
        with pytest.raises(ValueError):
            metatopic(bad, "Parent")


def test_parse_admin_topic_reads_padded_and_unpadded_names() -> None:
    assert parse_admin_topic(f"MQ/{PADDED_BROKERA}/StreamSupport") == ("StreamSupport", "BROKERA")
    assert parse_admin_topic("MQ/BROKERA/Children") == ("Children", "BROKERA")
    assert parse_admin_topic(admin_topic("SubscriptionDeregistered", "A/B")) == (
        "SubscriptionDeregistered",
        "A/B",
    )
    for bad in ("MQ//Parent", "MQ/QM1/Other", "XX/QM1/Parent", f"MQ/{'Q' * 49}/Parent", ""):
        with pytest.raises(WireError) as info:
            parse_admin_topic(bad)
        assert info.value.reason == Reason.TOPIC_ERROR


def test_publish_timestamp_is_16_characters_universal_time() -> None:
    moment = datetime(2026, 11, 23, 19, 20, 32, 456_000, tzinfo=UTC)
    assert publish_timestamp(moment) == "2026112319203245"
    assert len(publish_timestamp()) == 16 and publish_timestamp().isdigit()


def _mqcfst(parameter: int, text: bytes) -> bytes:
    """MQCFST by hand: Type 4, StrucLength, Parameter, CCSID 0, StringLength, String, NULs."""
    length = 20 + len(text) + (-len(text) % 4)
    return struct.pack("<5i", 4, length, parameter, 0, len(text)) + text.ljust(length - 20, b"\0")


def test_stream_support_golden_bytes() -> None:
    pub = AdminPublication(
        kind="StreamSupport",
        q_mgr="BROKERA",
        names=("SYSTEM.BROKER.DEFAULT.STREAM", "STOCK.STREAM"),
        retained=True,
        timestamp="2026112319203245",
    )
    md, body = encode_admin_publication(pub)
    expected = (
        # MQCFH: Type COMMAND, StrucLength 36, Version 1, Command PUBLISH (63),
        # MsgSeqNumber 1, Control LAST, CompCode 0, Reason 0, ParameterCount 6
        struct.pack("<9i", 1, 36, 1, 63, 1, 1, 0, 0, 6)
        # PublicationOptions (1082) = MQPUBO_RETAIN_PUBLICATION (2)
        + struct.pack("<4i", 3, 16, 1082, 2)
        + _mqcfst(3030, b"SYSTEM.BROKER.ADMIN.STREAM")
        + _mqcfst(3031, f"MQ/{PADDED_BROKERA}/StreamSupport".encode())
        + _mqcfst(3034, b"2026112319203245")
        + _mqcfst(3036, b"SYSTEM.BROKER.DEFAULT.STREAM")
        + _mqcfst(3036, b"STOCK.STREAM")
    )
    assert body == expected
    assert (md.format, md.msg_type, md.persistence) == ("MQADMIN", 8, 1)
    assert (md.encoding, md.coded_char_set_id) == (546, 819)
    assert decode_admin_publication(md, body) == pub


def test_big_endian_publication_decodes_with_the_mqmd_encoding() -> None:
    pub = AdminPublication("Parent", "BROKERB", ("GW",), False, "2026112319203245")
    md, body = encode_admin_publication(pub, encoding=273, ccsid=500)
    assert body[:8] == struct.pack(">2i", 1, 36)
    assert (md.encoding, md.coded_char_set_id) == (273, 500)
    assert "GW".encode("cp500") in body
    assert decode_admin_publication(md, body) == pub
    with pytest.raises(WireError):
        decode_admin_publication(MQMD(format="MQADMIN"), body)  # read as little-endian


def _body(params: list[PCFParam], *, header: PCFHeader | None = None) -> bytes:
    return encode_pcf(header or PCFHeader(type=MQCFT_COMMAND, command=MQCMD_PUBLISH), params)


def _fixed(topic: str, *, options: int = 2, stream: str = ADMIN_STREAM) -> list[PCFParam]:
    return [
        IntParam(MQIACF_PUBLICATION_OPTIONS, options),
        StringParam(MQCACF_STREAM_NAME, stream),
        StringParam(MQCACF_TOPIC, topic),
        StringParam(3034, "2026112319203245"),
    ]


def test_decoding_is_lenient_where_real_brokers_may_differ() -> None:
    topic = f"MQ/{PADDED_BROKERA}/StreamSupport"
    params = [
        *_fixed(topic, options=16, stream=ADMIN_STREAM.ljust(48)),
        StringParam(MQCACF_SUPPORTED_STREAM_NAME, "STOCK.STREAM".ljust(48)),
        StringListParam(MQCACF_SUPPORTED_STREAM_NAME, ["BULLETIN.STREAM", "X"]),
        StringParam(9999, "a parameter of a later release"),
        IntParam(1081, 0),
    ]
    pub = decode_admin_publication(MQMD(format="MQADMIN"), _body(params))
    assert pub == AdminPublication(
        "StreamSupport",
        "BROKERA",
        ("STOCK.STREAM", "BULLETIN.STREAM", "X"),
        True,  # MQPUBO_IS_RETAINED_PUBLICATION counts as retained
        "2026112319203245",
    )
    assert decode_admin_publication(MQMD(format="MQPCF"), _body(params)).names == pub.names


@pytest.mark.parametrize(
    ("md_format", "body", "reason"),
    [
        ("MQSTR", _body([*_fixed("MQ/QM1/Parent"), StringParam(3032, "P")]), Reason.FORMAT_ERROR),
        ("MQADMIN", b"not pcf at all", 3002),
        (
            "MQADMIN",
            _body(_fixed("MQ/QM1/Children"), header=PCFHeader(type=MQCFT_RESPONSE, command=63)),
            3001,
        ),
        (
            "MQADMIN",
            _body(
                _fixed("MQ/QM1/Children"),
                header=PCFHeader(type=MQCFT_COMMAND, command=MQCMD_REGISTER_SUBSCRIBER),
            ),
            3001,
        ),
        ("MQADMIN", _body(_fixed("MQ/QM1/Children")[:3]), Reason.FORMAT_ERROR),
        (
            "MQADMIN",
            _body([*_fixed("MQ/QM1/Children"), StringParam(MQCACF_TOPIC, "MQ/QM1/Parent")]),
            Reason.FORMAT_ERROR,
        ),
        (
            "MQADMIN",
            _body([StringParam(MQIACF_PUBLICATION_OPTIONS, "2"), *_fixed("MQ/QM1/Children")[1:]]),
            Reason.FORMAT_ERROR,
        ),
        (
            "MQADMIN",
            _body(
                [*_fixed("MQ/QM1/Children")[:2], IntParam(MQCACF_TOPIC, 1), StringParam(3034, "")]
            ),
            Reason.FORMAT_ERROR,
        ),
        (
            "MQADMIN",
            _body(_fixed("MQ/QM1/Children", stream="SYSTEM.BROKER.DEFAULT.STREAM")),
            Reason.INCORRECT_STREAM,
        ),
        ("MQADMIN", _body(_fixed("Sport/Results")), Reason.TOPIC_ERROR),
        ("MQADMIN", _body(_fixed("MQ/QM1/Parent")), Reason.FORMAT_ERROR),
        (
            "MQADMIN",
            _body([*_fixed("MQ/QM1/Parent"), StringParam(3032, "A"), StringParam(3032, "B")]),
            Reason.FORMAT_ERROR,
        ),
        (
            "MQADMIN",
            _body([*_fixed("MQ/QM1/Children"), IntParam(NAME_PARAMETERS["Children"], 7)]),
            Reason.FORMAT_ERROR,
        ),
    ],
)
def test_what_is_not_an_admin_publication_is_refused(
    md_format: str, body: bytes, reason: int
) -> None:
    with pytest.raises(WireError) as info:
        decode_admin_publication(MQMD(format=md_format), body)
    assert info.value.reason == reason


@pytest.mark.parametrize("header", [MQRFH(), MQRFH2()])
def test_publication_behind_an_rfh_header_is_read(header: MQRFH | MQRFH2) -> None:
    pub = AdminPublication("Children", "BROKERB", ("C1", "C2"), True, "2026112319203245")
    md, body = encode_admin_publication(pub, encoding=273)
    if isinstance(header, MQRFH):
        header.name_values = [("MQPSCommand", "Publish")]
    fmt, encoding, ccsid, data = build_message(
        [header],
        body,
        md.format,
        payload_encoding=md.encoding,
        payload_ccsid=md.coded_char_set_id,
        header_encoding=546,
        header_ccsid=819,
    )
    assert fmt in ("MQHRF", "MQHRF2") and data.endswith(body)
    wrapped = MQMD(format=fmt, encoding=encoding, coded_char_set_id=ccsid)
    assert decode_admin_publication(wrapped, data) == pub
    fmt, encoding, ccsid, data = build_message(
        [header], body, "MQSTR", payload_encoding=273, payload_ccsid=819
    )
    with pytest.raises(WireError) as info:
        decode_admin_publication(MQMD(format=fmt, encoding=encoding, coded_char_set_id=ccsid), data)
    assert info.value.reason == Reason.FORMAT_ERROR


def test_parent_publication_names_exactly_one_queue_manager() -> None:
    with pytest.raises(ValueError):
        encode_admin_publication(AdminPublication("Parent", "QM1", ("A", "B"), True, ""))


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_round_trips_in_both_encodings(kind: AdminKind) -> None:
    names = ("PARENT.QM",) if kind == "Parent" else ("ONE", "TWO.2", "three_%")
    pub = AdminPublication(kind, "GW", names, kind != "BrokerDeleted", "2026112319203245")
    for encoding in (546, 273):
        md, body = encode_admin_publication(pub, encoding=encoding)
        assert decode_admin_publication(md, body) == pub
        assert admin_topic(kind, "GW").encode() in body


#: MQ object-name characters (queue managers and streams).
_mq_name = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%/",
    min_size=1,
    max_size=48,
)


@st.composite
def publications(draw: st.DrawFn) -> AdminPublication:
    kind = draw(st.sampled_from(KINDS))
    size = (1, 1) if kind == "Parent" else (0, 12)
    names = draw(st.lists(_mq_name, min_size=size[0], max_size=size[1]))
    return AdminPublication(
        kind=kind,
        q_mgr=draw(_mq_name),
        names=tuple(names),
        retained=draw(st.booleans()),
        timestamp=draw(st.from_regex(r"[0-9]{16}", fullmatch=True)),
    )


@PROPS
@given(
    pub=publications(),
    encoding=st.sampled_from([546, 273]),
    ccsid=st.sampled_from([819, 1208, 437, 500, 37]),
)
def test_publications_round_trip(pub: AdminPublication, encoding: int, ccsid: int) -> None:
    md, body = encode_admin_publication(pub, encoding=encoding, ccsid=ccsid)
    assert len(body) % 4 == 0
    assert decode_admin_publication(md, body) == pub


@PROPS
@given(body=st.binary(max_size=300), md_format=st.sampled_from(["MQADMIN", "MQPCF"]))
def test_garbage_raises_only_wire_error(body: bytes, md_format: str) -> None:
    with pytest.raises(WireError):
        decode_admin_publication(MQMD(format=md_format), body)


@PROPS
@given(pub=publications(), data=st.data())
def test_damaged_publications_raise_only_wire_error(
    pub: AdminPublication, data: st.DataObject
) -> None:
    md, body = encode_admin_publication(pub)
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(WireError):
        decode_admin_publication(md, body[:cut])
    flipped = bytearray(body)
    for _ in range(data.draw(st.integers(1, 4))):
        flipped[data.draw(st.integers(0, len(body) - 1))] ^= data.draw(st.integers(1, 255))
    try:
        decoded = decode_admin_publication(md, bytes(flipped))
    except WireError:
        return
    assert decoded.kind in KINDS and decoded.q_mgr
