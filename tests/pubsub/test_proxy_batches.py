"""Proxy commands of several topics (gateway.pubsub.neighbours): how a burst of proxy
subscriptions is cut into commands (:func:`proxy_batches`), and that a RegSub/DeregSub
whose Topic parameter repeats (reference §5.4, §5.5) decodes back to exactly its
topics with the broker's own decoder and is obeyed whole by a second engine, in MQRFH
(legacy brokers, V7 queue managers) and MQRFH2 (gateways)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.pubsub.commands import CommandName
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.inbound import decode_command_message
from gateway.pubsub.neighbours import (
    MAX_TOPIC_BYTES_PER_COMMAND,
    MAX_TOPICS_PER_COMMAND,
    Neighbour,
    NeighbourKind,
    NeighbourRole,
    ProxyKey,
    neighbour_topic,
    proxy_batch_command,
    proxy_batches,
)
from gateway.pubsub.outcome import InboundMessage
from gateway.pubsub.store import MemoryStore
from gateway.pubsub.streams import CONTROL_QUEUE, DEFAULT_STREAM
from gateway.pubsub.topics import Scheme
from gateway.wire.constants import CompCode

BULLETIN = "BULLETIN.STREAM"
SPORTS = "SPORTS.STREAM"
STREAMS = (DEFAULT_STREAM, BULLETIN, SPORTS)

#: Topic text as subscribers write it: any printable characters but the wildcards and
#: the escape of either scheme (which the neighbour scheme's own mapping handles).
topic_text = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x2FFF, blacklist_characters="%*?#+"),
    min_size=1,
    max_size=60,
).filter(lambda t: t.strip() == t and "//" not in t)


def neighbour(kind: NeighbourKind) -> Neighbour:
    return Neighbour("NB", kind, NeighbourRole.CHILD, frozenset(STREAMS))


def scheme_of(kind: NeighbourKind) -> int:
    return int(Scheme.TOPIC if kind is NeighbourKind.GATEWAY else Scheme.CHAR)


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(list(NeighbourKind)),
    stream=st.sampled_from(STREAMS),
    topics=st.lists(topic_text, min_size=1, max_size=40, unique=True),
    register=st.booleans(),
)
def test_a_multi_topic_proxy_command_decodes_to_exactly_its_topics(
    kind: NeighbourKind, stream: str, topics: list[str], register: bool
) -> None:
    keys = [ProxyKey(stream, t, scheme_of(kind)) for t in topics]
    msg = proxy_batch_command(
        neighbour(kind), keys, register=register, self_q_mgr="GW", msg_id=b"M1"
    )
    cmd = decode_command_message(msg.md, msg.body).command
    assert cmd.name is (CommandName.REG_SUB if register else CommandName.DEREG_SUB)
    if kind is NeighbourKind.GATEWAY:  # MQRFH2: the stream within the topic
        assert cmd.topics == [neighbour_topic(kind, stream, t) for t in topics]
    else:  # MQRFH: MQPSStreamName, the topics as they are
        assert cmd.topics == topics
        assert cmd.stream == stream
    assert (cmd.q_mgr_name, cmd.q_name) == ("GW", stream)
    # the one-topic command is the same command with one topic
    [one] = proxy_batches(keys[:1])
    single = proxy_batch_command(
        neighbour(kind), one, register=register, self_q_mgr="GW", msg_id=b"M1"
    )
    assert decode_command_message(single.md, single.body).command.topics == cmd.topics[:1]


@settings(max_examples=100, deadline=None)
@given(
    keys=st.lists(
        st.builds(
            ProxyKey,
            st.sampled_from(STREAMS),
            st.text(min_size=1, max_size=300),
            st.sampled_from([int(Scheme.CHAR), int(Scheme.TOPIC)]),
        ),
        max_size=400,
    ),
    max_topics=st.integers(1, 120),
    max_bytes=st.integers(1, 4000),
)
def test_proxy_batches_keep_every_key_once_in_order_within_their_bounds(
    keys: list[ProxyKey], max_topics: int, max_bytes: int
) -> None:
    batches = proxy_batches(keys, max_topics=max_topics, max_topic_bytes=max_bytes)
    assert sorted(k for b in batches for k in b) == sorted(keys)
    for b in batches:
        assert b
        assert len({(k.stream, k.scheme) for k in b}) == 1
        assert len(b) <= max_topics
        size = sum(len(k.topic.encode("utf-8", "surrogatepass")) for k in b)
        assert len(b) == 1 or size <= max_bytes
    # order kept within each (stream, scheme)
    for group in {(k.stream, k.scheme) for k in keys}:
        assert [k for b in batches for k in b if (k.stream, k.scheme) == group] == [
            k for k in keys if (k.stream, k.scheme) == group
        ]


def test_a_burst_of_one_stream_is_cut_at_the_default_bounds() -> None:
    keys = [ProxyKey(BULLETIN, f"burst/{i}", int(Scheme.TOPIC)) for i in range(250)]
    assert [len(b) for b in proxy_batches(keys)] == [100, 100, 50]
    long = [ProxyKey(BULLETIN, f"{i}/" + "x" * 10_000, int(Scheme.TOPIC)) for i in range(7)]
    batches = proxy_batches(long)
    assert all(
        sum(len(k.topic) for k in b) <= MAX_TOPIC_BYTES_PER_COMMAND for b in batches
    )
    assert [len(b) for b in batches] == [3, 3, 1]
    assert MAX_TOPICS_PER_COMMAND == 100


def test_a_neighbour_engine_registers_and_withdraws_every_topic_of_one_command() -> None:
    """What a gateway or a legacy stand-in (the same engine) does with one proxy RegSub
    of many topics: every topic registered in one unit, one OK response; the DeregSub
    of the same topics withdraws all of them."""
    for kind in (NeighbourKind.MQPUBSUB, NeighbourKind.GATEWAY):
        engine = PubSubEngine("NB", MemoryStore())
        keys = [ProxyKey(BULLETIN, f"burst/{i}", scheme_of(kind)) for i in range(100)]
        msg = proxy_batch_command(
            neighbour(kind), keys, register=True, self_q_mgr="GW", msg_id=b"R1"
        )
        out = engine.handle(InboundMessage(CONTROL_QUEUE, msg.md, msg.body))
        assert (out.comp_code, out.reason) == (CompCode.OK, 0)
        assert out.response is not None
        assert sorted(s.topic for s in engine.subscriptions) == sorted(k.topic for k in keys)
        undo = proxy_batch_command(
            neighbour(kind), keys, register=False, self_q_mgr="GW", msg_id=b"D1"
        )
        out = engine.handle(InboundMessage(CONTROL_QUEUE, undo.md, undo.body))
        assert (out.comp_code, out.reason) == (CompCode.OK, 0)
        assert engine.subscriptions == []
