"""The backlog message format (``gateway.runtime.backlog_format``): every envelope field
survives the round trip, damaged messages are refused with MQRC_FORMAT_ERROR, and sink
names map to distinct, valid MQ queue names."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.plugin_api import Envelope
from gateway.runtime.backlog_format import (
    BacklogFormatError,
    backlog_queue_name,
    decode_backlog_message,
    encode_backlog_message,
)
from gateway.wire.reasons import Reason

_text = st.text(max_size=20)
_props = st.dictionaries(
    st.from_regex(r"[A-Za-z][A-Za-z0-9_.]{0,8}", fullmatch=True), _text, max_size=4
)

FIELDS = dict(
    stream=_text,
    topic=_text,
    payload=st.binary(max_size=256),
    payload_format=st.sampled_from(["MQSTR", "", "MQHRF2"]),
    encoding=st.integers(0, 2**31 - 1),
    ccsid=st.integers(0, 65535),
    properties=_props,
    persistent=st.booleans(),
    retain=st.booleans(),
    delete=st.booleans(),
    expiry=st.integers(-1, 2**31 - 1),
    correl_id=st.binary(min_size=24, max_size=24),
    origin=_text,
    property_types=_props,
    property_list=st.lists(st.tuples(_text, _text), max_size=3).map(tuple),
    name_value_pairs=st.lists(st.tuples(_text, _text), max_size=3).map(tuple),
    from_retained_store=st.booleans(),
    msg_id=st.binary(min_size=24, max_size=24),
    user_identifier=_text,
    put_time_ms=st.none() | st.integers(0, 2**45),
    publisher_header=st.sampled_from(["MQRFH", "MQRFH2"]),
    priority=st.integers(0, 9),
    sequence_number=_text,
    publish_timestamp=_text,
    subscription_stream=_text,
    subscription_filter=_text,
    reply_to_q=_text,
    reply_to_q_mgr=_text,
    msg_type=st.integers(1, 8),
    report=st.integers(0, 2**31 - 1),
    text_codec=st.none() | st.sampled_from(["utf-8", "cp037"]),
    reply_topic=_text,
    correlation_data=st.binary(max_size=64),
)
envelopes = st.builds(Envelope, **FIELDS)


@settings(max_examples=100, deadline=None)
@given(envelopes)
def test_every_envelope_survives_the_round_trip(env: Envelope) -> None:
    back = decode_backlog_message(encode_backlog_message(env))
    assert back == env
    assert list(back.properties) == list(env.properties)  # order kept


def test_every_envelope_field_is_covered_by_the_strategy() -> None:
    # A new Envelope field must be added here, so the round trip checks it too.
    assert {f.name for f in dataclasses.fields(Envelope)} == set(FIELDS)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"MQGWENV1",
        b"MQGWENV2\x00\x00\x00\x02{}",
        b"MQGWENV1\x00\x00\x00\xff{}",
        b"MQGWENV1\x00\x00\x00\x02[]",
        b"MQGWENV1\x00\x00\x00\x03{x}",
        b"MQGWENV1\x00\x00\x00\x02{}payload",  # no stream/topic
        b'MQGWENV1\x00\x00\x00\x2b{"stream":"s","topic":"t","msg_id":"zz"}',
    ],
)
def test_damaged_messages_are_refused_with_format_error(body: bytes) -> None:
    with pytest.raises(BacklogFormatError) as info:
        decode_backlog_message(body)
    assert info.value.reason == Reason.FORMAT_ERROR


def test_backlog_queue_names_are_valid_and_distinct() -> None:
    assert backlog_queue_name("kafka") == "SYSTEM.MQGW.SINK.kafka"
    assert backlog_queue_name("kafka-main") == "SYSTEM.MQGW.SINK.kafka%main"
    assert backlog_queue_name("kafka_main") != backlog_queue_name("kafka-main")
    assert len(backlog_queue_name("x" * 31)) == 48
    with pytest.raises(ValueError, match="at most 31"):
        backlog_queue_name("x" * 32)
