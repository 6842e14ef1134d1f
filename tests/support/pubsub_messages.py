"""Builders and readers of pub/sub command messages for the engine tests.

Messages are built with the real wire codecs (gateway.wire), exactly as a legacy MQRFH
or MQRFH2 application would put them, and deliveries are decoded the same way.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from gateway.pubsub.outcome import InboundMessage
from gateway.wire.constants import MsgType
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2, FMT_STRING
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh import MQRFH, decode_rfh, encode_rfh
from gateway.wire.rfh2 import MQRFH2, decode_rfh2, encode_rfh2

CONTROL = "SYSTEM.BROKER.CONTROL.QUEUE"
DEFAULT = "SYSTEM.BROKER.DEFAULT.STREAM"
_ids = itertools.count(1)


def new_msg_id() -> bytes:
    return b"TESTMSG" + next(_ids).to_bytes(17, "big")


def command_md(
    fmt: str,
    *,
    reply_to_q: str = "",
    reply_to_q_mgr: str = "QM1",
    msg_type: int = MsgType.DATAGRAM,
    report: int = 0,
    correl_id: bytes = bytes(24),
    persistence: int = 1,
    priority: int = 4,
    msg_id: bytes | None = None,
    user_identifier: str = "app1",
    expiry: int = -1,
) -> MQMD:
    return MQMD(
        format=fmt,
        msg_type=msg_type,
        report=report,
        reply_to_q=reply_to_q,
        reply_to_q_mgr=reply_to_q_mgr,
        correl_id=correl_id,
        persistence=persistence,
        priority=priority,
        msg_id=msg_id if msg_id is not None else new_msg_id(),
        coded_char_set_id=1208,
        user_identifier=user_identifier,
        expiry=expiry,
    )


def rfh_message(
    queue: str,
    pairs: list[tuple[str, str]],
    payload: bytes = b"",
    *,
    implicit_stream_naming: bool = True,
    **md_args: object,
) -> InboundMessage:
    rfh = MQRFH(
        name_values=pairs,
        format=FMT_STRING if payload else "",
        coded_char_set_id=1208 if payload else 0,
    )
    md = command_md(FMT_RF_HEADER, **md_args)  # type: ignore[arg-type]
    return InboundMessage(queue, md, encode_rfh(rfh, ccsid=1208) + payload, implicit_stream_naming)


def rfh_publication(
    stream: str, topic: str, payload: bytes, *, pairs: list[tuple[str, str]] | None = None,
    **md_args: object,
) -> InboundMessage:
    """An MQ Publish/Subscribe V6 (MQRFH) publication naming its stream explicitly."""
    nv = [("MQPSCommand", "Publish"), ("MQPSStreamName", stream), ("MQPSTopic", topic)]
    return rfh_message(stream, nv + (pairs or []), payload, **md_args)


def rfh2_message(
    queue: str,
    psc: list[tuple[str, str]],
    payload: bytes = b"",
    *,
    folders: list[Element] | None = None,
    implicit_stream_naming: bool = True,
    **md_args: object,
) -> InboundMessage:
    rfh2 = MQRFH2(
        folders=[Element.from_pairs("psc", psc), *(folders or [])],
        format=FMT_STRING if payload else "",
        coded_char_set_id=1208,
    )
    md = command_md(FMT_RF_HEADER_2, **md_args)  # type: ignore[arg-type]
    return InboundMessage(
        queue, md, encode_rfh2(rfh2, ccsid=1208) + payload, implicit_stream_naming
    )


@dataclass
class Received:
    """A decoded forwarded publication or response."""

    md: MQMD
    fmt: str
    pairs: list[tuple[str, str]] = field(default_factory=list)
    folders: list[Element] = field(default_factory=list)
    payload: bytes = b""

    def get(self, name: str) -> str | None:
        if self.fmt == FMT_RF_HEADER:
            return next((v for n, v in self.pairs if n == name), None)
        for f in self.folders:
            if name.startswith(f.name + "/"):
                return f.get(name[len(f.name) + 1 :])
        return None

    def get_all(self, name: str) -> list[str]:
        if self.fmt == FMT_RF_HEADER:
            return [v for n, v in self.pairs if n == name]
        for f in self.folders:
            if name.startswith(f.name + "/"):
                return f.get_all(name[len(f.name) + 1 :])
        return []

    @property
    def topic(self) -> str | None:
        return self.get("MQPSTopic") if self.fmt == FMT_RF_HEADER else self.get("psc/Topic")


def decode(md: MQMD, body: bytes) -> Received:
    if md.format == FMT_RF_HEADER:
        rfh, used = decode_rfh(body, md.encoding, ccsid=md.coded_char_set_id)
        return Received(md, md.format, pairs=rfh.name_values, payload=body[used:])
    if md.format == FMT_RF_HEADER_2:
        rfh2, used = decode_rfh2(body, md.encoding, ccsid=md.coded_char_set_id)
        return Received(md, md.format, folders=rfh2.folders, payload=body[used:])
    return Received(md, md.format, payload=body)
