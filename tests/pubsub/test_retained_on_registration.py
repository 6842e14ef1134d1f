"""A subscription registered on a literal topic is handed its retained publication by
looking that topic up, not by matching every retained topic of the stream (issue 31:
the 20-node network measured).

Why it matters: every proxy subscription a neighbour registers is a RegSub here, and a
new proxy is sent the retained publications it matches. Matching each registration
against every retained topic made a burst of P proxies cost O(P x R) at every hop; with
5,000 retained topics one RegSub took 15.5 ms instead of 0.26 ms (in-process, measured).
"""

from __future__ import annotations

import pytest

from gateway.pubsub import fanout
from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.store import MemoryStore
from gateway.pubsub.topics import Scheme, literal_topic, match_pattern
from tests.pubsub.test_pubsub_engine import publish, regsub
from tests.support.pubsub_messages import decode

RETAINED = 200


def test_literal_topics_of_both_schemes() -> None:
    assert literal_topic(Scheme.TOPIC, "a/b+c/d") == "a/b+c/d"
    assert literal_topic(Scheme.TOPIC, "a/+/d") is None
    assert literal_topic(Scheme.TOPIC, "a/#") is None
    assert literal_topic(Scheme.CHAR, "a/b") == "a/b"
    assert literal_topic(Scheme.CHAR, "a/%*") == "a/*"  # an escaped '*' is literal
    assert literal_topic(Scheme.CHAR, "a/*") is None
    assert literal_topic(Scheme.CHAR, "a/?") is None


def test_a_literal_registration_looks_its_retained_publication_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = PubSubEngine("QM1", MemoryStore())
    for i in range(RETAINED):
        publish(engine, f"prices/{i}", b"p%d" % i, "RetainPub")
    publish(engine, "odd/%*", b"star", "RetainPub")  # the topic odd/*
    engine.commit()
    matched: list[str] = []
    real = match_pattern

    def counting(scheme: Scheme, pattern: str, topic: str) -> bool:
        matched.append(topic)
        return real(scheme, pattern, topic)

    monkeypatch.setattr(fanout, "match_pattern", counting)

    out = regsub(engine, "prices/7")
    assert [decode(d.md, d.body).payload for d in out.deliveries] == [b"p7"]
    out = regsub(engine, "prices/none", queue="SUB.Q2")
    assert out.deliveries == []
    out = regsub(engine, "odd/%*", queue="SUB.Q3")  # the literal topic 'odd/*'
    assert [decode(d.md, d.body).payload for d in out.deliveries] == [b"star"]
    assert len(matched) <= 3, f"{len(matched)} retained topics matched one by one"

    matched.clear()
    out = regsub(engine, "prices/1*", queue="SUB.Q4")  # a wildcard still matches them all
    got = sorted(decode(d.md, d.body).payload for d in out.deliveries)
    assert got == sorted([b"p1", *(b"p%d" % i for i in range(10, 20)),
                          *(b"p%d" % i for i in range(100, 200))])
