"""MQMDE: message descriptor extension (72 bytes).

Why: a transmission-queue header embeds only a version-1 MQMD, so a message whose
GroupId/MsgSeqNumber/Offset/MsgFlags/OriginalLength are not defaults carries them in an
MQMDE right after the MQXQH (embedded MsgDesc.Format ``MQHMDE``).
Reference: IBM MQ "MQMDE - Message descriptor extension" (q097790), protocol reference §6.2.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from gateway.wire.ccsid import (
    CcsidAlias,
    decode_char_field,
    encode_char_field,
    is_ebcdic,
    structure_ccsid,
)
from gateway.wire.constants import CCSI_UNDEFINED, ENC_NATIVE, GI_NONE
from gateway.wire.encoding import byte_order
from gateway.wire.errors import WireError
from gateway.wire.fixed_part import FixedPart
from gateway.wire.formats import FMT_NONE
from gateway.wire.reasons import Reason

MQMDE_STRUC_ID = "MDE "
MQMDE_VERSION_2 = 2
MQMDE_LENGTH_2 = 72
MQMDEF_NONE = 0

_ASCII_ID = b"MDE "
_EBCDIC_ID = b"\xd4\xc4\xc5\x40"
# StrucId Version StrucLength Encoding CodedCharSetId Format Flags GroupId MsgSeqNumber
# Offset MsgFlags OriginalLength
_LAYOUT = {o: struct.Struct(o + "4s4i8si24s4i") for o in "<>"}
assert _LAYOUT["<"].size == MQMDE_LENGTH_2
_FIXED_PART = FixedPart(
    "MQMDE",
    Reason.MDE_ERROR,
    _LAYOUT,
    ascii_id=_ASCII_ID,
    ebcdic_id=_EBCDIC_ID,
    min_length=MQMDE_LENGTH_2,
    version=MQMDE_VERSION_2,
)


@dataclass(slots=True)
class MQMDE(CcsidAlias):
    """MQMDE version 2; ``encoding``/``coded_char_set_id``/``format`` describe what follows."""

    encoding: int = ENC_NATIVE
    coded_char_set_id: int = CCSI_UNDEFINED
    format: str = FMT_NONE
    flags: int = MQMDEF_NONE
    group_id: bytes = GI_NONE
    msg_seq_number: int = 1
    offset: int = 0
    msg_flags: int = 0
    original_length: int = -1
    struc_id: str = MQMDE_STRUC_ID
    version: int = MQMDE_VERSION_2
    struc_length: int = field(default=MQMDE_LENGTH_2, compare=False)


def decode_mqmde(
    buf: bytes | bytearray | memoryview, encoding: int = ENC_NATIVE, *, ccsid: int = 0
) -> tuple[MQMDE, int]:
    """Decode an MQMDE at the start of ``buf``; returns it and StrucLength consumed."""
    fields, text_ccsid, _ = _FIXED_PART.unpack(buf, encoding, ccsid)
    _, _, length, enc, cc, fmt, flags, gid, seq, off, mflags, olen = fields
    if length < MQMDE_LENGTH_2 or length > len(buf):
        raise WireError(Reason.MDE_ERROR, f"MQMDE StrucLength {length} is not valid here", 8)
    mde = MQMDE(
        encoding=enc,
        coded_char_set_id=cc,
        format=decode_char_field(fmt, text_ccsid, field="MQMDE.Format", offset=20),
        flags=flags,
        group_id=gid,
        msg_seq_number=seq,
        offset=off,
        msg_flags=mflags,
        original_length=olen,
        struc_length=length,
    )
    return mde, length


def encode_mqmde(mde: MQMDE, encoding: int = ENC_NATIVE, *, ccsid: int = 0) -> bytes:
    """Encode ``mde`` (72 bytes) with integers in ``encoding`` and text in ``ccsid``."""
    order = byte_order(encoding, field="MQMDE target encoding", decoding=False)
    text_ccsid = structure_ccsid(ccsid)
    if len(mde.group_id) > 24:
        raise WireError(Reason.MDE_ERROR, "MQMDE.group_id is longer than 24 bytes")
    try:
        return _LAYOUT[order].pack(
            _EBCDIC_ID if is_ebcdic(text_ccsid) else _ASCII_ID,
            MQMDE_VERSION_2,
            MQMDE_LENGTH_2,
            mde.encoding,
            mde.coded_char_set_id,
            encode_char_field(
                mde.format, 8, text_ccsid, field="MQMDE.format", reason=Reason.MDE_ERROR
            ),
            mde.flags,
            bytes(mde.group_id).ljust(24, b"\x00"),
            mde.msg_seq_number,
            mde.offset,
            mde.msg_flags,
            mde.original_length,
        )
    except struct.error as exc:
        raise WireError(Reason.MDE_ERROR, f"MQMDE integer field out of range: {exc}") from None
