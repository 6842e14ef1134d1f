"""PUBLISH properties built once per distinct set (``plugins.mqtt.connection.
publish_properties``): the bytes on the wire equal paho's own Properties for the same
values, equal sets share one object, and the cache stays bounded."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from plugins.mqtt import connection
from plugins.mqtt.connection import Outgoing, publish_properties

_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8
)


def _reference(msg: Outgoing) -> bytes:
    return _reference_properties(msg).pack()  # type: ignore[no-any-return,no-untyped-call]


def _reference_properties(msg: Outgoing) -> Properties:
    p = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    if msg.response_topic:
        p.ResponseTopic = msg.response_topic
    if msg.correlation_data:
        p.CorrelationData = msg.correlation_data
    if msg.user_properties:
        p.UserProperty = list(msg.user_properties)
    if msg.expiry_interval is not None:
        p.MessageExpiryInterval = msg.expiry_interval
    if msg.utf8:
        p.PayloadFormatIndicator = 1
    return p


@settings(max_examples=200, deadline=None)
@given(
    pairs=st.lists(st.tuples(_text, _text), max_size=4),
    expiry=st.none() | st.integers(0, 2**32 - 1),
    utf8=st.booleans(),
    response_topic=_text,
    correlation=st.binary(max_size=8),
)
def test_packed_once_equals_paho_packing_each_time(
    pairs: list[tuple[str, str]],
    expiry: int | None,
    utf8: bool,
    response_topic: str,
    correlation: bytes,
) -> None:
    msg = Outgoing("t", b"x", 1, False, pairs, expiry, utf8, response_topic, correlation)
    props = publish_properties(msg)
    if not (pairs or expiry is not None or utf8 or response_topic or correlation):
        assert props is None
        return
    assert props is not None
    assert props.pack() == _reference(msg)  # type: ignore[no-untyped-call]
    # the same attributes as paho's own object (its str and json read them by name)
    assert str(props) == str(_reference_properties(msg))
    assert props.json() == _reference_properties(msg).json()  # type: ignore[no-untyped-call]
    assert bytes(super(type(props), props).pack()) == _reference(msg)  # type: ignore[misc]
    again = publish_properties(
        Outgoing("u", b"y", 1, True, list(pairs), expiry, utf8, response_topic, correlation)
    )
    assert again is props
    assert props.pack() == _reference(msg)  # type: ignore[no-untyped-call]


def test_pairs_given_as_lists_still_work() -> None:
    msg = Outgoing("t", b"x", 1, False, [["a", "b"]], None)  # type: ignore[list-item]
    props = publish_properties(msg)
    assert props is not None
    assert props.pack() == _reference(msg)  # type: ignore[no-untyped-call]


def test_the_cache_is_bounded() -> None:
    for n in range(connection._PUBLISH_PROPERTIES_MAX + 20):
        publish_properties(Outgoing("t", b"", 1, False, [("n", str(n))]))
    assert len(connection._PUBLISH_PROPERTIES) <= connection._PUBLISH_PROPERTIES_MAX


def test_a_large_set_is_not_cached_but_packs_the_same() -> None:
    """Review F9: the cache is bounded by size too: a set packing to more than 1 KiB
    (large user properties or correlation data) is built per message."""
    connection._PUBLISH_PROPERTIES.clear()
    big = Outgoing("t", b"x", 1, False, [("k", "v" * 2000)], None, False, "", b"c" * 500)
    props = publish_properties(big)
    assert props is not None and props.pack() == _reference(big)  # type: ignore[no-untyped-call]
    assert connection._PUBLISH_PROPERTIES == {}
    assert publish_properties(big) is not props  # built again, never pinned
    small = Outgoing("t", b"x", 1, False, [("k", "v" * 900)], None)
    assert publish_properties(small) is publish_properties(small)
    assert len(connection._PUBLISH_PROPERTIES) == 1
