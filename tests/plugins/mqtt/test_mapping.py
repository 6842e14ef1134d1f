"""The pure MQ ↔ MQTT mapping: topic rule, escaping, QoS, expiry, properties, config."""

from __future__ import annotations

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.plugin_api import DEFAULT_STREAM
from gateway.pubsub.records import Publication
from gateway.runtime.envelopes import topic_within_stream
from gateway.wire.folder import Element, serialize_folder
from plugins.mqtt.config import InboundFilter, MqttConfig, OutboundConfig
from plugins.mqtt.mapping import (
    MappingError,
    echo_filters,
    escape_topic_text,
    expiry_interval,
    filter_levels_overlap,
    has_origin,
    mq_expiry,
    mq_topic,
    mqtt_topic,
    qos_for,
    unescape_topic_text,
    user_properties,
)
from tests.support.envelopes import sink_envelope

OUT = OutboundConfig()


def test_default_stream_maps_under_prefix() -> None:
    assert mqtt_topic(DEFAULT_STREAM, "a/b", OUT) == "mq/a/b"


def test_named_stream_gets_its_own_level() -> None:
    assert mqtt_topic("STOCK.STREAM", "IBM/Latest", OUT) == "mq/STOCK.STREAM/IBM/Latest"


def test_sys_stream_prefix_never_reaches_mqtt() -> None:
    seen = "$SYS/STREAM/BULLETIN.STREAM/news/today"
    topic = topic_within_stream("BULLETIN.STREAM", seen)
    assert topic == "news/today"
    name = mqtt_topic("BULLETIN.STREAM", topic, OUT)
    assert name == "mq/BULLETIN.STREAM/news/today"
    # even with no prefix at all, nothing becomes a $ topic
    bare = OutboundConfig(prefix="")
    assert mqtt_topic(DEFAULT_STREAM, "$SYS/x", bare) == "%24SYS/x"
    assert not mqtt_topic("S", "$x", bare).startswith("$")


def test_configured_stream_levels() -> None:
    cfg = OutboundConfig(
        prefix="legacy/mq", stream_levels={"STOCK.STREAM": "stock"}, default_stream_level="d"
    )
    assert mqtt_topic("STOCK.STREAM", "IBM", cfg) == "legacy/mq/stock/IBM"
    assert mqtt_topic(DEFAULT_STREAM, "x", cfg) == "legacy/mq/d/x"
    assert mqtt_topic("OTHER", "x", cfg) == "legacy/mq/OTHER/x"
    skip = OutboundConfig(stream_levels={"S": ""})
    assert mqtt_topic("S", "x", skip) == "mq/x"


def test_forbidden_characters_are_escaped() -> None:
    assert escape_topic_text("a+b/#/c\0d/50%") == "a%2Bb/%23/c%00d/50%25"
    assert mqtt_topic(DEFAULT_STREAM, "sport/+/#", OUT) == "mq/sport/%2B/%23"
    # stream names may hold % (a legal MQ queue-name character)
    assert mqtt_topic("A%B", "t", OUT) == "mq/A%25B/t"


@given(st.text(min_size=1))
def test_escaping_is_reversible(text: str) -> None:
    escaped = escape_topic_text(text)
    assert not set(escaped) & {"+", "#", "\0"}
    assert unescape_topic_text(escaped) == text


@given(st.text(min_size=1).filter(lambda t: "\0" not in t))
def test_round_trip_through_inbound_mapping(topic: str) -> None:
    name = mqtt_topic(DEFAULT_STREAM, topic, OutboundConfig(prefix="p"))
    back = mq_topic(name, InboundFilter(filter="p/#", strip_prefix="p/"))
    assert back == topic


def test_empty_name_is_a_mapping_error() -> None:
    with pytest.raises(MappingError):
        mqtt_topic(DEFAULT_STREAM, "", OutboundConfig(prefix=""))


def test_inbound_topic_mapping() -> None:
    f = InboundFilter(filter="sensors/#", strip_prefix="sensors/", topic_prefix="from-mqtt/")
    assert mq_topic("sensors/t1/temp", f) == "from-mqtt/t1/temp"
    assert mq_topic("sensors/a%2Bb", f) == "from-mqtt/a+b"
    literal = InboundFilter(filter="#", unescape=False)
    assert mq_topic("x/a%2Bb", literal) == "x/a%2Bb"


def test_qos_from_persistence() -> None:
    assert qos_for(1, OUT) == 1
    assert qos_for(0, OUT) == 0
    cfg = OutboundConfig(qos_persistent=2, qos_non_persistent=1)
    assert (qos_for(1, cfg), qos_for(0, cfg)) == (2, 1)


def test_expiry_conversion() -> None:
    assert expiry_interval(-1) is None
    assert expiry_interval(1) == 1  # rounded up: never expire early... or never
    assert expiry_interval(100) == 10
    assert expiry_interval(101) == 11
    assert mq_expiry(None) == -1
    assert mq_expiry(7) == 70


def test_retained_flag() -> None:
    pub = Publication(stream=DEFAULT_STREAM, topics=["t"], payload=b"")
    assert not sink_envelope(pub, retained=False).retain
    assert sink_envelope(pub, retained=True).retain
    pub.pub_opts = 0x2
    assert sink_envelope(pub, retained=False).retain


def test_user_properties_from_usr_folder_and_rfh_pairs() -> None:
    usr = Element.from_pairs("usr", {"Colour": "red", "Size": "10"})
    group = Element("grp", children=[Element("inner", text="v")])
    usr.children.append(group)
    pub = Publication(
        stream=DEFAULT_STREAM,
        topics=["t"],
        payload=b"",
        user_pairs=[("Legacy", "1")],
        extra_folders=[serialize_folder(usr), "<other><x>1</x></other>"],
    )
    assert user_properties(sink_envelope(pub)) == [
        ("Legacy", "1"),
        ("Colour", "red"),
        ("Size", "10"),
        ("grp.inner", "v"),
    ]


def test_user_properties_keep_repeated_names() -> None:
    """MQTT 5 user properties may repeat a name: every occurrence is sent, in order."""
    usr = Element("usr", children=[Element("x", text="1"), Element("x", text="2")])
    pub = Publication(
        stream=DEFAULT_STREAM, topics=["t"], payload=b"", extra_folders=[usr.to_xml()]
    )
    assert user_properties(sink_envelope(pub)) == [("x", "1"), ("x", "2")]


def test_no_mq_property_becomes_the_origin_marker() -> None:
    """An MQ publisher's usr property or MQRFH pair named ``mqgw-origin`` is not
    forwarded: a forwarded message never poses as some gateway's own (issue 29)."""
    usr = Element.from_pairs("usr", {"mqgw-origin": "gw-b", "Colour": "red"})
    pub = Publication(
        stream=DEFAULT_STREAM,
        topics=["t"],
        payload=b"",
        user_pairs=[("mqgw-origin", "gw-b"), ("Legacy", "1")],
        extra_folders=[serialize_folder(usr)],
    )
    assert user_properties(sink_envelope(pub)) == [("Legacy", "1"), ("Colour", "red")]


def test_origin_marker_names_one_gateway() -> None:
    pairs = [("a", "1"), ("mqgw-origin", "gw-a")]
    assert has_origin(pairs, "gw-a")
    assert not has_origin(pairs, "gw-b")
    assert not has_origin(pairs, "")  # no gateway id: nothing is skipped
    assert not has_origin([("mqgw-origin-x", "gw-a")], "gw-a")


def test_echo_detection() -> None:
    assert filter_levels_overlap("#", "mq")
    assert filter_levels_overlap("mq/#", "mq")
    assert filter_levels_overlap("+/x", "mq")
    assert not filter_levels_overlap("sensors/#", "mq")
    assert not filter_levels_overlap("mq", "mq")
    assert filter_levels_overlap("a/+/c", "a/b")
    assert not filter_levels_overlap("a/c/#", "a/b")
    assert echo_filters([InboundFilter(filter="mq/+/x"), InboundFilter(filter="s/#")], "mq") == [
        "mq/+/x"
    ]


def test_config_validation_names_the_key() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"outbound\.prefix"):
        MqttConfig.model_validate({"outbound": {"prefix": "$SYS/x"}})
    with pytest.raises(pydantic.ValidationError, match="'#' must be a whole, last level"):
        MqttConfig.model_validate({"inbound": {"filters": [{"filter": "a/#/b"}]}})
    with pytest.raises(pydantic.ValidationError, match="not an MQ queue name"):
        MqttConfig.model_validate({"inbound": {"filters": [{"filter": "a", "stream": "BAD NAME"}]}})
    with pytest.raises(pydantic.ValidationError, match="protocol"):
        MqttConfig.model_validate({"protocol": "3"})
    with pytest.raises(pydantic.ValidationError, match="extra"):
        MqttConfig.model_validate({"hots": "x"})
    cfg = MqttConfig.model_validate({"outbound": {"prefix": "a/b/"}})
    assert cfg.outbound.prefix == "a/b"


def test_an_mqtt_message_cannot_choose_its_stream() -> None:
    """Issue 15: a default-stream filter whose MQ topic would read ``$SYS/STREAM/<s>/``
    would publish on stream <s>: refused (dead-letter topic), never published."""
    f = InboundFilter(filter="in/#", strip_prefix="in/")
    with pytest.raises(MappingError, match="would choose stream"):
        mq_topic("in/$SYS/STREAM/SYSTEM.BROKER.ADMIN.STREAM/x", f)
    named = InboundFilter(filter="in/#", strip_prefix="in/", stream="STOCK.STREAM")
    assert mq_topic("in/$SYS/STREAM/X/y", named) == "$SYS/STREAM/X/y"  # stays in STOCK
