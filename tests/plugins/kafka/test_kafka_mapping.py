"""The pure half of the Kafka plugin: names, templates, collisions, headers, inbound
mapping and config validation (no broker)."""

from __future__ import annotations

import calendar
from importlib.metadata import entry_points

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.plugin_api import Envelope, Plugin, PluginInstance
from gateway.pubsub.records import Publication
from gateway.wire.folder import Element, usr_properties
from gateway.wire.mqmd import MQMD
from gateway.wire.put_time import put_time_ms
from plugins.kafka import KafkaPluginConfig, plugin
from plugins.kafka import mapping as kafka_mapping
from plugins.kafka.config import OutboundConfig
from plugins.kafka.errors import TopicCollisionError, TopicNameError
from plugins.kafka.mapping import (
    InboundRoute,
    Route,
    SkippedRecord,
    TopicRouter,
    TopicTemplate,
    escape_name,
    inbound_publication,
    outbound_records,
    record_headers,
    unescape_name,
)
from tests.support.envelopes import sink_envelope

STOCK = "STOCK.STREAM"
DEFAULT = "SYSTEM.BROKER.DEFAULT.STREAM"


# ------------------------------------------------------------------ names ------------


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("STOCK.STREAM", "STOCK.STREAM"),
        ("A/B_C", "A_2FB_5FC"),
        ("100%", "100_25"),
        ("é", "_C3_A9"),
        ("a-b", "a-b"),
        ("IBM/Latest", "IBM_2FLatest"),
    ],
)
def test_escape_matches_the_contract_examples(text: str, escaped: str) -> None:
    assert escape_name(text) == escaped
    assert unescape_name(escaped) == text


@given(st.text(max_size=60))
def test_escape_is_exact_and_reversible(text: str) -> None:
    escaped = escape_name(text)
    assert set(escaped) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    assert unescape_name(escaped) == text


@given(st.text(max_size=20), st.text(max_size=20))
def test_distinct_names_never_escape_alike(a: str, b: str) -> None:
    if a != b:
        assert escape_name(a) != escape_name(b)


@pytest.mark.parametrize("bad", ["A_2", "A_ZZ", "_C3", "A_2f"])
def test_malformed_escapes_are_refused(bad: str) -> None:
    with pytest.raises(TopicNameError):
        unescape_name(bad)


def test_templates_render_escaped_values_and_refuse_bad_ones() -> None:
    t = TopicTemplate.parse("prices.{stream}.{topic}")
    assert t.uses_topic
    assert t.render(STOCK, "IBM/Latest") == "prices.STOCK.STREAM.IBM_2FLatest"
    assert TopicTemplate.parse("mqgw.{stream}").render(DEFAULT) == "mqgw." + DEFAULT
    for bad in ("a/{stream}", "{queue}", "{stream!r}", "{stream:>5}", "", "x{"):
        with pytest.raises(TopicNameError):
            TopicTemplate.parse(bad)
    with pytest.raises(TopicNameError, match="249"):
        TopicTemplate.parse("{topic}").render(STOCK, "x" * 250)


# ------------------------------------------------------------------ collisions -------


def _route(stream: str, template: str, retained: str = "mqgw-retained.{stream}") -> Route:
    return Route(stream, "#", TopicTemplate.parse(template), TopicTemplate.parse(retained))


def test_two_streams_on_one_constant_topic_collide_naming_both() -> None:
    outbound = OutboundConfig.model_validate(
        {
            "routes": [
                {"stream": STOCK, "kafka_topic": "all-prices"},
                {"stream": "BULLETIN.STREAM", "kafka_topic": "all-prices"},
            ]
        }
    )
    with pytest.raises(TopicCollisionError) as info:
        outbound.router()
    assert "'STOCK.STREAM'" in str(info.value) and "'BULLETIN.STREAM'" in str(info.value)
    assert info.value.first_name == info.value.second_name == "all-prices"
    # An instance built from an unvalidated config refuses to exist (start-up check).
    unchecked = KafkaPluginConfig.model_construct(outbound=outbound)
    with pytest.raises(TopicCollisionError):
        plugin.create("k1", unchecked)


def test_collision_is_a_config_validation_error_naming_both_sources() -> None:
    with pytest.raises(ValidationError) as info:
        KafkaPluginConfig.model_validate(
            {
                "outbound": {
                    "routes": [
                        {"stream": STOCK, "kafka_topic": "orders.eu"},
                        {"stream": "ORDERS", "kafka_topic": "orders_eu"},
                    ]
                }
            }
        )
    text = str(info.value)
    assert "'STOCK.STREAM'" in text and "'ORDERS'" in text
    assert "orders.eu" in text and "orders_eu" in text


def test_retained_and_live_topics_may_not_share_a_name() -> None:
    with pytest.raises(TopicCollisionError, match="retained publications"):
        TopicRouter([_route(STOCK, "x.{stream}", "x.{stream}")], _route("", "y.{stream}"))


def test_topic_templates_without_stream_collide_across_streams() -> None:
    with pytest.raises(TopicCollisionError):
        TopicRouter(
            [_route(STOCK, "p.{topic}"), _route("OTHER", "p.{topic}")], _route("", "y.{stream}")
        )


def test_filters_of_one_stream_may_share_its_topic() -> None:
    same = [
        Route(STOCK, "IBM/#", TopicTemplate.parse("s.{stream}"), TopicTemplate.parse("r.{stream}")),
        Route(
            STOCK, "ACME/#", TopicTemplate.parse("s.{stream}"), TopicTemplate.parse("r.{stream}")
        ),
    ]
    router = TopicRouter(same, same[0])
    assert router.static_topics() == {"s.STOCK.STREAM": False, "r.STOCK.STREAM": True}


def test_escaped_streams_do_not_collide_with_dot_named_ones() -> None:
    # "A.B" stays "A.B", "A_B" becomes "A_5FB": distinct even under Kafka's '.'=='_' rule.
    router = TopicRouter(
        [_route("A.B", "t.{stream}"), _route("A_B", "t.{stream}")], _route("", "z")
    )
    assert set(router.static_topics()) >= {"t.A.B", "t.A_5FB"}


def test_dynamic_topic_names_are_checked_as_they_appear() -> None:
    routes = [_route(STOCK, "p.{topic}", "r.{stream}")]
    router = TopicRouter(routes, routes[0])
    assert router.topic_for(routes[0], STOCK, "a.b", retained=False) == "p.a.b"
    # The same topic from another stream would land on the same name: refused.
    with pytest.raises(TopicCollisionError, match="'OTHER'"):
        router.topic_for(routes[0], "OTHER", "a.b", retained=False)
    assert router.topic_for(routes[0], STOCK, "a_b", retained=False) == "p.a_5Fb"


# ------------------------------------------------------------------ headers ----------


def test_put_time_is_milliseconds_since_the_epoch_utc() -> None:
    expected = calendar.timegm((2024, 2, 29, 23, 59, 58, 0, 0, 0)) * 1000 + 120
    assert put_time_ms("20240229", "23595812") == expected
    assert put_time_ms("", "") is None
    assert put_time_ms("2024022X", "23595812") is None


def test_usr_properties_come_from_the_usr_folder_only() -> None:
    usr = Element.from_pairs("usr", {"Colour": "Blue <&>"})
    usr.add("Count", 7, dt="i4")
    other = Element.from_pairs("mcd", {"Msd": "jms_text"})
    props, types = usr_properties([other.to_xml(), usr.to_xml(), "<usr><broken"])
    assert [(name, text, types.get(name, "")) for name, text in props] == [
        ("Colour", "Blue <&>", ""),
        ("Count", "7", "i4"),
    ]


def test_usr_headers_keep_repeated_names_and_dot_nested_groups() -> None:
    """One ``usr.<Name>`` header per property in message order, a repeated name once per
    occurrence (Kafka headers may repeat), a nested group's elements as dotted names (as
    IBM MQ names the message properties of a nested usr group)."""
    usr = Element("usr", children=[Element("x", text="1"), Element("x", text="2")])
    usr.children.append(Element("grp", children=[Element("a", text="A", attributes={"dt": "i4"})]))
    pub = Publication(
        stream="STOCK.STREAM", topics=["t"], payload=b"p", extra_folders=[usr.to_xml()]
    )
    headers = record_headers(sink_envelope(pub, sink="kafka"), "gw")
    usr_headers = [(k, v) for k, v in headers if k.startswith(("usr.", "mq.usrType."))]
    assert usr_headers == [
        ("usr.x", b"1"),
        ("usr.x", b"2"),
        ("usr.grp.a", b"A"),
        ("mq.usrType.grp.a", b"i4"),
    ]


def _delivery(
    pub: Publication, topic: str, *, retained: bool = False, deleted: bool = False
) -> Envelope:
    md = MQMD(
        msg_id=b"M" * 24,
        correl_id=b"C" * 24,
        put_date="20240101",
        put_time="00000000",
        persistence=1,
    )
    return sink_envelope(pub, topic, retained=retained, deleted=deleted, md=md, sink="kafka")


def _router() -> TopicRouter:
    return KafkaPluginConfig.model_validate(
        {"outbound": {"routes": [{"stream": STOCK}]}}
    ).outbound.router()


def test_live_retained_publication_goes_to_both_topics_with_the_same_key() -> None:
    pub = Publication(
        STOCK,
        ["IBM/Latest"],
        b"v",
        "MQSTR",
        pub_opts=0x2,
        user_pairs=[("MQPSX", "no"), ("Desk", "NY")],
    )
    records = outbound_records(_delivery(pub, "IBM/Latest"), _router(), "gw1")
    assert [(r.topic, r.key, r.value, r.compacted) for r in records] == [
        ("mqgw.STOCK.STREAM", b"IBM/Latest", b"v", False),
        ("mqgw-retained.STOCK.STREAM", b"IBM/Latest", b"v", True),
    ]
    h = dict(records[0].headers)
    assert h["mq.msgId"] == b"M" * 24
    assert h["mq.putTime"] == str(calendar.timegm((2024, 1, 1, 0, 0, 0, 0, 0, 0)) * 1000).encode()
    assert h["mq.retain"] == b"1" and h["mq.nv.Desk"] == b"NY" and "mq.nv.MQPSX" not in h
    assert h["mq.origin"] == b"gw1" and h["mq.pubHeader"] == b"MQRFH"


def test_retained_handed_over_on_subscribe_goes_only_to_the_compacted_topic() -> None:
    pub = Publication(STOCK, ["IBM/Latest"], b"v", "MQSTR")
    records = outbound_records(_delivery(pub, "IBM/Latest", retained=True), _router(), "gw1")
    assert [(r.topic, r.compacted) for r in records] == [("mqgw-retained.STOCK.STREAM", True)]


def test_deletion_is_a_tombstone_on_the_retained_topic() -> None:
    pub = Publication(STOCK, ["IBM/Latest"], b"", "")
    records = outbound_records(_delivery(pub, "IBM/Latest", deleted=True), _router(), "gw1")
    assert len(records) == 1
    r = records[0]
    assert (r.topic, r.key, r.value) == ("mqgw-retained.STOCK.STREAM", b"IBM/Latest", None)
    assert dict(r.headers) == {
        "mq.contract": b"1",
        "mq.stream": STOCK.encode(),
        "mq.topic": b"IBM/Latest",
        "mq.origin": b"gw1",
    }


def test_unconfigured_subscription_falls_back_to_the_default_templates() -> None:
    pub = Publication("OTHER.STREAM", ["x"], b"v", "MQSTR")
    records = outbound_records(_delivery(pub, "x"), _router(), "gw1")
    assert [r.topic for r in records] == ["mqgw.OTHER.STREAM"]


# ------------------------------------------------------------------ inbound ----------


def test_inbound_headers_win_over_key_and_route() -> None:
    route = InboundRoute("orders", STOCK, "Orders/Default", allowed_streams=frozenset({"OTHER"}))
    pub = inbound_publication(
        route,
        b"ignored/key",
        b"data",
        [
            ("mq.stream", b"OTHER"),
            ("mq.topic", b"A/B"),
            ("mq.format", b""),
            ("mq.encoding", b"273"),
            ("mq.ccsid", b"500"),
            ("mq.persistence", b"0"),
            ("mq.correlId", b"C" * 24),
            ("usr.Colour", b"Blue"),
        ],
        gateway_id="gw1",
        instance="k1",
    )
    assert pub is not None
    assert (pub.stream, pub.topic, pub.payload) == ("OTHER", "A/B", b"data")
    assert (pub.payload_format, pub.encoding, pub.ccsid) == ("", 273, 500)
    assert not pub.persistent and pub.correl_id == b"C" * 24
    assert dict(pub.properties) == {"Colour": "Blue"} and pub.origin == "k1"


def test_inbound_defaults_key_then_route_topic() -> None:
    route = InboundRoute("orders", STOCK, "Orders/Default", allowed_streams=frozenset({"S2"}))
    by_key = inbound_publication(route, b"K/1", b"x", [], gateway_id="gw1", instance="k1")
    assert by_key is not None and (by_key.stream, by_key.topic) == (STOCK, "K/1")
    assert (by_key.payload_format, by_key.encoding, by_key.ccsid) == ("MQSTR", 546, 1208)
    by_route = inbound_publication(route, None, b"x", [], gateway_id="gw1", instance="k1")
    assert by_route is not None and by_route.topic == "Orders/Default"
    prefixed = inbound_publication(
        route, b"$SYS/STREAM/S2/a/b", b"x", [], gateway_id="gw1", instance="k1"
    )
    assert prefixed is not None and (prefixed.stream, prefixed.topic) == ("S2", "a/b")


def test_inbound_skips_own_records_and_unusable_ones() -> None:
    route = InboundRoute("orders", STOCK)
    own = inbound_publication(
        route, b"a", b"x", [("mq.origin", b"gw1")], gateway_id="gw1", instance="k1"
    )
    assert own is None
    with pytest.raises(SkippedRecord):
        inbound_publication(route, None, b"x", [], gateway_id="gw1", instance="k1")
    with pytest.raises(SkippedRecord, match="tombstone"):
        inbound_publication(route, b"a", None, [], gateway_id="gw1", instance="k1")


def test_tombstone_on_a_retained_route_deletes() -> None:
    route = InboundRoute("prices", STOCK, retain=True)
    pub = inbound_publication(route, b"IBM/Latest", None, [], gateway_id="g", instance="k1")
    assert pub is not None and pub.delete and pub.retain and pub.topic == "IBM/Latest"


# ------------------------------------------------------------------ config/plugin ----


def test_defaults_bridge_the_default_stream() -> None:
    cfg = KafkaPluginConfig()
    assert [r.unified_topic for r in cfg.outbound.routes] == ["#"]
    named = KafkaPluginConfig.model_validate({"outbound": {"routes": [{"stream": STOCK}]}})
    assert named.outbound.routes[0].unified_topic == "$SYS/STREAM/STOCK.STREAM/#"


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"outbound": {"topic_template": "a/{stream}"}}, "refuses"),
        ({"outbound": {"routes": [{"kafka_topic": "{nope}"}]}}, "{nope}"),
        ({"inbound": {"topics": [{"kafka_topic": "bad/name"}]}}, "kafka_topic"),
        ({"bootstrap": "x"}, "bootstrap"),
        ({"outbound": {"routes": [{"stream": "S"}, {"stream": "S"}]}}, "twice"),
        ({"client_options": {"acks": 1}}, "acks"),
    ],
)
def test_config_errors_name_the_key(config: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        KafkaPluginConfig.model_validate(config)
    assert fragment in str(info.value)


def test_entry_point_names_the_plugin_object() -> None:
    (ep,) = [e for e in entry_points(group="mqgw.plugins") if e.name == "kafka"]
    loaded = ep.load()
    assert loaded is plugin and isinstance(loaded, Plugin)
    assert loaded.config_model is KafkaPluginConfig
    instance = loaded.create("k1", KafkaPluginConfig())
    assert isinstance(instance, PluginInstance) and instance.name == "k1"
    assert not instance.healthy()


def test_inbound_stream_outside_the_route_allow_list_is_refused_not_authorised() -> None:
    """Issue 15 bypass (a): a record cannot choose a stream its route does not allow."""
    route = InboundRoute("orders", STOCK, "Orders/Default")
    for headers, key in (
        ([("mq.stream", b"SYSTEM.BROKER.ADMIN.STREAM")], b"x"),
        ([], b"$SYS/STREAM/SYSTEM.BROKER.ADMIN.STREAM/x"),
    ):
        with pytest.raises(SkippedRecord, match="not allowed") as info:
            inbound_publication(route, key, b"v", headers, gateway_id="gw1", instance="k1")
        assert info.value.reason == 3081
    same = inbound_publication(
        route, b"k", b"v", [("mq.stream", STOCK.encode())], gateway_id="gw1", instance="k1"
    )
    assert same is not None and same.stream == STOCK


def _data_headers_fresh(e: Envelope) -> list[tuple[str, bytes]]:
    return [
        ("mq.format", e.payload_format.strip().encode()),
        ("mq.encoding", str(e.encoding).encode()),
        ("mq.ccsid", str(e.ccsid).encode()),
        ("mq.persistence", b"1" if e.persistent else b"0"),
        ("mq.pubHeader", e.publisher_header.encode()),
    ]


@given(
    fmt=st.sampled_from(["MQSTR   ", "", "MQHRF2  ", "X"]),
    encoding=st.sampled_from([273, 546, 785]),
    ccsid=st.sampled_from([1208, 819, 500]),
    persistence=st.sampled_from([0, 1, 2]),
    user_pairs=st.sampled_from([[], [("A", "1")]]),
)
def test_data_headers_from_the_cache_are_formatted_afresh(
    fmt: str, encoding: int, ccsid: int, persistence: int, user_pairs: list[tuple[str, str]]
) -> None:
    """The headers describing a publication's data come from a cache (a stream repeats
    them): each record still gets the ones its own envelope gives, in contract order."""
    pub = Publication(STOCK, ["a/b"], b"x", payload_format=fmt, payload_encoding=encoding,
                      payload_ccsid=ccsid, user_pairs=user_pairs)
    env = sink_envelope(pub, md=MQMD(persistence=persistence))
    for _ in range(2):
        headers = record_headers(env, "kafka")
        names = [n for n, _ in headers]
        start = names.index("mq.format")
        assert headers[start : start + 5] == _data_headers_fresh(env)
        assert names[start - 1] in ("mq.correlId", "mq.putTime", "mq.userId")
        headers[start] = ("changed", b"")  # a record's list is its own
    described = (env.payload_format, env.encoding, env.ccsid, env.persistent,
                 env.publisher_header)
    assert described in kafka_mapping._DATA_HEADERS  # formatted once, then reused
