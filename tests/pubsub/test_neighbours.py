"""gateway.pubsub.neighbours: proxy reference counting, the commands sent to neighbours
(decoded back with the broker's own decoder, and obeyed by a second engine), and the
per-kind topic mapping."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from gateway.pubsub.commands import CommandName, HeaderKind
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.inbound import decode_command_message
from gateway.pubsub.neighbours import (
    Neighbour,
    NeighbourKind,
    NeighbourRole,
    ProxyKey,
    admin_subscription,
    char_pattern_of,
    local_topic,
    neighbour_topic,
    probe_publication,
    proxy_command,
    topic_pattern_of,
    wanted_proxies,
)
from gateway.pubsub.options import PubOpt, RegOpt
from gateway.pubsub.outcome import InboundMessage
from gateway.pubsub.records import Destination, SubFormat, Subscription
from gateway.pubsub.store import MemoryStore
from gateway.pubsub.streams import (
    ADMIN_STREAM,
    CONTROL_QUEUE,
    DEFAULT_STREAM,
    INTER_BROKER_QUEUE,
)
from gateway.pubsub.topics import Scheme, match_pattern
from gateway.wire.constants import MsgType, Persistence
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2
from tests.support.pubsub_messages import decode, rfh_message

BULLETIN = "BULLETIN.STREAM"
SPORTS = "SPORTS.STREAM"


def neighbour(q_mgr: str = "BROKERA", kind: NeighbourKind = NeighbourKind.MQPUBSUB) -> Neighbour:
    return Neighbour(q_mgr, kind, NeighbourRole.CHILD, frozenset({DEFAULT_STREAM, BULLETIN}))


def sub(
    topic: str,
    *,
    stream: str = BULLETIN,
    q_mgr: str = "GW",
    queue: str = "APP.Q",
    sink: str = "",
    scheme: Scheme = Scheme.CHAR,
    suspended: bool = False,
) -> Subscription:
    return Subscription(
        stream=stream,
        topic=topic,
        scheme=scheme,
        destination=Destination(sink=sink) if sink else Destination(q_mgr, queue),
        fmt=SubFormat.SINK if sink else SubFormat.RFH,
        suspended=suspended,
    )


def regsub(queue: str, topic: str, stream: str = BULLETIN) -> InboundMessage:
    return rfh_message(
        CONTROL_QUEUE,
        [
            ("MQPSCommand", "RegSub"),
            ("MQPSStreamName", stream),
            ("MQPSTopic", topic),
            ("MQPSQName", queue),
        ],
        reply_to_q_mgr="GW",
    )


def deregsub(queue: str, topic: str, stream: str = BULLETIN) -> InboundMessage:
    return rfh_message(
        CONTROL_QUEUE,
        [
            ("MQPSCommand", "DeregSub"),
            ("MQPSStreamName", stream),
            ("MQPSTopic", topic),
            ("MQPSQName", queue),
        ],
        reply_to_q_mgr="GW",
    )


# ------------------------------------------------------------------ wanted_proxies ----


def test_two_local_subscribers_make_one_proxy_counted_twice_and_the_last_withdraws_it() -> None:
    engine = PubSubEngine("GW", MemoryStore())
    a = neighbour()
    key = ProxyKey(BULLETIN, "news", int(Scheme.CHAR))
    assert engine.handle(regsub("APP1.Q", "news")).reason == 0
    assert engine.handle(regsub("APP2.Q", "news")).reason == 0
    assert wanted_proxies(engine.subscriptions, a, {"BROKERA"}) == {key: 2}

    assert engine.handle(deregsub("APP1.Q", "news")).reason == 0
    assert wanted_proxies(engine.subscriptions, a, {"BROKERA"}) == {key: 1}
    assert engine.handle(deregsub("APP2.Q", "news")).reason == 0
    wanted = wanted_proxies(engine.subscriptions, a, {"BROKERA"})
    assert key not in wanted
    assert wanted == {}


def test_counts_sinks_and_other_neighbours_proxies_but_not_the_neighbours_own() -> None:
    a = neighbour("BROKERA")
    subs = [
        sub("news", sink="kafka-1"),
        sub("news", q_mgr="BROKERB", queue=BULLETIN),  # B's proxy at us: propagates to A
        sub("news", q_mgr="BROKERA", queue=BULLETIN),  # A's own proxy: never echoed to A
    ]
    wanted = wanted_proxies(subs, a, {"BROKERA", "BROKERB"})
    assert wanted == {ProxyKey(BULLETIN, "news", int(Scheme.CHAR)): 2}
    # seen from B, A's proxy counts and B's own does not
    b = neighbour("BROKERB")
    assert wanted_proxies(subs, b, {"BROKERA", "BROKERB"}) == {
        ProxyKey(BULLETIN, "news", int(Scheme.CHAR)): 2
    }


def test_excludes_unshared_streams_suspended_metatopics_probes_and_admin() -> None:
    a = neighbour()
    subs = [
        sub("score", stream=SPORTS),  # A lacks SPORTS.STREAM
        sub("news", suspended=True),
        sub("MQ/BROKERA/StreamSupport", stream=DEFAULT_STREAM),
        sub("MQGW/Probe/GW/1234", stream=DEFAULT_STREAM),
        sub("anything", stream=ADMIN_STREAM),
        # another neighbour's administrative subscription (to the inter-broker queue)
        sub("status", stream=DEFAULT_STREAM, q_mgr="BROKERB", queue=INTER_BROKER_QUEUE),
        sub("kept", stream=DEFAULT_STREAM),
    ]
    assert wanted_proxies(subs, a, {"BROKERA", "BROKERB"}) == {
        ProxyKey(DEFAULT_STREAM, "kept", int(Scheme.CHAR)): 1
    }
    resumed = dataclasses.replace(subs[1], suspended=False)
    assert wanted_proxies([resumed], a, set()) == {ProxyKey(BULLETIN, "news", int(Scheme.CHAR)): 1}


def test_patterns_are_translated_to_the_neighbours_scheme() -> None:
    subs = [
        sub("news/#", scheme=Scheme.TOPIC, sink="mqtt-1"),
        sub("sport*", scheme=Scheme.CHAR),
        sub("a/b", scheme=Scheme.TOPIC, sink="kafka-1"),
    ]
    legacy = wanted_proxies(subs, neighbour(kind=NeighbourKind.MQPUBSUB), set())
    assert legacy == {
        ProxyKey(BULLETIN, "news*", int(Scheme.CHAR)): 1,
        ProxyKey(BULLETIN, "sport*", int(Scheme.CHAR)): 1,
        ProxyKey(BULLETIN, "a/b", int(Scheme.CHAR)): 1,
    }
    gateway = wanted_proxies(subs, neighbour(kind=NeighbourKind.GATEWAY), set())
    assert gateway == {
        ProxyKey(BULLETIN, "news/#", int(Scheme.TOPIC)): 1,
        ProxyKey(BULLETIN, "#", int(Scheme.TOPIC)): 1,
        ProxyKey(BULLETIN, "a/b", int(Scheme.TOPIC)): 1,
    }


def test_two_topic_patterns_with_one_char_form_share_one_counted_proxy() -> None:
    subs = [sub("+", scheme=Scheme.TOPIC, sink="s1"), sub("#", scheme=Scheme.TOPIC, sink="s2")]
    assert wanted_proxies(subs, neighbour(), set()) == {
        ProxyKey(BULLETIN, "*", int(Scheme.CHAR)): 2
    }


_level = st.sampled_from(["a", "b", "c", "", "x*y", "q%"])
_topic = st.lists(_level, min_size=1, max_size=4).map("/".join).filter(bool)
_tpattern = (
    st.lists(st.sampled_from(["a", "b", "", "+", "#", "x*y"]), min_size=1, max_size=4)
    .map("/".join)
    .filter(bool)
)
_cpattern = st.lists(
    st.sampled_from(["a", "b", "/", "*", "?", "%*", "#", "+"]), min_size=1, max_size=6
).map("".join)


@given(_tpattern, _topic)
def test_char_form_of_a_topic_pattern_matches_at_least_as_much(pattern: str, topic: str) -> None:
    if match_pattern(Scheme.TOPIC, pattern, topic):
        assert match_pattern(Scheme.CHAR, char_pattern_of(pattern), topic)


@given(_cpattern, _topic)
def test_topic_form_of_a_char_pattern_matches_at_least_as_much(pattern: str, topic: str) -> None:
    if match_pattern(Scheme.CHAR, pattern, topic):
        assert match_pattern(Scheme.TOPIC, topic_pattern_of(pattern), topic)


def test_literal_patterns_translate_exactly() -> None:
    assert char_pattern_of("a/b*c") == "a/b%*c"
    assert topic_pattern_of("a/b%*c") == "a/b*c"
    assert char_pattern_of("a/#/b") == "a*/b"
    assert char_pattern_of("#/b") == "*b"
    assert char_pattern_of("#/#/a") == "*a"  # found by hypothesis: topic "a" matches


# ------------------------------------------------------------------ commands ---------


def test_proxy_regsub_to_a_legacy_neighbour_decodes_to_the_intended_mqrfh_regsub() -> None:
    key = ProxyKey(BULLETIN, "news*", int(Scheme.CHAR))
    msg = proxy_command(neighbour(), key, register=True, self_q_mgr="GW", msg_id=b"ID1")
    assert (msg.q_mgr, msg.queue) == ("BROKERA", CONTROL_QUEUE)
    md = msg.md
    assert md.format == FMT_RF_HEADER
    assert md.msg_type == MsgType.REQUEST
    assert md.persistence == Persistence.PERSISTENT
    assert (md.reply_to_q, md.reply_to_q_mgr) == (INTER_BROKER_QUEUE, "GW")
    assert md.msg_id == b"ID1".ljust(24, b"\x00")
    parsed = decode_command_message(md, msg.body)
    cmd = parsed.command
    assert (cmd.name, cmd.header) == (CommandName.REG_SUB, HeaderKind.RFH)
    assert (cmd.q_mgr_name, cmd.q_name, cmd.stream) == ("GW", BULLETIN, BULLETIN)
    assert cmd.topics == ["news*"]
    # InformIfRet: a legacy broker flags its retained publications, so they stay retained
    assert cmd.reg_opts == RegOpt.PERSISTENT_AS_PUBLISH | RegOpt.INFORM_IF_RETAINED
    assert cmd.correl_id is None

    dereg = proxy_command(neighbour(), key, register=False, self_q_mgr="GW", msg_id=b"ID2")
    cmd = decode_command_message(dereg.md, dereg.body).command
    assert cmd.name is CommandName.DEREG_SUB
    assert (cmd.q_mgr_name, cmd.q_name, cmd.stream, cmd.topics) == (
        "GW",
        BULLETIN,
        BULLETIN,
        ["news*"],
    )
    assert cmd.reg_opts == RegOpt.NONE


def test_proxy_regsub_to_a_gateway_is_mqrfh2_with_the_stream_prefix() -> None:
    key = ProxyKey(BULLETIN, "news/#", int(Scheme.TOPIC))
    gw = neighbour("GW2", NeighbourKind.GATEWAY)
    msg = proxy_command(gw, key, register=True, self_q_mgr="GW", msg_id=b"ID3")
    assert msg.md.format == FMT_RF_HEADER_2
    cmd = decode_command_message(msg.md, msg.body).command
    assert (cmd.name, cmd.header) == (CommandName.REG_SUB, HeaderKind.RFH2)
    assert cmd.topics == ["$SYS/STREAM/BULLETIN.STREAM/news/#"]
    assert (cmd.q_mgr_name, cmd.q_name) == ("GW", BULLETIN)
    assert cmd.reg_opts == RegOpt.PERSISTENT_AS_PUBLISH


def test_neighbour_engine_obeys_proxy_commands_with_the_gateways_identity() -> None:
    """A broker (here the engine as a stand-in) registers the proxy as (GW, stream) on
    the right stream, answers it on the inter-broker queue, and deregisters it."""
    a = PubSubEngine("BROKERA", MemoryStore())
    key = ProxyKey(BULLETIN, "news*", int(Scheme.CHAR))
    for kind in (NeighbourKind.MQPUBSUB, NeighbourKind.GATEWAY):
        n = neighbour(kind=kind)
        msg = proxy_command(
            n,
            key
            if kind is NeighbourKind.MQPUBSUB
            else ProxyKey(BULLETIN, "news/#", int(Scheme.TOPIC)),
            register=True,
            self_q_mgr="GW",
            msg_id=b"R1",
        )
        out = a.handle(InboundMessage(CONTROL_QUEUE, msg.md, msg.body))
        assert (out.comp_code, out.reason) == (0, 0)
        assert out.response is not None
        assert (out.response.q_mgr, out.response.queue) == ("GW", INTER_BROKER_QUEUE)
        assert out.response.md.correl_id == b"R1".ljust(24, b"\x00")
        [registered] = [s for s in a.subscriptions if s.destination.q_mgr == "GW"]
        assert registered.destination == Destination("GW", BULLETIN)
        assert registered.stream == BULLETIN
        assert registered.correl_id == b""
        assert registered.reg_opts & RegOpt.PERSISTENT_AS_PUBLISH
        undo = proxy_command(
            n,
            ProxyKey(registered.stream, registered.topic, registered.scheme)
            if kind is NeighbourKind.GATEWAY
            else key,
            register=False,
            self_q_mgr="GW",
            msg_id=b"D1",
        )
        out = a.handle(InboundMessage(CONTROL_QUEUE, undo.md, undo.body))
        assert (out.comp_code, out.reason) == (0, 0)
        assert a.subscriptions == []


def test_admin_subscription_targets_the_inter_broker_queue_on_the_admin_stream() -> None:
    topic = "MQ/" + "BROKERA".ljust(48) + "/StreamSupport"
    msg = admin_subscription(neighbour(), topic, register=True, self_q_mgr="GW", msg_id=b"A1")
    assert (msg.q_mgr, msg.queue) == ("BROKERA", CONTROL_QUEUE)
    assert msg.md.reply_to_q == INTER_BROKER_QUEUE
    cmd = decode_command_message(msg.md, msg.body).command
    assert (cmd.name, cmd.stream, cmd.topics) == (CommandName.REG_SUB, ADMIN_STREAM, [topic])
    assert (cmd.q_mgr_name, cmd.q_name) == ("GW", INTER_BROKER_QUEUE)
    # a broker accepts it and records the subscription on the admin stream
    a = PubSubEngine("BROKERA", MemoryStore())
    out = a.handle(InboundMessage(CONTROL_QUEUE, msg.md, msg.body))
    assert (out.comp_code, out.reason) == (0, 0)
    [s] = a.subscriptions
    assert (s.stream, s.topic, s.destination) == (
        ADMIN_STREAM,
        topic,
        Destination("GW", INTER_BROKER_QUEUE),
    )
    gw = neighbour("GW2", NeighbourKind.GATEWAY)
    msg = admin_subscription(gw, "MQGW/Probe/GW/42", register=False, self_q_mgr="GW", msg_id=b"")
    cmd = decode_command_message(msg.md, msg.body).command
    assert cmd.name is CommandName.DEREG_SUB
    assert cmd.topics == ["$SYS/STREAM/SYSTEM.BROKER.ADMIN.STREAM/MQGW/Probe/GW/42"]


def test_probe_publication_is_an_anonymous_publish_that_reaches_the_probe_subscriber() -> None:
    topic = "MQGW/Probe/GW/nonce-1"
    msg = probe_publication("BROKERB", topic, self_q_mgr="GW")
    assert (msg.q_mgr, msg.queue) == ("BROKERB", ADMIN_STREAM)
    assert msg.md.msg_type == MsgType.DATAGRAM
    assert msg.md.reply_to_q == ""
    cmd = decode_command_message(msg.md, msg.body).command
    assert (cmd.name, cmd.stream, cmd.topics) == (CommandName.PUBLISH, ADMIN_STREAM, [topic])
    assert cmd.q_name is None and cmd.q_mgr_name is None
    assert cmd.pub_opts & PubOpt.NO_REGISTRATION
    b = PubSubEngine("BROKERB", MemoryStore())
    reg = admin_subscription(
        neighbour("BROKERB"), topic, register=True, self_q_mgr="GW", msg_id=b"P1"
    )
    assert b.handle(InboundMessage(CONTROL_QUEUE, reg.md, reg.body)).reason == 0
    out = b.handle(InboundMessage(ADMIN_STREAM, msg.md, msg.body))
    assert out.response is None
    [d] = out.deliveries
    assert d.destination == Destination("GW", INTER_BROKER_QUEUE)
    assert decode(d.md, d.body).topic == topic
    assert b.publishers == []


# ------------------------------------------------------------------ topic mapping ----


def test_neighbour_topic_per_kind() -> None:
    assert (
        neighbour_topic(NeighbourKind.GATEWAY, BULLETIN, "a/b") == "$SYS/STREAM/BULLETIN.STREAM/a/b"
    )
    assert (
        neighbour_topic(NeighbourKind.MQPUBSUB, BULLETIN, "a/b")
        == "$SYS/STREAM/BULLETIN.STREAM/a/b"
    )
    assert neighbour_topic(NeighbourKind.MQV7, BULLETIN, "a/b") == "BULLETIN.STREAM/a/b"
    for kind in NeighbourKind:
        assert neighbour_topic(kind, DEFAULT_STREAM, "a/b") == "a/b"


def test_local_topic_of_an_mqv7_topic_needs_a_known_stream() -> None:
    assert local_topic(NeighbourKind.MQV7, "BULLETIN.STREAM/a", streams={BULLETIN}) == (
        BULLETIN,
        "a",
    )
    assert local_topic(NeighbourKind.MQV7, "OTHER/a", streams={BULLETIN}) == (
        DEFAULT_STREAM,
        "OTHER/a",
    )


_stream = st.sampled_from([DEFAULT_STREAM, BULLETIN, SPORTS])
_ltopic = st.lists(st.sampled_from(["a", "b", "x y", "", "STOCK"]), min_size=1, max_size=3).map(
    "/".join
)


@given(st.sampled_from(list(NeighbourKind)), _stream, _ltopic)
def test_local_topic_inverts_neighbour_topic(kind: NeighbourKind, stream: str, topic: str) -> None:
    mapped = neighbour_topic(kind, stream, topic)
    assert local_topic(kind, mapped, streams={BULLETIN, SPORTS}) == (stream, topic)


_text_topic = st.text(alphabet='ab /*?%"=#+é', min_size=1, max_size=12).filter(
    lambda t: t.strip() == t and not t.startswith("MQ")
)


@given(
    st.sampled_from(list(NeighbourKind)), st.sampled_from([DEFAULT_STREAM, BULLETIN]), _text_topic
)
def test_a_proxy_registered_at_a_neighbour_matches_what_the_local_subscriber_wants(
    kind: NeighbourKind, stream: str, topic: str
) -> None:
    """Round trip through the wire: local subscription -> proxy key -> RegSub bytes ->
    the neighbour's subscription, which must match every topic the local one does."""
    local = sub(topic, stream=stream, scheme=Scheme.TOPIC, sink="mqtt-1")
    [key] = wanted_proxies([local], neighbour(kind=kind), set())
    msg = proxy_command(neighbour(kind=kind), key, register=True, self_q_mgr="GW", msg_id=b"H")
    remote = PubSubEngine("BROKERA", MemoryStore())
    out = remote.handle(InboundMessage(CONTROL_QUEUE, msg.md, msg.body))
    assert (out.comp_code, out.reason) == (0, 0), out.reason
    [registered] = remote.subscriptions
    assert registered.stream == stream
    assert registered.destination == Destination("GW", stream)
    if "#" not in topic.split("/") and "+" not in topic.split("/"):
        assert match_pattern(registered.scheme, registered.topic, topic)
