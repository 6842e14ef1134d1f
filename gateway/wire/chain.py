"""Following and building the Format/Encoding/CCSID chain of MQ message headers.

Why: the MQMD's Format/Encoding/CodedCharSetId describe the first structure of the
message data; each header's own fields describe the next one; the last header's describe
the payload. Every consumer (pub/sub engine, bridges, DLQ handling) needs that walk done
once and correctly. Reference: IBM MQ "MQRFH2 overview" / header chaining (q099240),
MQCCSI_INHERIT rules (js07172); protocol reference §1.1, §1.3.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from gateway.wire.ccsid import DEFAULT_STRUCTURE_CCSID, decode_text
from gateway.wire.constants import CCSI_INHERIT, ENC_NATIVE
from gateway.wire.dlh import MQDLH, decode_dlh, encode_dlh
from gateway.wire.errors import WireError
from gateway.wire.formats import (
    FMT_DEAD_LETTER_HEADER,
    FMT_MD_EXTENSION,
    FMT_RF_HEADER,
    FMT_RF_HEADER_2,
    FMT_XMIT_Q_HEADER,
)
from gateway.wire.mqmd import MQMD
from gateway.wire.mqmde import MQMDE, decode_mqmde, encode_mqmde
from gateway.wire.reasons import Reason
from gateway.wire.rfh import MQRFH, decode_rfh, encode_rfh
from gateway.wire.rfh2 import MQRFH2, decode_rfh2, encode_rfh2
from gateway.wire.xqh import MQXQH, decode_xqh, encode_xqh

Header = MQRFH | MQRFH2 | MQXQH | MQDLH | MQMDE
H = TypeVar("H", MQRFH, MQRFH2, MQXQH, MQDLH, MQMDE)

#: Headers deeper than this are refused (real messages carry a handful).
MAX_HEADERS = 32


@dataclass(slots=True)
class ParsedMessage:
    """Headers in order, then the payload with its own format, encoding and CCSID.

    ``header_offsets[i]`` is where header ``i`` starts in the message data. ``ccsid``
    is the payload's effective CCSID (MQCCSI_INHERIT resolved).
    """

    headers: list[Header]
    payload: bytes
    format: str
    encoding: int
    ccsid: int
    header_offsets: list[int] = field(default_factory=list)

    def first(self, kind: type[H]) -> H | None:
        """The first header of type ``kind`` (``parsed.first(MQRFH2)``), or None."""
        return next((h for h in self.headers if isinstance(h, kind)), None)

    def all(self, kind: type[H]) -> list[H]:
        """Every header of type ``kind``, in order."""
        return [h for h in self.headers if isinstance(h, kind)]

    def text(self) -> str:
        """The payload decoded from its CCSID (WireError if unsupported/invalid)."""
        big = (self.encoding & 0xF) == 1
        return decode_text(self.payload, self.ccsid, big_endian=big, field="payload")


def _format_of(header: Header) -> tuple[str, int, int]:
    """(format, encoding, ccsid) that ``header`` declares for what follows it."""
    if isinstance(header, MQXQH):
        md = header.msg_desc
        return md.format, md.encoding, md.coded_char_set_id
    return header.format, header.encoding, header.coded_char_set_id


def parse_message(
    md: MQMD,
    body: bytes | bytearray | memoryview,
    *,
    qmgr_ccsid: int = 0,
    depth: int | None = None,
    shared_folders: bool = False,
) -> ParsedMessage:
    """Decode every header named by the chain starting at ``md`` and return the payload.

    Headers understood: MQRFH (``MQHRF``), MQRFH2 (``MQHRF2``), MQXQH (``MQXMIT``),
    MQDLH (``MQDEAD``), MQMDE (``MQHMDE``); any other Format ends the chain. A CCSID of 0
    (queue manager's) resolves to ``qmgr_ccsid`` when given; MQCCSI_INHERIT (-2) in a
    header means "same as this header". WireError offsets are relative to ``body``.

    ``depth`` (when given) stops the walk after that many headers: what follows is the
    payload, as the last header decoded describes it. The broker reads a command this
    way (``depth=1``): a publication's data may itself start with a header, which it
    passes through untouched.

    ``shared_folders``: the caller only reads the MQRFH2 folders (see
    :func:`~gateway.wire.rfh2.decode_rfh2`).
    """
    fmt, encoding = md.format, md.encoding
    ccsid = md.coded_char_set_id or qmgr_ccsid
    headers: list[Header] = []
    offsets: list[int] = []
    pos = 0
    limit = MAX_HEADERS + 1 if depth is None else depth
    while fmt in _DECODERS and len(headers) < limit:
        if len(headers) >= MAX_HEADERS:
            raise WireError(Reason.HEADER_ERROR, f"more than {MAX_HEADERS} chained headers", pos)
        # The first header is read from ``body`` itself: decoders are quicker on bytes
        # than on a memoryview, and most messages carry one header (the hot path).
        rest = body if pos == 0 else memoryview(body)[pos:]
        header: Header
        try:
            if shared_folders and fmt == FMT_RF_HEADER_2:
                header, used = decode_rfh2(rest, encoding, ccsid=ccsid, shared_folders=True)
            else:
                header, used = _DECODERS[fmt](rest, encoding, ccsid=ccsid)
        except WireError as exc:
            raise WireError(
                exc.reason, f"{fmt} header: {exc.message}", pos + max(exc.offset, 0)
            ) from None
        headers.append(header)
        offsets.append(pos)
        pos += used
        nfmt, nenc, nccsid = _format_of(header)
        fmt, encoding = nfmt, nenc
        if nccsid != CCSI_INHERIT:
            ccsid = nccsid or qmgr_ccsid
    payload = body[pos:] if isinstance(body, bytes) else bytes(memoryview(body)[pos:])
    return ParsedMessage(headers, payload, fmt, encoding, ccsid, offsets)


_Decoder = Callable[..., tuple[Header, int]]

_DECODERS: dict[str, _Decoder] = {
    FMT_RF_HEADER: decode_rfh,
    FMT_RF_HEADER_2: decode_rfh2,
    FMT_XMIT_Q_HEADER: decode_xqh,
    FMT_DEAD_LETTER_HEADER: decode_dlh,
    FMT_MD_EXTENSION: decode_mqmde,
}


def _format_name(header: Header) -> str:
    if isinstance(header, MQRFH2):
        return FMT_RF_HEADER_2
    if isinstance(header, MQRFH):
        return FMT_RF_HEADER
    if isinstance(header, MQXQH):
        return FMT_XMIT_Q_HEADER
    if isinstance(header, MQDLH):
        return FMT_DEAD_LETTER_HEADER
    return FMT_MD_EXTENSION


def _encode(header: Header, encoding: int, ccsid: int) -> bytes:
    if isinstance(header, MQRFH2):
        return encode_rfh2(header, encoding, ccsid=ccsid)
    if isinstance(header, MQRFH):
        return encode_rfh(header, encoding, ccsid=ccsid)
    if isinstance(header, MQXQH):
        return encode_xqh(header, encoding, ccsid=ccsid)
    if isinstance(header, MQDLH):
        return encode_dlh(header, encoding, ccsid=ccsid)
    return encode_mqmde(header, encoding, ccsid=ccsid)


def _chained(header: Header, fmt: str, encoding: int, ccsid: int) -> Header:
    if isinstance(header, MQXQH):
        return replace(
            header,
            msg_desc=replace(
                header.msg_desc, format=fmt, encoding=encoding, coded_char_set_id=ccsid
            ),
        )
    return replace(header, format=fmt, encoding=encoding, coded_char_set_id=ccsid)


def build_message(
    headers: Sequence[Header],
    payload: bytes,
    payload_format: str,
    *,
    payload_encoding: int = ENC_NATIVE,
    payload_ccsid: int = 1208,
    header_encoding: int = ENC_NATIVE,
    header_ccsid: int = DEFAULT_STRUCTURE_CCSID,
) -> tuple[str, int, int, bytes]:
    """Encode ``headers`` then ``payload``; returns (format, encoding, ccsid, data) for the MQMD.

    Each header's Format/Encoding/CodedCharSetId are set to describe the next structure
    (headers are copied, not mutated); all headers are written in ``header_encoding`` /
    ``header_ccsid``. With no headers the payload's own values are returned.
    """
    if not headers:
        return payload_format, payload_encoding, payload_ccsid, bytes(payload)
    parts: list[bytes] = []
    for i, header in enumerate(headers):
        if i + 1 < len(headers):
            nxt = (_format_name(headers[i + 1]), header_encoding, header_ccsid)
        else:
            nxt = (payload_format, payload_encoding, payload_ccsid)
        parts.append(_encode(_chained(header, *nxt), header_encoding, header_ccsid))
    parts.append(bytes(payload))
    return _format_name(headers[0]), header_encoding, header_ccsid, b"".join(parts)
