"""MQRFH version 1: rules and formatting header with a NameValueString.

Why: MQSeries / WebSphere MQ Publish/Subscribe (V6 and earlier) applications carry their
broker commands (``MQPSCommand Publish MQPSTopic ...``) in this header; the gateway joins
those networks as a broker, so it must parse and emit these strings exactly.
Reference: IBM MQ "MQRFH - Rules and formatting header" (q099070), StrucLength (js07150),
NameValueString syntax (q099140); protocol reference §3.

The whole structure, NameValueString included, is in the Encoding/CCSID of whatever
precedes it (MQMD or previous header); its own Encoding/CodedCharSetId/Format describe
the data after it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from gateway.wire.ccsid import (
    CcsidAlias,
    decode_char_field,
    decode_text,
    encode_char_field,
    encode_text,
    is_ebcdic,
    structure_ccsid,
)
from gateway.wire.constants import CCSI_UNDEFINED, ENC_NATIVE
from gateway.wire.encoding import byte_order
from gateway.wire.errors import WireError
from gateway.wire.fixed_part import FixedPart
from gateway.wire.formats import FMT_NONE
from gateway.wire.reasons import Reason

MQRFH_STRUC_ID = "RFH "
MQRFH_VERSION_1 = 1
MQRFH_VERSION_2 = 2
MQRFH_STRUC_LENGTH_FIXED = 32
MQRFH_NONE = 0

RFH_STRUC_ID_ASCII = b"RFH "
RFH_STRUC_ID_EBCDIC = b"\xd9\xc6\xc8\x40"

# StrucId, Version, StrucLength, Encoding, CodedCharSetId, Format, Flags.
_FIXED = {o: struct.Struct(o + "4s3i i8si") for o in "<>"}
#: The opening shared by MQRFH and MQRFH2 (the caller checks Version: 1 or 2).
_FIXED_PARTS = {
    what: FixedPart(
        what,
        Reason.RFH_ERROR,
        _FIXED,
        ascii_id=RFH_STRUC_ID_ASCII,
        ebcdic_id=RFH_STRUC_ID_EBCDIC,
        min_length=MQRFH_STRUC_LENGTH_FIXED,
        at_least=True,
    )
    for what in ("MQRFH", "MQRFH2")
}


@dataclass(slots=True)
class RFHFixed:
    """The 32-byte part MQRFH and MQRFH2 share (after StrucId)."""

    version: int
    struc_length: int
    encoding: int
    coded_char_set_id: int
    format: str
    flags: int
    text_ccsid: int


def decode_rfh_fixed(
    buf: bytes | bytearray | memoryview, encoding: int, ccsid: int, *, what: str
) -> RFHFixed:
    """Decode and validate the shared fixed part; StrucLength is checked against ``buf``."""
    fields, text_ccsid, _ = _FIXED_PARTS[what].unpack(buf, encoding, ccsid)
    _, version, struc_length, enc, cc, fmt, flags = fields
    if struc_length < MQRFH_STRUC_LENGTH_FIXED or struc_length > len(buf):
        raise WireError(
            Reason.RFH_ERROR,
            f"{what} StrucLength {struc_length} is outside {MQRFH_STRUC_LENGTH_FIXED}.."
            f"{len(buf)} (bytes available)",
            8,
        )
    return RFHFixed(
        version=version,
        struc_length=struc_length,
        encoding=enc,
        coded_char_set_id=cc,
        format=decode_char_field(fmt, text_ccsid, field=f"{what}.Format", offset=20),
        flags=flags,
        text_ccsid=text_ccsid,
    )


def encode_rfh_fixed(
    *,
    version: int,
    struc_length: int,
    encoding: int,
    coded_char_set_id: int,
    format: str,
    flags: int,
    target_encoding: int,
    text_ccsid: int,
    what: str,
) -> bytes:
    """Encode the shared 32-byte fixed part."""
    order = byte_order(target_encoding, field=f"{what} target encoding", decoding=False)
    sid = RFH_STRUC_ID_EBCDIC if is_ebcdic(text_ccsid) else RFH_STRUC_ID_ASCII
    fmt = encode_char_field(format, 8, text_ccsid, field=f"{what}.format", reason=Reason.RFH_ERROR)
    try:
        return _FIXED[order].pack(
            sid, version, struc_length, encoding, coded_char_set_id, fmt, flags
        )
    except struct.error as exc:
        raise WireError(Reason.RFH_ERROR, f"{what} integer field out of range: {exc}") from None


def parse_name_value_string(text: str) -> list[tuple[str, str]]:
    """Split a NameValueString into ordered (name, value) pairs.

    Tokens are separated by blanks; a token starting with ``"`` runs to the next quote
    not followed by another quote, ``""`` inside standing for one ``"``. A NUL ends the
    string. Odd token count or an unterminated quote raises WireError
    MQRC_RFH_STRING_ERROR whose ``offset`` is the zero-based character position (what
    a broker reports as MQPSErrorPos).
    """
    nul = text.find("\x00")
    if nul >= 0:
        text = text[:nul]
    tokens: list[str] = []
    starts: list[int] = []
    i = 0
    n = len(text)
    while True:
        while i < n and text[i] == " ":
            i += 1
        if i >= n:
            break
        start = i
        if text[i] == '"':
            parts: list[str] = []
            i += 1
            while True:
                q = text.find('"', i)
                if q < 0:
                    raise WireError(
                        Reason.RFH_STRING_ERROR,
                        f"NameValueString: quoted token starting at character {start} "
                        "has no closing quote",
                        start,
                    )
                parts.append(text[i:q])
                if q + 1 < n and text[q + 1] == '"':
                    parts.append('"')
                    i = q + 2
                    continue
                i = q + 1
                break
            if i < n and text[i] != " ":
                raise WireError(
                    Reason.RFH_STRING_ERROR,
                    f"NameValueString: closing quote at character {i - 1} is not followed "
                    "by a blank",
                    i,
                )
            tokens.append("".join(parts))
        else:
            sp = text.find(" ", i)
            i = n if sp < 0 else sp
            tokens.append(text[start:i])
        starts.append(start)
    if len(tokens) % 2:
        raise WireError(
            Reason.RFH_STRING_ERROR,
            f"NameValueString: name {tokens[-1]!r} at character {starts[-1]} has no value",
            starts[-1],
        )
    return [(tokens[k], tokens[k + 1]) for k in range(0, len(tokens), 2)]


def quote_token(token: str) -> str:
    """Quote ``token`` if it is empty or contains a blank or a quote; inner quotes doubled."""
    if "\x00" in token:
        raise WireError(Reason.RFH_STRING_ERROR, f"NameValueString token {token!r} contains NUL")
    if token and " " not in token and '"' not in token:
        return token
    return '"' + token.replace('"', '""') + '"'


def format_name_value_string(pairs: list[tuple[str, str]]) -> str:
    """Join pairs into a NameValueString (single blanks, minimal quoting)."""
    return " ".join(quote_token(name) + " " + quote_token(value) for name, value in pairs)


@dataclass(slots=True)
class MQRFH(CcsidAlias):
    """MQRFH version 1. ``encoding``/``coded_char_set_id``/``format`` describe the data after it."""

    name_values: list[tuple[str, str]] = field(default_factory=list)
    encoding: int = ENC_NATIVE
    coded_char_set_id: int = CCSI_UNDEFINED
    format: str = FMT_NONE
    flags: int = MQRFH_NONE
    struc_id: str = MQRFH_STRUC_ID
    version: int = MQRFH_VERSION_1
    #: As decoded; recomputed by :func:`encode_rfh`.
    struc_length: int = field(default=0, compare=False)

    def get(self, name: str, default: str | None = None) -> str | None:
        """Value of the first pair called ``name``."""
        for n, v in self.name_values:
            if n == name:
                return v
        return default

    def get_all(self, name: str) -> list[str]:
        """Values of every pair called ``name``, in order (options repeat their tag)."""
        return [v for n, v in self.name_values if n == name]

    @property
    def name_value_string(self) -> str:
        """The NameValueString this header encodes to (without padding)."""
        return format_name_value_string(self.name_values)


def decode_rfh(
    buf: bytes | bytearray | memoryview, encoding: int = ENC_NATIVE, *, ccsid: int = 0
) -> tuple[MQRFH, int]:
    """Decode an MQRFH v1 at the start of ``buf``; returns it and StrucLength consumed.

    ``encoding``/``ccsid`` are those of the preceding structure (they govern this one).
    Accepts any StrucLength ≥ 32 (IBM i says a multiple of 4 is only recommended).
    """
    fixed = decode_rfh_fixed(buf, encoding, ccsid, what="MQRFH")
    if fixed.version != MQRFH_VERSION_1:
        raise WireError(
            Reason.RFH_ERROR,
            f"MQRFH Version is {fixed.version}; version 1 expected (2 is MQRFH2)",
            4,
        )
    raw = bytes(buf[MQRFH_STRUC_LENGTH_FIXED : fixed.struc_length])
    nul = raw.find(b"\x00")
    if nul >= 0:
        raw = raw[:nul]
    text = decode_text(
        raw, fixed.text_ccsid, field="MQRFH.NameValueString", offset=MQRFH_STRUC_LENGTH_FIXED
    )
    try:
        pairs = parse_name_value_string(text)
    except WireError as exc:
        raise WireError(
            exc.reason, exc.message, MQRFH_STRUC_LENGTH_FIXED + max(exc.offset, 0)
        ) from None
    rfh = MQRFH(
        name_values=pairs,
        encoding=fixed.encoding,
        coded_char_set_id=fixed.coded_char_set_id,
        format=fixed.format,
        flags=fixed.flags,
        struc_length=fixed.struc_length,
    )
    return rfh, fixed.struc_length


def encode_rfh(rfh: MQRFH, encoding: int = ENC_NATIVE, *, ccsid: int = 0) -> bytes:
    """Encode ``rfh`` with its integers in ``encoding`` and text in ``ccsid``.

    The NameValueString is blank padded so StrucLength is a multiple of 4.
    """
    text_ccsid = structure_ccsid(ccsid)
    body = encode_text(rfh.name_value_string, text_ccsid, field="MQRFH.NameValueString")
    pad = -len(body) % 4
    if pad:
        body += encode_text(" " * pad, text_ccsid)
    length = MQRFH_STRUC_LENGTH_FIXED + len(body)
    head = encode_rfh_fixed(
        version=MQRFH_VERSION_1,
        struc_length=length,
        encoding=rfh.encoding,
        coded_char_set_id=rfh.coded_char_set_id,
        format=rfh.format,
        flags=rfh.flags,
        target_encoding=encoding,
        text_ccsid=text_ccsid,
        what="MQRFH",
    )
    return head + body
