"""A publication's topics, resolved once per (stream, header generation, topics) and
then taken from a bounded cache, are what resolving them afresh gives; a topic that
does not resolve is refused every time it comes; a publication for sinks alone formats
no broker PutDate/PutTime."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.pubsub import fanout, handlers
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.errors import CommandError
from gateway.pubsub.store import MemoryStore
from gateway.pubsub.streams import prefixed_topic, split_topic
from gateway.pubsub.topics import check_topic_pattern, decode_char_publication_topic
from tests.support.pubsub_messages import DEFAULT, rfh2_message

_levels = st.sampled_from(["a", "b", "%*", "*", "$SYS", "STREAM", "S1", "S2", "", "x%"])
_topics = st.lists(_levels, min_size=1, max_size=5).map("/".join)


def _fresh(stream: str, rfh: bool, raws: list[str], parm: str) -> object:
    try:
        topics = [
            split_topic(
                prefixed_topic(
                    stream,
                    decode_char_publication_topic(r, parm) if rfh else check_topic_pattern(r, parm),
                )
            )
            for r in raws
        ]
    except CommandError as exc:
        return (exc.reason, str(exc))
    if len({t.stream for t in topics}) != 1:
        return "spans streams"
    return (tuple(topics), tuple(t.topic for t in topics))


def _cached(stream: str, rfh: bool, raws: list[str], parm: str) -> object:
    try:
        return handlers._publication_topics(stream, rfh, raws, parm)
    except CommandError as exc:
        if "span" in str(exc):
            return "spans streams"
        return (exc.reason, str(exc))


@settings(max_examples=500, deadline=None)
@given(
    stream=st.sampled_from(["SYSTEM.BROKER.DEFAULT.STREAM", "S1", "S2"]),
    rfh=st.booleans(),
    raws=st.lists(_topics, max_size=3),
)
def test_cached_topics_equal_fresh_ones(stream: str, rfh: bool, raws: list[str]) -> None:
    parm = "MQPSTopic" if rfh else "Topic"
    fresh = _fresh(stream, rfh, raws, parm)
    for _ in range(2):  # resolved, then from the cache
        assert _cached(stream, rfh, raws, parm) == fresh


def test_a_publication_spanning_streams_is_refused_every_time() -> None:
    raws = ["$SYS/STREAM/S1/a", "$SYS/STREAM/S2/a"]
    for _ in range(2):
        with pytest.raises(CommandError, match="span"):
            handlers._publication_topics("SYSTEM.BROKER.DEFAULT.STREAM", False, raws, "Topic")


def test_the_cache_is_bounded() -> None:
    for n in range(handlers._PUB_TOPICS_MAX + 50):
        handlers._publication_topics("S1", False, [f"t/{n}"], "Topic")
    assert len(handlers._PUB_TOPICS) <= handlers._PUB_TOPICS_MAX
    long_topic = "x" * (handlers._PUB_TOPICS_MAX_CHARS + 1)
    handlers._publication_topics("S1", False, [long_topic], "Topic")
    assert not any(long_topic in key[2] for key in handlers._PUB_TOPICS)


def test_sink_only_fanout_formats_no_broker_stamp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sinks see the publisher's own PutDate/PutTime: a publication whose deliveries all
    go to sinks costs no broker stamp, and its deliveries carry the publisher's."""
    engine = PubSubEngine("QM1", MemoryStore(), clock=lambda: 1_700_000_000.0)
    engine.subscribe_sink("kafka", "p/#")
    engine.commit()

    def no_stamp(now: object = None) -> tuple[str, str]:
        raise AssertionError("broker stamp formatted for sink-only deliveries")

    monkeypatch.setattr(fanout, "put_date_time", no_stamp)
    msg = rfh2_message(DEFAULT, [("Command", "Publish"), ("Topic", "p/q")], b"x",
                       msg_id=b"M" * 24)
    msg.md.put_date, msg.md.put_time = "20240229", "23595812"  # as the queue manager stamps
    out = engine.handle(msg)
    (delivery,) = out.deliveries
    assert (delivery.md.put_date, delivery.md.put_time) == ("20240229", "23595812")
    assert delivery.md.msg_id == b"M" * 24
