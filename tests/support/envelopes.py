"""Envelopes built the way the runtime builds them: an engine sink delivery converted by
``gateway.runtime.envelopes.envelope_of`` (so plugin mapping tests also prove the
conversion)."""

from __future__ import annotations

from gateway.plugin_api import DEFAULT_STREAM, Envelope
from gateway.pubsub.outcome import Delivery
from gateway.pubsub.records import Destination, Publication
from gateway.runtime.envelopes import envelope_of
from gateway.wire.mqmd import MQMD


def sink_envelope(
    pub: Publication,
    topic: str | None = None,
    *,
    retained: bool = False,
    deleted: bool = False,
    md: MQMD | None = None,
    sink: str = "sink",
    topic_filter: str = "#",
) -> Envelope:
    """The envelope of ``pub`` delivered to ``sink`` on ``topic`` (within its stream;
    default: its first topic) through a subscription to ``topic_filter``."""
    seen = topic if topic is not None else pub.topics[0]
    prefix = "" if pub.stream == DEFAULT_STREAM else f"$SYS/STREAM/{pub.stream}/"
    delivery = Delivery(
        Destination(sink=sink),
        (pub.stream, 2, topic_filter, "", "", sink, b""),
        md if md is not None else MQMD(),
        pub.payload,
        pub,
        prefix + seen,
        retained,
        deleted,
    )
    return envelope_of(delivery)
