"""Character data in the coded character sets MQ applications really use.

Why: header fields (queue names, formats), RFH NameValueStrings and RFH2 folders arrive
in the CCSID of the structure that governs them, ASCII or EBCDIC, and RFH2 folders may be
UTF-16 in the header's integer byte order. An unsupported CCSID is reported as
MQRC_SOURCE_CCSID_ERROR (decode) / MQRC_TARGET_CCSID_ERROR (encode), never as mojibake.
References: IBM MQ "Code page conversion" tables; MQRFH2 NameValueCCSID (q099310).
"""

from __future__ import annotations

from gateway.wire.errors import WireError
from gateway.wire.reasons import Reason

#: CCSIDs with a fixed Python codec (single-byte or UTF-8).
_CODECS: dict[int, str] = {
    1208: "utf-8",
    819: "latin-1",
    437: "cp437",
    850: "cp850",
    1252: "cp1252",
    367: "ascii",
    500: "cp500",
    37: "cp037",
    1140: "cp1140",
}
#: UTF-16 CCSIDs: byte order comes from the governing integer encoding.
UTF16_CCSIDS = frozenset({1200, 13488, 17584})
EBCDIC_CCSIDS = frozenset({500, 37, 1140})
#: CCSIDs allowed for MQRFH2 NameValueData (IBM: 1200, 13488, 17584, 1208).
NAME_VALUE_CCSIDS = frozenset({1208, *UTF16_CCSIDS})
#: CCSID used for structure character fields when the governing value is 0 (MQCCSI_Q_MGR)
#: or another special value: ISO-8859-1, the usual queue-manager CCSID on Linux, and
#: lossless for any byte so unknown bytes in names survive a round trip.
DEFAULT_STRUCTURE_CCSID = 819

SUPPORTED_CCSIDS = frozenset({*_CODECS, *UTF16_CCSIDS})


def codec_name(ccsid: int, *, big_endian: bool = False, decoding: bool = True) -> str:
    """Python codec for ``ccsid``; UTF-16 byte order from ``big_endian``."""
    name = _CODECS.get(ccsid)
    if name is not None:
        return name
    if ccsid in UTF16_CCSIDS:
        return "utf-16-be" if big_endian else "utf-16-le"
    reason = Reason.SOURCE_CCSID_ERROR if decoding else Reason.TARGET_CCSID_ERROR
    raise WireError(
        reason,
        f"CCSID {ccsid} is not supported (supported: {sorted(SUPPORTED_CCSIDS)})",
    )


def structure_ccsid(ccsid: int) -> int:
    """CCSID to use for a structure's fixed character fields.

    Special values (0 = queue manager's, negative = inherit/embedded/...) map to
    :data:`DEFAULT_STRUCTURE_CCSID`. UTF-16 cannot hold MQ's fixed single-byte fields.
    """
    if ccsid <= 0:
        return DEFAULT_STRUCTURE_CCSID
    if ccsid in UTF16_CCSIDS:
        raise WireError(
            Reason.SOURCE_CCSID_ERROR,
            f"CCSID {ccsid} (UTF-16) cannot encode MQ header character fields",
        )
    codec_name(ccsid)
    return ccsid


def is_ebcdic(ccsid: int) -> bool:
    """True for the EBCDIC CCSIDs supported here (blank is 0x40, not 0x20)."""
    return ccsid in EBCDIC_CCSIDS


def struc_id_ccsid(
    sid: bytes,
    ascii_id: bytes,
    ebcdic_id: bytes,
    ccsid: int,
    *,
    reason: int,
    what: str,
    offset: int = 0,
) -> int:
    """CCSID of a structure's character fields, told by how its StrucId is spelled.

    The governing CCSID (``structure_ccsid``) is used unless the StrucId bytes show the
    other family: an EBCDIC StrucId under an ASCII CCSID means CCSID 500, an ASCII one
    under an EBCDIC CCSID means 819. Any other StrucId is ``reason`` at ``offset``.
    """
    text_ccsid = structure_ccsid(ccsid)
    if sid == ebcdic_id:
        return text_ccsid if is_ebcdic(text_ccsid) else 500
    if sid == ascii_id:
        return DEFAULT_STRUCTURE_CCSID if is_ebcdic(text_ccsid) else text_ccsid
    expected = ascii_id.decode("ascii")
    raise WireError(reason, f"{what} StrucId is {sid!r}, expected {expected!r}", offset)


def blank(ccsid: int) -> bytes:
    """The blank (space) byte of a single-byte/UTF-8 ``ccsid``."""
    return b"\x40" if ccsid in EBCDIC_CCSIDS else b"\x20"


def decode_text(
    data: bytes, ccsid: int, *, big_endian: bool = False, field: str = "text", offset: int = -1
) -> str:
    """Decode ``data`` from ``ccsid``; WireError names ``field`` and ``offset`` on failure."""
    codec = codec_name(ccsid, big_endian=big_endian)
    try:
        return data.decode(codec)
    except UnicodeDecodeError as exc:
        at = offset + exc.start if offset >= 0 else -1
        raise WireError(
            Reason.SOURCE_CCSID_ERROR,
            f"{field} is not valid CCSID {ccsid} ({exc.reason})",
            at,
        ) from None


def encode_text(text: str, ccsid: int, *, big_endian: bool = False, field: str = "text") -> bytes:
    """Encode ``text`` into ``ccsid``; WireError names the field when a character won't fit."""
    codec = codec_name(ccsid, big_endian=big_endian, decoding=False)
    try:
        return text.encode(codec)
    except UnicodeEncodeError as exc:
        raise WireError(
            Reason.TARGET_CCSID_ERROR,
            f"{field}: character {text[exc.start]!r} cannot be represented in CCSID {ccsid}",
        ) from None


def decode_char_field(raw: bytes, ccsid: int, *, field: str, offset: int = -1) -> str:
    """Decode a fixed CHARn field: cut at the first NUL, strip trailing blanks.

    MQ treats a NUL and everything after it as blanks (C initialisers use NUL; MQGET
    returns blanks), so both paddings decode to the same string.
    """
    nul = raw.find(b"\x00")
    if nul >= 0:
        raw = raw[:nul]
    if ccsid == DEFAULT_STRUCTURE_CCSID:
        return raw.decode("latin-1").rstrip(" ")
    return decode_text(raw, ccsid, field=field, offset=offset).rstrip(" ")


def encode_char_field(
    text: str, length: int, ccsid: int, *, field: str, reason: int = Reason.FORMAT_ERROR
) -> bytes:
    """Encode a fixed CHARn field, blank padded; too long -> WireError(``reason``)."""
    data = encode_text(text, ccsid, field=field)
    if len(data) > length:
        raise WireError(reason, f"{field} {text!r} is {len(data)} bytes; the field holds {length}")
    return data + blank(ccsid) * (length - len(data))


class CcsidAlias:
    """``ccsid`` as a short alias of ``coded_char_set_id`` for the chained headers
    (MQRFH, MQRFH2, MQDLH, MQMDE): IBM's field name is long, callers write ``h.ccsid``."""

    __slots__ = ()
    coded_char_set_id: int

    @property
    def ccsid(self) -> int:
        """Alias of ``coded_char_set_id``."""
        return self.coded_char_set_id

    @ccsid.setter
    def ccsid(self, value: int) -> None:
        # The slot is the subclass's (a dataclass field); mypy only sees this class's ().
        self.coded_char_set_id = value  # type: ignore[misc]
