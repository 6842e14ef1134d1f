"""The MQTT topics an instance keeps for itself (``OwnsTopics``, plugins.mqtt.namespace):
``$`` topics, the dead-letter tree, what an inbound filter matches, and every name a
forwarded publication can have (precisely, when there is no outbound prefix)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gateway.plugin_api import DEFAULT_STREAM, OwnsTopics, split_unified_topic
from plugins.mqtt import MqttConfig, MqttInstance
from plugins.mqtt.mapping import MappingError, mqtt_topic
from plugins.mqtt.namespace import MqttNamespace, matches_filter

STOCK = "STOCK.STREAM"


def instance(**config: Any) -> MqttInstance:
    return MqttInstance("m1", MqttConfig.model_validate(config))


FILTERS = {"inbound": {"filters": [{"filter": "sensors/#"}, {"filter": "+/cmd"}]}}
NO_PREFIX = {
    "outbound": {
        "prefix": "",
        "topics": ["quotes/#", f"$SYS/STREAM/{STOCK}/IBM/+"],
        "stream_levels": {STOCK: "stock"},
    },
    "inbound": {"dead_letter_topic": "dlq"},
}
EVERYTHING = {"outbound": {"prefix": "", "topics": ["#"]}}


def test_the_instance_implements_owns_topics() -> None:
    assert isinstance(instance(), OwnsTopics)


@pytest.mark.parametrize(
    ("config", "topic", "why"),
    [
        ({}, "mq/quotes/reply", "under the outbound prefix 'mq'"),
        ({}, "mq/", "under the outbound prefix 'mq'"),
        ({}, "$SYS/broker/uptime", "'$' topic"),
        ({}, "$share/g/x", "'$' topic"),
        ({}, "mqgw/dead-letter", "dead-letter topic 'mqgw/dead-letter'"),
        ({}, "mqgw/dead-letter/quotes/get", "dead-letter topic 'mqgw/dead-letter'"),
        (FILTERS, "sensors", "inbound filter 'sensors/#'"),  # '#' takes zero levels too
        (FILTERS, "sensors/a/b", "inbound filter 'sensors/#'"),
        (FILTERS, "dev1/cmd", "inbound filter '+/cmd'"),
        (NO_PREFIX, "quotes", "outbound topic 'quotes/#'"),
        (NO_PREFIX, "quotes/a%2Bb", "forwards MQ topic 'quotes/a+b'"),
        (NO_PREFIX, "stock/IBM/price", f"outbound topic '$SYS/STREAM/{STOCK}/IBM/+'"),
        (NO_PREFIX, "dlq/x", "dead-letter topic 'dlq'"),
        (EVERYTHING, "quotes/reply", "forwards MQ topic 'quotes/reply'"),
        (EVERYTHING, "%24foo", "forwards MQ topic '$foo'"),
        (EVERYTHING, "a%2524", "forwards MQ topic 'a%24'"),
    ],
)
def test_own_names_say_why(config: dict[str, Any], topic: str, why: str) -> None:
    reason = instance(**config).own_topic(topic)
    assert why in reason
    assert f"{topic!r}" in reason


@pytest.mark.parametrize(
    ("config", "topic"),
    [
        ({}, "mq"),
        ({}, "mqtt/x"),
        ({}, "quotes/reply"),
        ({}, "mqgw/dead-letters"),
        ({}, ""),
        ({"outbound": {"topics": []}}, "mq/x"),  # forwards nothing
        ({"inbound": {"dead_letter_topic": ""}}, "mqgw/dead-letter"),
        (FILTERS, "dev1/cmd/x"),
        (NO_PREFIX, "stock/IBM"),  # '+' needs a level
        (NO_PREFIX, "stock/HUR/price"),
        (NO_PREFIX, "quotesx/a"),
        (NO_PREFIX, "quotes/a%zz"),  # '%' is always escaped: never a forwarded name
        (NO_PREFIX, "other/quotes/a"),
        (NO_PREFIX, f"{STOCK}/IBM/price"),  # the stream has its own level
        ({"outbound": {"prefix": "", "topics": []}}, "quotes/a"),
        (EVERYTHING, "a%24"),  # '%24' is only ever written first
        (EVERYTHING, "a%2b"),  # escapes are written in capitals
        (EVERYTHING, "a/%"),
    ],
)
def test_other_names_are_not_own(config: dict[str, Any], topic: str) -> None:
    assert instance(**config).own_topic(topic) == ""


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("a/#", "a", True),
        ("#", "$SYS/x", True),  # wider than MQTT, which skips '$' topics
        ("+/+", "/", True),
        ("a/+", "a", False),
        ("a/#/b", "a/x/y", True),  # a '#' not last takes the rest: wider, never narrower
        ("a/b", "a/b/c", False),
    ],
)
def test_filter_matching(topic_filter: str, topic: str, expected: bool) -> None:
    assert matches_filter(topic_filter, topic) is expected


# ------------------------------------------------------------ generated names -----

#: MQ topic levels: any text MQ can carry (no lone surrogates), no '/'
_levels = st.text(alphabet=st.characters(exclude_characters="/", codec="utf-8"), max_size=8)
_mq_topics = st.lists(_levels, min_size=1, max_size=5).map("/".join)


@given(
    st.sampled_from(["", "mq", "a/b"]),
    st.sampled_from(["", "default"]),
    st.sampled_from([DEFAULT_STREAM, STOCK, "S%1", "PLAIN"]),
    _mq_topics,
)
def test_every_forwarded_name_is_own(prefix: str, level: str, stream: str, topic: str) -> None:
    config = MqttConfig.model_validate(
        {
            "outbound": {
                "prefix": prefix,
                "default_stream_level": level,
                "stream_levels": {STOCK: "stock", "PLAIN": ""},
                "topics": ["#", f"$SYS/STREAM/{stream}/#"],
            },
            "inbound": {"dead_letter_topic": ""},
        }
    )
    try:
        name = mqtt_topic(stream, topic, config.outbound)
    except MappingError:
        assume(False)
        return
    namespace = MqttNamespace(config, "m1")
    assert namespace.own_topic(name)
    forwarded = namespace.forwarded_from(name)
    assert forwarded is not None
    stream_of_filter, _ = split_unified_topic(forwarded[0])
    assert mqtt_topic(stream_of_filter, forwarded[1], config.outbound) == name


@given(
    st.sampled_from(["", "mq"]),
    st.sampled_from(["", "default"]),
    st.text(alphabet="%2B53#+0$a/S", max_size=16),
)
def test_every_name_owned_as_forwarded_is_one(prefix: str, level: str, name: str) -> None:
    """The inverse is exact: what ``forwarded_from`` names maps forward to the name."""
    config = MqttConfig.model_validate(
        {
            "outbound": {
                "prefix": prefix,
                "default_stream_level": level,
                "topics": ["#", "$SYS/STREAM/S/#"],
            }
        }
    )
    forwarded = MqttNamespace(config, "m1").forwarded_from(name)
    if forwarded is not None:
        stream, _ = split_unified_topic(forwarded[0])
        assert mqtt_topic(stream, forwarded[1], config.outbound) == name


@given(st.sampled_from(["IBM", "HUR"]), _levels)
def test_a_precise_filter_owns_exactly_its_topics(symbol: str, last: str) -> None:
    namespace = MqttNamespace(MqttConfig.model_validate(NO_PREFIX), "m1")
    name = mqtt_topic(STOCK, f"{symbol}/{last}", MqttConfig.model_validate(NO_PREFIX).outbound)
    assert bool(namespace.own_topic(name)) == (symbol == "IBM")


@given(st.text(max_size=60))  # lone surrogates included: a name MQTT cannot carry
def test_names_outside_the_instance_are_not_own(rest: str) -> None:
    name = "app/" + rest
    for config in (NO_PREFIX, FILTERS, {}):
        assert instance(**config).own_topic(name) == ""
