"""The Kafka topics an instance keeps for itself (``OwnsTopics``, plugins.kafka.namespace):
every name its templates can render for the streams its routes subscribe to, its
inbound, dead-letter and exactly-once marker topics and Kafka's internal ones are
refused as reply topics; other names are not."""

from __future__ import annotations

import re
import string
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.plugin_api import OwnsEveryTopic, OwnsTopics, split_unified_topic
from plugins.kafka import KafkaInstance, KafkaPluginConfig, plugin
from plugins.kafka.errors import KafkaPluginError, TopicNameError
from plugins.kafka.mapping import TopicTemplate
from plugins.kafka.namespace import KafkaNamespace, NamePattern

DEFAULT = "SYSTEM.BROKER.DEFAULT.STREAM"
_LEGAL = string.ascii_letters + string.digits + "._-"


def instance(**config: Any) -> KafkaInstance:
    return KafkaInstance("k1", KafkaPluginConfig.model_validate(config))


#: {stream} and {topic} in one template, for two routes' streams.
STREAMS = {
    "outbound": {
        "topic_template": "app.{stream}.{topic}",
        "retained_topic_template": "app-retained.{stream}.{topic}",
        "routes": [{"stream": "STOCK.STREAM"}, {"stream": "PCT%.STREAM", "topic": "a/#"}],
    }
}

CUSTOM = {
    "outbound": {
        "routes": [
            {"stream": "STOCK.STREAM", "topic": "#", "kafka_topic": "prices.{topic}"},
            {"stream": DEFAULT, "topic": "orders/#", "retained_topic": "orders-last"},
        ]
    },
    "inbound": {"topics": [{"kafka_topic": "orders.in"}], "dead_letter_topic": "dlq.k1"},
    "exactly_once_topic_name": "eos.k1",
}


def test_the_instance_implements_owns_topics() -> None:
    assert isinstance(instance(), OwnsTopics)
    assert isinstance(plugin, OwnsEveryTopic)


@pytest.mark.parametrize(
    ("config", "topic", "why"),
    [
        ({}, f"mqgw.{DEFAULT}", "outbound publications of stream "
                                f"'{DEFAULT}' (template 'mqgw.{{stream}}')"),
        ({}, f"mqgw-retained.{DEFAULT}", "outbound retained publications"),
        ({}, "mqgw-deadletter", "the dead-letter topic"),
        ({}, "mqgw-eos.gw-anything.k1", "exactly-once marker topic"),
        ({}, "__consumer_offsets", "Kafka's internal namespace"),
        ({}, "__transaction_state", "Kafka's internal namespace"),
        ({}, "._consumer_offsets", "Kafka's internal namespace"),
        ({}, "mqgw_SYSTEM_BROKER_DEFAULT_STREAM", "collides ('.' and '_' alike) with a topic "
                                                  "of the outbound"),
        (CUSTOM, "prices.IBM_2FLatest", "template 'prices.{topic}'"),
        (CUSTOM, "prices.", "template 'prices.{topic}'"),  # an empty MQ topic
        (CUSTOM, "orders-last", "outbound retained publications of stream "
                                f"'{DEFAULT}' (template 'orders-last')"),
        (CUSTOM, f"mqgw.{DEFAULT}", "template 'mqgw.{stream}'"),  # the orders/# route's
        (CUSTOM, "mqgw-retained.STOCK.STREAM", "template 'mqgw-retained.{stream}'"),
        (CUSTOM, "orders.in", f"the inbound topic of stream '{DEFAULT}'"),
        (CUSTOM, "orders_in", "collides"),
        (CUSTOM, "dlq.k1", "the dead-letter topic"),
        (CUSTOM, "eos.k1", "the exactly-once marker topic"),
        # a stream name is rendered escaped, as the router writes it
        (STREAMS, "app.PCT_25.STREAM.x", "stream 'PCT%.STREAM'"),
        (STREAMS, "app.STOCK.STREAM.", "stream 'STOCK.STREAM'"),
        ({"outbound": {"topic_template": "{topic}"}}, "app.replies", "template '{topic}'"),
        ({"outbound": {"topic_template": "{stream}.{topic}"}}, f"{DEFAULT}.x",
         "template '{stream}.{topic}'"),
    ],
)
def test_own_names_say_why(config: dict[str, Any], topic: str, why: str) -> None:
    reason = instance(**config).own_topic(topic)
    assert why in reason
    assert f"{topic!r}" in reason


@pytest.mark.parametrize(
    ("config", "topic"),
    [
        ({}, "quotes.replies"),
        ({}, "mqgw"),  # no stream: the template never renders it
        ({}, "mqgw."),
        ({}, "mqgw.ANY_2FSTREAM"),  # no route subscribes to that stream
        ({}, "mqgw-retained.STOCK.STREAM"),
        ({}, "mqgw-deadletter.x"),
        ({}, "mqgw-eos.gw.k2"),  # another instance's marker topic
        ({}, "_consumer_offsets"),
        ({}, "quotes/replies"),  # not a Kafka name: producing to it is refused anyway
        ({}, ""),
        ({"outbound": {"enabled": False}}, f"mqgw.{DEFAULT}"),  # writes no stream topics
        (CUSTOM, "prices"),
        (CUSTOM, "mqgw.STOCK.STREAM"),  # its route writes prices.{topic} instead
        (CUSTOM, "mqgw-eos.gw.k1"),  # a configured marker topic replaces the default
        (CUSTOM, "mqgw-deadletter"),
        # {stream} is the routes' streams, not any name: the replies of a requester
        ({"outbound": {"topic_template": "{stream}.{topic}"}}, "app.replies"),
        ({"outbound": {"topic_template": "{stream}.{topic}"}}, "replies_v2"),
        ({"outbound": {"topic_template": "{stream}.{topic}"}}, "quotes.reply"),
        (STREAMS, "app.replies"),
        (STREAMS, "replies_v2"),
        (STREAMS, "app.OTHER.STREAM.x"),
        (STREAMS, "quotes.reply"),
    ],
)
def test_other_names_are_not_own(config: dict[str, Any], topic: str) -> None:
    assert instance(**config).own_topic(topic) == ""


def test_a_template_of_the_mq_topic_alone_makes_every_name_own() -> None:
    """``{topic}`` alone can write any name: every reply topic is refused, and the
    plugin says so to ``mqgw run --check`` (``OwnsEveryTopic``)."""
    plain = {"outbound": {"topic_template": "{topic}"}}
    assert instance(**plain).own_topic("quotes.reply")
    config = KafkaPluginConfig.model_validate(plain)
    assert "template '{topic}'" in plugin.every_topic_own("k1", config)
    for other in ({}, CUSTOM, STREAMS, {"outbound": {"topic_template": "x{topic}"}}):
        assert plugin.every_topic_own("k1", KafkaPluginConfig.model_validate(other)) == ""


def test_the_marker_topic_is_exact_once_the_gateway_id_is_known() -> None:
    config = KafkaPluginConfig()
    known = KafkaNamespace(config, "k1", "gw1")
    assert "exactly-once" in known.own_topic("mqgw-eos.gw1.k1")
    assert known.own_topic("mqgw-eos.gw2.k1") == ""


# ------------------------------------------------------------ generated names -----

_literal = st.text(alphabet=_LEGAL, max_size=6)
_templates = st.lists(
    st.one_of(_literal, st.sampled_from(["{stream}", "{topic}"])), min_size=1, max_size=6
).map("".join)


def _valid(template: str) -> TopicTemplate:
    try:
        return TopicTemplate.parse(template)
    except TopicNameError:
        assume(False)
        raise


_optional_template = st.one_of(st.none(), _templates)
#: Stream names as configured: real ones, and odd ones whose unified topic the engine
#: splits differently ("A/B": stream "A"; a blank: a topic of the default stream).
_streams = st.one_of(
    st.sampled_from([DEFAULT, "STOCK.STREAM", "PCT%.STREAM"]),
    st.text(alphabet=string.ascii_letters + "._%/ $", min_size=1, max_size=12),
)
_routes = st.lists(
    st.fixed_dictionaries(
        {"stream": _streams, "topic": st.sampled_from(["#", "a/#", "+", "a", "a/+/b"])},
        optional={"kafka_topic": _templates, "retained_topic": _templates},
    ),
    min_size=1,
    max_size=3,
)


@given(_templates, _templates, _routes, st.data(), st.text(max_size=40), st.booleans())
def test_every_name_the_router_renders_is_own(
    main: str,
    retained: str,
    routes: list[dict[str, str]],
    data: st.DataObject,
    topic: str,
    is_retained: bool,
) -> None:
    """What the sink writes for a publication of a configured route's subscription:
    the route the router picks for the engine's (stream, filter) of the route's unified
    topic -- the route itself or the default templates -- rendered for that stream."""
    _valid(main), _valid(retained)
    for r in routes:
        for key in ("kafka_topic", "retained_topic"):
            if key in r:
                _valid(r[key])
    try:
        config = KafkaPluginConfig.model_validate(
            {"outbound": {"topic_template": main, "retained_topic_template": retained,
                          "routes": routes}}
        )
        configured = data.draw(st.sampled_from(config.outbound.routes))
        stream, topic_filter = split_unified_topic(configured.unified_topic)
        router = config.outbound.router()
        route = router.route_for(stream, topic_filter)
        name = router.topic_for(route, stream, topic, retained=is_retained)
    except (ValidationError, KafkaPluginError):
        # A colliding mapping (refused at start-up) or a name longer than Kafka allows
        # or "." / "..": never a topic.
        assume(False)
        return
    assert KafkaNamespace(config, "k1").own_topic(name)


def _regex(template: str) -> re.Pattern[str]:
    parts = []
    for literal, field, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(".+" if field == "stream" else ".*")
    return re.compile("".join(parts))


@given(_templates, st.text(alphabet=_LEGAL, max_size=30))
def test_matching_agrees_with_a_regular_expression(template: str, name: str) -> None:
    pattern = NamePattern.of_template(template, "x")
    assert pattern.matches(name) == bool(_regex(template).fullmatch(name))


@given(st.text(alphabet=_LEGAL, max_size=200))
def test_names_outside_the_instance_are_not_own(rest: str) -> None:
    name = "app" + rest
    assert instance(**CUSTOM).own_topic(name) == ""
    assert instance().own_topic(name) == ""
