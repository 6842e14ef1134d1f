"""A publication's non-psc MQRFH2 folders as publishers really write them (padding,
markup a serializer would escape, a new ``usr`` folder each message): MQRFH2
subscribers and sinks get exactly what a re-serialization of the folder gives, and a
malformed folder is still dead-lettered with MQRC_RFH_FORMAT_ERROR."""

from __future__ import annotations

import struct

import pytest

from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.outcome import InboundMessage, Outcome
from gateway.pubsub.store import MemoryStore
from gateway.wire.constants import MsgType
from gateway.wire.folder import Element, parse_folder, serialize_folder
from gateway.wire.formats import FMT_RF_HEADER_2, FMT_STRING
from gateway.wire.reasons import Reason
from gateway.wire.rfh2 import MQRFH2, decode_rfh2, encode_rfh2
from tests.support.pubsub_messages import CONTROL, DEFAULT, command_md, rfh2_message

REQ = MsgType.REQUEST


def _publication(folder_text: bytes, payload: bytes = b"body") -> InboundMessage:
    """An MQRFH2 Publish whose second folder is ``folder_text`` exactly as given."""
    psc = Element.from_pairs("psc", [("Command", "Publish"), ("Topic", "p/q")])
    head = encode_rfh2(MQRFH2(folders=[psc], format=FMT_STRING, coded_char_set_id=1208),
                       ccsid=1208)
    extra = struct.pack("<i", len(folder_text)) + folder_text
    length = len(head) + len(extra)
    body = head[:8] + struct.pack("<i", length) + head[12:] + extra + payload
    return InboundMessage(DEFAULT, command_md(FMT_RF_HEADER_2), body)


def _engine_with_rfh2_subscriber() -> PubSubEngine:
    engine = PubSubEngine("QM1", MemoryStore(), clock=lambda: 1_700_000_000.0)
    engine.handle(
        rfh2_message(CONTROL, [("Command", "RegSub"), ("Topic", "p/#"), ("QName", "SUB2.Q")],
                     reply_to_q="R", msg_type=REQ)
    )
    return engine


def _handle(engine: PubSubEngine, folder_text: bytes) -> Outcome:
    return engine.handle(_publication(folder_text))


@pytest.mark.parametrize(
    ("sent", "canonical"),
    [
        # a flat folder, padded with NULs and blanks: the serialization drops the padding
        (b"<usr><Seq>7</Seq></usr>\x00 ", "<usr><Seq>7</Seq></usr>"),
        (b"<usr><Seq>8</Seq><Empty></Empty></usr>", "<usr><Seq>8</Seq><Empty></Empty></usr>"),
        # markup the serializer escapes (> " ') in an otherwise flat folder
        (b"<usr><A>x>y</A><B>'q\"</B></usr>   ",
         "<usr><A>x&gt;y</A><B>&apos;q&quot;</B></usr>"),
        # references, attributes, nesting, blanks between tags: the general parser's
        (b"<usr> <A dt='i4'>1</A>\n<G><N>&lt;n&#65;</N></G></usr>",
         '<usr><A dt="i4">1</A><G><N>&lt;nA</N></G></usr>'),
        (b"<mcd><Msd>jms_text</Msd></mcd>", "<mcd><Msd>jms_text</Msd></mcd>"),
    ],
)
def test_subscribers_get_the_folder_as_its_serialization(sent: bytes, canonical: str) -> None:
    engine = _engine_with_rfh2_subscriber()
    for _ in range(2):  # the second time from the wire layer's folder cache
        out = _handle(engine, sent)
        assert out.dead_letter is None, out.reason
        (delivery,) = out.deliveries
        assert delivery.publication.extra_folders == [canonical]
        assert canonical == serialize_folder(parse_folder(sent.decode()))
        rfh2, used = decode_rfh2(delivery.body, delivery.md.encoding)
        assert [f.name for f in rfh2.folders] == ["psc", canonical[1:4]]
        # NameValueData of the passed-through folder: its serialization, blank padded
        start = 36 + 4 + struct.unpack_from("<i", delivery.body, 36)[0]
        (length,) = struct.unpack_from("<i", delivery.body, start)
        data = delivery.body[start + 4 : start + 4 + length]
        assert data.decode() == canonical + " " * (-len(canonical) % 4)
        assert delivery.body[used:] == b"body"


@pytest.mark.parametrize(
    "sent",
    [
        b"<usr><A>1</B></usr>",  # end tag does not close its leaf
        b"<usr><A>1</A>",  # unterminated
        b"<usr><A>1</A></usr>junk",  # data after the end tag
        b"<usr><A>&bogus;</A></usr>",  # unknown entity
        b"<usr><A>1</A></usr><usr></usr>",  # two roots
    ],
)
def test_a_malformed_folder_is_dead_lettered_as_an_rfh_format_error(sent: bytes) -> None:
    engine = _engine_with_rfh2_subscriber()
    for _ in range(2):
        out = _handle(engine, sent)
        assert out.reason == Reason.RFH_FORMAT_ERROR
        assert out.dead_letter is not None and out.dead_letter.reason == Reason.RFH_FORMAT_ERROR
        assert not out.deliveries
