"""The forwarder's envelope cache (``gateway.runtime.backlog_format.EnvelopeCache``):
what the service remembers at put time is exactly what decoding the backlog message
gives, a miss (restart, eviction, foreign message) falls back to decoding, and the map
stays bounded."""

from __future__ import annotations

import asyncio
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.plugin_api import Envelope
from gateway.pubsub.outcome import Delivery
from gateway.pubsub.records import Destination, Publication
from gateway.runtime.backlog_format import (
    EnvelopeCache,
    backlog_msg_id,
    decode_backlog_message,
    encode_backlog_message,
)
from gateway.runtime.pubsub_service.config import BrokerConfig
from gateway.runtime.pubsub_service.counters import ServiceCounters
from gateway.runtime.pubsub_service.sink_backlogs import SinkBacklogs
from gateway.wire.constants import Persistence
from gateway.wire.mqmd import MQMD

B1, B99 = b"1", b"9" * 99


def _env(n: int, size: int = 10) -> Envelope:
    return Envelope(stream="S", topic=f"t/{n}", payload=b"x" * size)


def test_msg_ids_are_24_bytes_and_distinct() -> None:
    ids = {backlog_msg_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == 24 for i in ids)
    assert all(i[4:8] == os.getpid().to_bytes(4, "big") for i in ids)


def test_a_forked_child_draws_other_msg_ids_than_its_parent() -> None:
    """Review F8: a child of ``os.fork`` does not repeat its parent's MsgIds."""
    backlog_msg_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent, then out at once
        try:
            os.write(write, b"".join(backlog_msg_id() for _ in range(3)))
        finally:
            os._exit(0)
    os.close(write)
    try:
        data = b""
        while len(data) < 72:
            chunk = os.read(read, 72)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    child = {data[k : k + 24] for k in range(0, 72, 24)}
    mine = {backlog_msg_id() for _ in range(3)}
    assert len(child) == 3 and not child & mine
    assert all(i[4:8] == pid.to_bytes(4, "big") for i in child)
    assert {i[:12] for i in child}.isdisjoint({i[:12] for i in mine})


def test_take_hits_until_discarded() -> None:
    cache = EnvelopeCache()
    env = _env(1)
    cache.put(b"a" * 24, B99, env)
    assert cache.take(b"a" * 24, B99) is env
    assert cache.take(b"a" * 24, B99) is env  # a backout gets it again
    cache.discard([b"a" * 24, b"unknown"])
    assert cache.take(b"a" * 24, B99) is None
    assert len(cache) == 0
    assert (cache.hits, cache.misses) == (2, 1)


def test_a_body_of_another_length_is_a_miss() -> None:
    cache = EnvelopeCache()
    cache.put(b"a" * 24, B99, _env(1))
    assert cache.take(b"a" * 24, b"b" * 100) is None


def test_a_body_of_the_same_length_but_other_bytes_is_a_miss() -> None:
    """Review F8: another message that came with the same MsgId and a body of the same
    length (a requeue by a DLQ handler, a forked process's id) is decoded, never
    served the cached envelope."""
    cache = EnvelopeCache()
    env = _env(1)
    body = encode_backlog_message(env)
    cache.put(b"a" * 24, body, env)
    other = encode_backlog_message(_env(2))
    assert len(other) == len(body) and other != body
    assert cache.take(b"a" * 24, other) is None
    assert cache.take(b"a" * 24, bytes(bytearray(body))) is env  # equal, not identical
    assert cache.take(b"a" * 24, body) is env


def test_bounded_by_entries_oldest_evicted_first() -> None:
    cache = EnvelopeCache(max_entries=3)
    for n in range(5):
        cache.put(bytes([n]) * 24, B1, _env(n))
    assert len(cache) == 3
    assert cache.take(bytes([0]) * 24, B1) is None
    assert cache.take(bytes([1]) * 24, B1) is None
    assert cache.take(bytes([4]) * 24, B1) is not None


def test_bounded_by_payload_bytes() -> None:
    cache = EnvelopeCache(max_entries=100, max_bytes=250)
    for n in range(5):
        cache.put(bytes([n]) * 24, B1, _env(n, 100))
    assert len(cache) == 2
    assert cache.take(bytes([4]) * 24, B1) is not None
    cache.put(b"big" * 8, B1, _env(9, 251))  # larger than the whole cache: not kept
    assert cache.take(b"big" * 8, B1) is None
    cache.discard([bytes([3]) * 24, bytes([4]) * 24])
    assert len(cache) == 0
    cache.put(b"z" * 24, B1, _env(7, 250))
    assert len(cache) == 1


def test_a_disabled_cache_keeps_nothing() -> None:
    cache = EnvelopeCache(0)
    cache.put(b"a" * 24, B1, _env(1))
    assert cache.take(b"a" * 24, B1) is None


class _QM:
    """put_of needs no queue manager beyond the name registration."""


_text = st.text(max_size=12)
_name = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,8}", fullmatch=True)


@settings(max_examples=150, deadline=None)
@given(
    topic=st.from_regex(r"[a-z]{1,5}(/[a-z]{1,5}){0,2}", fullmatch=True),
    payload=st.binary(max_size=64),
    props=st.lists(st.tuples(_name, _text), max_size=4),
    pairs=st.lists(st.tuples(_name, _text), max_size=3),
    persistent=st.booleans(),
    retained=st.booleans(),
    msg_id=st.binary(max_size=24),
    user=_text,
)
def test_put_of_caches_what_decoding_the_backlog_message_gives(
    topic: str,
    payload: bytes,
    props: list[tuple[str, str]],
    pairs: list[tuple[str, str]],
    persistent: bool,
    retained: bool,
    msg_id: bytes,
    user: str,
) -> None:
    from xml.sax.saxutils import escape

    usr = "".join(f"<{k}>{escape(v)}</{k}>" for k, v in props)
    pub = Publication(
        stream="SYSTEM.BROKER.DEFAULT.STREAM",
        topics=[topic],
        payload=payload,
        payload_format="MQSTR",
        user_pairs=pairs,
        extra_folders=[f"<usr>{usr}</usr>"] if props else [],
        msg_id=msg_id,
        user_identifier=user,
        put_date="20261126",
        put_time="13000000",
    )
    md = MQMD(persistence=Persistence.PERSISTENT if persistent else Persistence.NOT_PERSISTENT)
    d = Delivery(
        Destination(sink="k"),
        (pub.stream, 2, "#", "", "", "k", b""),
        md,
        payload,
        pub,
        topic,
        retained,
        False,
    )
    backlogs = SinkBacklogs(_QM(), BrokerConfig(), asyncio.Event(), ServiceCounters())  # type: ignore[arg-type]
    backlogs.sinks["k"] = object()  # type: ignore[assignment]
    backlogs.queues["k"] = "SYSTEM.MQGW.SINK.k"
    backlogs.envelopes["k"] = EnvelopeCache()
    put = backlogs.put_of("k", d)
    cached = backlogs.envelopes["k"].take(put.md.msg_id, put.body)
    assert cached is not None
    assert len(put.md.msg_id) == 24
    decoded = decode_backlog_message(put.body)
    assert cached == decoded
    assert encode_backlog_message(cached) == put.body
