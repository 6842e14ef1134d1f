"""Our StreamSupport publication and reading a neighbour's (the broker administration
metatopic ``MQ/<q_mgr>/StreamSupport``, PCF, :mod:`gateway.pubsub.admin_messages`).

Why a Publish command and not a direct put: the publication is retained by our own
engine, like any publication, so a neighbour that subscribes later still gets it (that
is how the legacy broker answers a joining broker), and it reaches every neighbour
subscribed to it through the engine's normal forwarding.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.pubsub.admin_messages import (
    AdminPublication,
    decode_admin_publication,
    encode_admin_publication,
    publish_timestamp,
)
from gateway.pubsub.outcome import OutboundMessage
from gateway.pubsub.streams import ADMIN_STREAM
from gateway.wire.constants import ENC_NATIVE, MsgType
from gateway.wire.errors import WireError
from gateway.wire.formats import FMT_RF_HEADER
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh import MQRFH, encode_rfh

__all__ = ["decode_stream_support", "read_stream_support", "stream_support_command"]


def stream_support_command(
    q_mgr: str, streams: Iterable[str], now: float | None = None
) -> OutboundMessage:
    """The MQRFH Publish (RetainPub) of our StreamSupport on our own admin stream
    queue: the PCF publication behind an MQRFH naming the metatopic."""
    pub = AdminPublication(
        "StreamSupport", q_mgr, tuple(sorted(set(streams))), True, publish_timestamp(now)
    )
    md, pcf = encode_admin_publication(pub)
    rfh = MQRFH(
        name_values=[
            ("MQPSCommand", "Publish"),
            ("MQPSStreamName", ADMIN_STREAM),
            ("MQPSTopic", pub.topic),
            ("MQPSPubOpts", "RetainPub"),
            ("MQPSPubOpts", "NoReg"),
        ],
        format=md.format,
        encoding=md.encoding,
        coded_char_set_id=md.coded_char_set_id,
    )
    command = MQMD(
        format=FMT_RF_HEADER,
        msg_type=MsgType.DATAGRAM,
        persistence=md.persistence,
        encoding=ENC_NATIVE,
        coded_char_set_id=1208,
    )
    return OutboundMessage("", ADMIN_STREAM, command, encode_rfh(rfh, ccsid=1208) + pcf)


def read_stream_support(md: MQMD, body: bytes) -> tuple[str, tuple[str, ...]] | None:
    """(broker queue manager, streams) of a StreamSupport publication as delivered to
    our subscription; None for any other message."""
    try:
        return decode_stream_support(md, body)
    except WireError:
        return None


def decode_stream_support(md: MQMD, body: bytes) -> tuple[str, tuple[str, ...]] | None:
    """:func:`read_stream_support`, but WireError when the message is no administration
    publication at all (the links dead-letter it); None for another kind."""
    pub = decode_admin_publication(md, body)
    if pub.kind != "StreamSupport":
        return None
    return pub.q_mgr, pub.names
