"""MQMD, the message descriptor, versions 1 (324 bytes) and 2 (364 bytes).

Why a hand-laid struct: every message the gateway moves carries one, on transmission
queues it is embedded in MQXQH, and the bytes must match what a queue manager writes.
Reference: IBM MQ "MQMD - Message descriptor" field table and initial values
(protocol reference §2). Integers follow the caller's Encoding (the MQMD is an API
parameter in the putting program's native encoding); character fields are blank padded
on encode and decoded by cutting at the first NUL and stripping trailing blanks.

Constant families and format names live in :mod:`gateway.wire.constants` and
:mod:`gateway.wire.formats` and are re-exported here for convenience.
"""

from __future__ import annotations

import operator
import struct
from dataclasses import dataclass, field, fields, replace
from typing import Self

from gateway.wire.ccsid import (
    DEFAULT_STRUCTURE_CCSID,
    decode_char_field,
    encode_char_field,
    struc_id_ccsid,
    structure_ccsid,
)
from gateway.wire.constants import (
    ACT_NONE,
    CCSI_EMBEDDED,
    CCSI_INHERIT,
    CCSI_Q_MGR,
    CI_NONE,
    ENC_NATIVE,
    ENC_NORMAL,
    ENC_REVERSED,
    GI_NONE,
    MI_NONE,
    Feedback,
    MsgFlags,
    MsgType,
    Persistence,
    PutApplType,
    Report,
)
from gateway.wire.encoding import byte_order
from gateway.wire.errors import WireError
from gateway.wire.formats import (
    FMT_DEAD_LETTER_HEADER,
    FMT_MD_EXTENSION,
    FMT_NONE,
    FMT_RF_HEADER,
    FMT_RF_HEADER_1,
    FMT_RF_HEADER_2,
    FMT_STRING,
    FMT_XMIT_Q_HEADER,
)
from gateway.wire.reasons import Reason

__all__ = [
    "CCSI_EMBEDDED",
    "CCSI_INHERIT",
    "CCSI_Q_MGR",
    "ENC_NATIVE",
    "ENC_NORMAL",
    "ENC_REVERSED",
    "FMT_DEAD_LETTER_HEADER",
    "FMT_MD_EXTENSION",
    "FMT_NONE",
    "FMT_RF_HEADER",
    "FMT_RF_HEADER_1",
    "FMT_RF_HEADER_2",
    "FMT_STRING",
    "FMT_XMIT_Q_HEADER",
    "MQMD",
    "MQMD_LENGTH_1",
    "MQMD_LENGTH_2",
    "MQMD_STRUC_ID",
    "Feedback",
    "MsgFlags",
    "MsgType",
    "Persistence",
    "PutApplType",
    "Report",
]

MQMD_STRUC_ID = "MD  "
MQMD_VERSION_1 = 1
MQMD_VERSION_2 = 2
MQMD_LENGTH_1 = 324
MQMD_LENGTH_2 = 364

# Field table: (attribute, struct code). Order and widths are IBM's (offsets in §2).
_V1_FIELDS: tuple[tuple[str, str], ...] = (
    ("struc_id", "4s"),
    ("version", "i"),
    ("report", "i"),
    ("msg_type", "i"),
    ("expiry", "i"),
    ("feedback", "i"),
    ("encoding", "i"),
    ("coded_char_set_id", "i"),
    ("format", "8s"),
    ("priority", "i"),
    ("persistence", "i"),
    ("msg_id", "24s"),
    ("correl_id", "24s"),
    ("backout_count", "i"),
    ("reply_to_q", "48s"),
    ("reply_to_q_mgr", "48s"),
    ("user_identifier", "12s"),
    ("accounting_token", "32s"),
    ("appl_identity_data", "32s"),
    ("put_appl_type", "i"),
    ("put_appl_name", "28s"),
    ("put_date", "8s"),
    ("put_time", "8s"),
    ("appl_origin_data", "4s"),
)
_V2_FIELDS: tuple[tuple[str, str], ...] = (
    ("group_id", "24s"),
    ("msg_seq_number", "i"),
    ("offset", "i"),
    ("msg_flags", "i"),
    ("original_length", "i"),
)
_CHAR_FIELDS = frozenset(
    n for n, code in _V1_FIELDS if code.endswith("s") and n not in {"msg_id", "correl_id"}
) - {"accounting_token"}
_BYTE_FIELDS = {"msg_id": 24, "correl_id": 24, "accounting_token": 32, "group_id": 24}


def _struct(order: str, table: tuple[tuple[str, str], ...]) -> struct.Struct:
    return struct.Struct(order + "".join(code for _, code in table))


_STRUCTS: dict[tuple[str, int], struct.Struct] = {
    (order, version): _struct(order, _V1_FIELDS + (_V2_FIELDS if version == 2 else ()))
    for order in "<>"
    for version in (1, 2)
}
assert _STRUCTS["<", 1].size == MQMD_LENGTH_1 and _STRUCTS["<", 2].size == MQMD_LENGTH_2

_STRUC_ID_ASCII = b"MD  "
_STRUC_ID_EBCDIC = b"\xd4\xc4\x40\x40"


@dataclass(slots=True)
class MQMD:
    """MQ message descriptor; defaults are IBM's MQMD initial values (MQENC_NATIVE = 546)."""

    struc_id: str = MQMD_STRUC_ID
    version: int = MQMD_VERSION_1
    report: int = Report.NONE
    msg_type: int = MsgType.DATAGRAM
    expiry: int = -1
    feedback: int = Feedback.NONE
    encoding: int = ENC_NATIVE
    coded_char_set_id: int = CCSI_Q_MGR
    format: str = FMT_NONE
    priority: int = -1
    persistence: int = Persistence.PERSISTENCE_AS_Q_DEF
    msg_id: bytes = MI_NONE
    correl_id: bytes = CI_NONE
    backout_count: int = 0
    reply_to_q: str = ""
    reply_to_q_mgr: str = ""
    user_identifier: str = ""
    accounting_token: bytes = ACT_NONE
    appl_identity_data: str = ""
    put_appl_type: int = PutApplType.NO_CONTEXT
    put_appl_name: str = ""
    put_date: str = ""
    put_time: str = ""
    appl_origin_data: str = ""
    group_id: bytes = GI_NONE
    msg_seq_number: int = 1
    offset: int = 0
    msg_flags: int = MsgFlags.NONE
    original_length: int = -1
    #: CCSID of this descriptor's own character fields (not on the wire; MQ's is the
    #: queue manager's). 0 means ISO-8859-1 (see gateway.wire.ccsid).
    struc_ccsid: int = field(default=CCSI_Q_MGR, compare=False, repr=False)

    @property
    def length(self) -> int:
        """Packed length: 324 for version 1, 364 for version 2."""
        return MQMD_LENGTH_1 if self.version < MQMD_VERSION_2 else MQMD_LENGTH_2

    def has_v2_values(self) -> bool:
        """True when a version-2 field differs from its default (needs v2 or an MQMDE)."""
        return (
            self.group_id != GI_NONE
            or self.msg_seq_number != 1
            or self.offset != 0
            or self.msg_flags != 0
            or self.original_length != -1
        )

    def copy(self, **changes: object) -> MQMD:
        """A copy with ``changes`` applied (``dataclasses.replace``)."""
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def unpack(
        cls,
        buf: bytes | bytearray | memoryview,
        offset: int = 0,
        encoding: int = ENC_NATIVE,
        ccsid: int = CCSI_Q_MGR,
    ) -> Self:
        """Decode an MQMD at ``offset`` of ``buf``.

        ``encoding`` is the governing Encoding (the putter's native one); ``ccsid`` that of
        the character fields (0 = ISO-8859-1, EBCDIC StrucId detected automatically).
        Version 1 reads 324 bytes, 2 or more reads 364 (later versions: unknown tail ignored).
        """
        order = byte_order(encoding, field="MQMD governing encoding")
        view = memoryview(buf)
        if offset < 0 or len(view) - offset < MQMD_LENGTH_1:
            raise WireError(
                Reason.MD_ERROR,
                f"MQMD needs {MQMD_LENGTH_1} bytes, {max(0, len(view) - offset)} available",
                offset,
            )
        sid = bytes(view[offset : offset + 4])
        text_ccsid = struc_id_ccsid(
            sid,
            _STRUC_ID_ASCII,
            _STRUC_ID_EBCDIC,
            ccsid,
            reason=Reason.MD_ERROR,
            what="MQMD",
            offset=offset,
        )
        version = struct.unpack_from(order + "i", view, offset + 4)[0]
        if version < MQMD_VERSION_1:
            raise WireError(Reason.MD_ERROR, f"MQMD Version {version} is not 1 or 2", offset + 4)
        if version >= MQMD_VERSION_2:
            if len(view) - offset < MQMD_LENGTH_2:
                raise WireError(
                    Reason.MD_ERROR,
                    f"MQMD version {version} needs {MQMD_LENGTH_2} bytes, "
                    f"{len(view) - offset} available",
                    offset,
                )
            values = list(_STRUCTS[order, 2].unpack_from(view, offset))
        else:
            values = list(_STRUCTS[order, 1].unpack_from(view, offset))
        values[0] = MQMD_STRUC_ID
        latin1 = text_ccsid == DEFAULT_STRUCTURE_CCSID
        for index, name, field_offset in _CHAR_INDEXES:
            raw = values[index]
            if latin1:
                nul = raw.find(b"\x00")
                values[index] = (raw if nul < 0 else raw[:nul]).decode("latin-1").rstrip(" ")
            else:
                values[index] = decode_char_field(
                    raw, text_ccsid, field=f"MQMD.{name}", offset=offset + field_offset
                )
        md = cls(*values)
        md.struc_ccsid = ccsid if latin1 else text_ccsid
        return md

    def pack(self, encoding: int = ENC_NATIVE) -> bytes:
        """Encode to 324 (version 1) or 364 (version 2+) bytes in ``encoding``'s byte order.

        A version-1 descriptor whose version-2 fields are not at their defaults is refused
        (WireError MQRC_MD_ERROR) rather than silently dropping them: raise the version or
        carry them in an MQMDE.
        """
        order = byte_order(encoding, field="MQMD target encoding", decoding=False)
        v2 = self.version >= MQMD_VERSION_2
        if self.version < MQMD_VERSION_1:
            raise WireError(Reason.MD_ERROR, f"MQMD.version {self.version} is not 1 or 2")
        if not v2 and self.has_v2_values():
            raise WireError(
                Reason.MD_ERROR,
                "MQMD version 1 cannot carry GroupId/MsgSeqNumber/Offset/MsgFlags/"
                "OriginalLength; set version=2 or use an MQMDE",
            )
        ccsid = structure_ccsid(self.struc_ccsid)
        values = list((_GET_V2 if v2 else _GET_V1)(self))
        values[0] = MQMD_STRUC_ID
        latin1 = ccsid == DEFAULT_STRUCTURE_CCSID
        for index, name, size in _CHAR_SPECS:
            text = values[index]
            raw = None
            if latin1 and isinstance(text, str):
                try:
                    raw = text.encode("latin-1")
                except UnicodeEncodeError:
                    raw = None
            if raw is None or len(raw) > size:
                raw = encode_char_field(
                    text, size, ccsid, field=f"MQMD.{name}", reason=Reason.MD_ERROR
                )
            values[index] = raw.ljust(size, b" ") if latin1 else raw
        for index, name, size in _BYTE_SPECS[: 4 if v2 else 3]:
            if len(values[index]) > size:
                raise WireError(
                    Reason.MD_ERROR,
                    f"MQMD.{name} is {len(values[index])} bytes; the field holds {size}",
                )
        try:
            return _STRUCTS[order, 2 if v2 else 1].pack(*values)
        except struct.error as exc:
            raise WireError(Reason.MD_ERROR, f"MQMD integer field out of range: {exc}") from None


_V1_NAMES = tuple(n for n, _ in _V1_FIELDS)
_ALL_NAMES = _V1_NAMES + tuple(n for n, _ in _V2_FIELDS)
_SIZES = tuple(struct.calcsize(code) for _, code in _V1_FIELDS + _V2_FIELDS)
_OFFSETS = tuple(sum(_SIZES[:i]) for i in range(len(_SIZES)))
_GET_V1 = operator.attrgetter(*_V1_NAMES)
_GET_V2 = operator.attrgetter(*_ALL_NAMES)
#: (index in the unpacked tuple, name, byte offset) of each CHARn field after StrucId.
_CHAR_INDEXES = tuple(
    (i, name, _OFFSETS[i])
    for i, name in enumerate(_V1_NAMES)
    if name in _CHAR_FIELDS and name != "struc_id"
)
#: (index, name, size) of every CHARn field, StrucId included (for pack).
_CHAR_SPECS = tuple((i, n, _SIZES[i]) for i, n in enumerate(_V1_NAMES) if n in _CHAR_FIELDS)
#: (index, name, size) of the BYTEn fields; the version-2 GroupId last.
_BYTE_SPECS = tuple((i, n, _SIZES[i]) for i, n in enumerate(_ALL_NAMES) if n in _BYTE_FIELDS)
assert [n for _, n, _ in _BYTE_SPECS][-1] == "group_id"
assert {f.name for f in fields(MQMD)} >= set(_ALL_NAMES)
