"""Encoding the MQRFH2 Publish / DeletePub command of one publication (reference §5.5
"Publish", §5.3 "DeletePublication", MQRFH2 ``psc`` folder).

The other half of :mod:`gateway.pubsub.commands` (which decodes commands): the gateway's
plugin host puts inbound publications on a stream queue as these commands, and the
broker service gets them back and decodes them like any legacy publisher's. Pure: no
I/O, no plugin types; :class:`CommandEncodingError` says why a publication cannot be
expressed as a command at all.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping

from gateway.pubsub.origin import origin_folder
from gateway.pubsub.streams import MAX_STREAM_NAME, prefixed_topic
from gateway.wire.constants import ENC_NATIVE, MsgType, Persistence
from gateway.wire.errors import WireError
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from gateway.wire.rfh2 import MQRFH2, encode_rfh2

__all__ = ["USR_PROPERTY_NAME", "CommandEncodingError", "encode_publish_command"]

#: What an MQRFH2 ``usr`` element name may be (reference §4.3 MQRFH2 folders).
USR_PROPERTY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_STREAM_CHARS = re.compile(r"[A-Za-z0-9._%]+")
_INT32 = range(-(2**31), 2**31)


class CommandEncodingError(ValueError):
    """The publication can never become a Publish/DeletePub command (bad stream name,
    topic, property name, wildcard delete, format/encoding/CCSID MQ cannot carry)."""


def check_publication(
    stream: str,
    topic: str,
    *,
    delete: bool,
    properties: Mapping[str, str],
    payload_format: str,
    encoding: int,
    ccsid: int,
    expiry: int,
) -> None:
    """Raise :class:`CommandEncodingError` when the publication cannot be expressed."""
    if len(stream) > MAX_STREAM_NAME or not _STREAM_CHARS.fullmatch(stream):
        raise CommandEncodingError(
            f"stream name {stream!r} is not a valid MQ queue name "
            "(1-48 characters of A-Z a-z 0-9 . _ %)"
        )
    if not topic or "\x00" in topic:
        raise CommandEncodingError(f"topic {topic!r} is empty or contains NUL")
    if delete and any(level in ("#", "+") for level in topic.split("/")):
        raise CommandEncodingError(
            f"delete of {topic!r}: a wildcard level would delete many topics"
        )
    for name in properties:
        if not USR_PROPERTY_NAME.fullmatch(name):
            raise CommandEncodingError(
                f"property name {name!r} cannot be an MQRFH2 usr element "
                "(letters, digits, _ . - ; not starting with a digit)"
            )
    if len(payload_format) > 8 or not payload_format.isascii() or not payload_format.isprintable():
        raise CommandEncodingError(
            f"payload format {payload_format!r} is not an MQ format name (at most 8 printable "
            "ASCII characters)"
        )
    for label, value in (("encoding", encoding), ("CCSID", ccsid), ("expiry", expiry)):
        if value not in _INT32:
            raise CommandEncodingError(
                f"payload {label} {value} does not fit an MQLONG (32-bit signed)"
            )
    if ccsid < 0:
        raise CommandEncodingError(f"payload CCSID {ccsid} is negative")


def encode_publish_command(
    stream: str,
    topic: str,
    payload: bytes,
    *,
    payload_format: str = "MQSTR",
    encoding: int = 546,
    ccsid: int = 1208,
    properties: Mapping[str, str] | None = None,
    persistent: bool = True,
    retain: bool = False,
    delete: bool = False,
    expiry: int = -1,
    correl_id: bytes = b"",
    origin: str = "",
    gateway_id: str = "",
    q_mgr: str = "",
) -> tuple[MQMD, bytes]:
    """The MQMD and body of the MQRFH2 Publish (or DeletePub) command for ``topic``
    within ``stream``; ``origin``/``gateway_id`` become the origin marker
    (:mod:`gateway.pubsub.origin`). Raises :class:`CommandEncodingError`."""
    props = properties or {}
    check_publication(
        stream,
        topic,
        delete=delete,
        properties=props,
        payload_format=payload_format,
        encoding=encoding,
        ccsid=ccsid,
        expiry=expiry,
    )
    psc = Element("psc")
    full_topic = prefixed_topic(stream, topic)
    if delete:
        psc.add("Command", "DeletePub")
        psc.add("Topic", full_topic)
    else:
        psc.add("Command", "Publish")
        psc.add("Topic", full_topic)
        if retain:
            psc.add("PubOpt", "RetainPub")
    folders = [psc]
    if props and not delete:
        folders.append(Element.from_pairs("usr", dict(props)))
    marker = origin_folder(origin, gateway_id)
    if marker is not None:
        folders.append(marker)
    try:
        rfh2 = MQRFH2(
            folders=folders, encoding=encoding, coded_char_set_id=ccsid, format=payload_format
        )
        body = encode_rfh2(rfh2, ENC_NATIVE, ccsid=1208) + (b"" if delete else payload)
        md = MQMD(
            msg_type=MsgType.DATAGRAM,
            format=FMT_RF_HEADER_2,
            encoding=ENC_NATIVE,
            coded_char_set_id=1208,
            persistence=Persistence.PERSISTENT if persistent else Persistence.NOT_PERSISTENT,
            expiry=expiry,
            correl_id=correl_id.ljust(24, b"\x00")[:24] if correl_id else bytes(24),
            reply_to_q_mgr=q_mgr,
        )
    except (WireError, ValueError, OverflowError, struct.error) as exc:
        raise CommandEncodingError(f"cannot be encoded: {exc}") from exc
    return md, body
