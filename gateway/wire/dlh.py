"""MQDLH: dead-letter header (172 bytes).

Why: a message the gateway cannot deliver (unknown queue, full queue, undecodable
header) goes to a dead-letter queue prefixed by this header, exactly as a queue manager
or MCA would put it, so standard DLQ handlers (runmqdlq) can process it.
Reference: IBM MQ "MQDLH - Dead-letter header" (q096130, q096280), Reason (js00754);
protocol reference §6.3, including the real AIX DLQ dump it cites.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from datetime import datetime

from gateway.wire.ccsid import (
    DEFAULT_STRUCTURE_CCSID,
    CcsidAlias,
    decode_char_field,
    encode_char_field,
    is_ebcdic,
    structure_ccsid,
)
from gateway.wire.constants import CCSI_UNDEFINED, ENC_NATIVE, PutApplType
from gateway.wire.encoding import byte_order
from gateway.wire.errors import WireError
from gateway.wire.fixed_part import FixedPart
from gateway.wire.formats import FMT_DEAD_LETTER_HEADER, FMT_NONE
from gateway.wire.mqmd import MQMD
from gateway.wire.put_time import put_date_time
from gateway.wire.reasons import Reason

MQDLH_STRUC_ID = "DLH "
MQDLH_VERSION_1 = 1
MQDLH_LENGTH_1 = 172
_ASCII_ID = b"DLH "
_EBCDIC_ID = b"\xc4\xd3\xc8\x40"
# StrucId Version Reason DestQName DestQMgrName Encoding CodedCharSetId Format PutApplType
# PutApplName PutDate PutTime
_LAYOUT = {o: struct.Struct(o + "4sii48s48sii8si28s8s8s") for o in "<>"}
assert _LAYOUT["<"].size == MQDLH_LENGTH_1
_FIXED_PART = FixedPart(
    "MQDLH",
    Reason.DLH_ERROR,
    _LAYOUT,
    ascii_id=_ASCII_ID,
    ebcdic_id=_EBCDIC_ID,
    min_length=MQDLH_LENGTH_1,
    version=MQDLH_VERSION_1,
)


@dataclass(slots=True)
class MQDLH(CcsidAlias):
    """Dead-letter header; ``encoding``/``coded_char_set_id``/``format`` describe the
    original message data that follows it."""

    reason: int = Reason.NONE
    dest_q_name: str = ""
    dest_q_mgr_name: str = ""
    encoding: int = 0
    coded_char_set_id: int = CCSI_UNDEFINED
    format: str = FMT_NONE
    put_appl_type: int = PutApplType.NO_CONTEXT
    put_appl_name: str = ""
    put_date: str = ""
    put_time: str = ""
    struc_id: str = MQDLH_STRUC_ID
    version: int = MQDLH_VERSION_1


def decode_dlh(
    buf: bytes | bytearray | memoryview, encoding: int = ENC_NATIVE, *, ccsid: int = 0
) -> tuple[MQDLH, int]:
    """Decode an MQDLH at the start of ``buf``; returns it and 172 consumed."""
    fields, text_ccsid, _ = _FIXED_PART.unpack(buf, encoding, ccsid)
    _, _, reason, dq, dqm, enc, cc, fmt, pat, pan, pdate, ptime = fields

    def text(raw: bytes, name: str, off: int) -> str:
        return decode_char_field(raw, text_ccsid, field=f"MQDLH.{name}", offset=off)

    dlh = MQDLH(
        reason=reason,
        dest_q_name=text(dq, "DestQName", 12),
        dest_q_mgr_name=text(dqm, "DestQMgrName", 60),
        encoding=enc,
        coded_char_set_id=cc,
        format=text(fmt, "Format", 116),
        put_appl_type=pat,
        put_appl_name=text(pan, "PutApplName", 128),
        put_date=text(pdate, "PutDate", 156),
        put_time=text(ptime, "PutTime", 164),
    )
    return dlh, MQDLH_LENGTH_1


def encode_dlh(dlh: MQDLH, encoding: int = ENC_NATIVE, *, ccsid: int = 0) -> bytes:
    """Encode ``dlh`` (172 bytes), names blank padded."""
    order = byte_order(encoding, field="MQDLH target encoding", decoding=False)
    text_ccsid = structure_ccsid(ccsid)

    def text(value: str, length: int, name: str) -> bytes:
        return encode_char_field(
            value, length, text_ccsid, field=f"MQDLH.{name}", reason=Reason.DLH_ERROR
        )

    try:
        return _LAYOUT[order].pack(
            _EBCDIC_ID if is_ebcdic(text_ccsid) else _ASCII_ID,
            MQDLH_VERSION_1,
            dlh.reason,
            text(dlh.dest_q_name, 48, "dest_q_name"),
            text(dlh.dest_q_mgr_name, 48, "dest_q_mgr_name"),
            dlh.encoding,
            dlh.coded_char_set_id,
            text(dlh.format, 8, "format"),
            dlh.put_appl_type,
            text(dlh.put_appl_name, 28, "put_appl_name"),
            text(dlh.put_date, 8, "put_date"),
            text(dlh.put_time, 8, "put_time"),
        )
    except struct.error as exc:
        raise WireError(Reason.DLH_ERROR, f"MQDLH integer field out of range: {exc}") from None


def wrap_for_dlq(
    md: MQMD,
    body: bytes,
    reason: int,
    dest_q_name: str,
    dest_q_mgr_name: str,
    put_appl_name: str,
    *,
    put_appl_type: int = PutApplType.QMGR,
    moment: datetime | None = None,
    qmgr_encoding: int = ENC_NATIVE,
    qmgr_ccsid: int = DEFAULT_STRUCTURE_CCSID,
) -> tuple[MQMD, bytes]:
    """Turn a message into its dead-letter form: (new MQMD, MQDLH + original data).

    As MQ does: the DLH takes the MQMD's Encoding/CodedCharSetId/Format; the new MQMD gets
    Format ``MQDEAD`` and the DLH's own Encoding/CCSID (the queue manager's) and keeps
    everything else, MsgType and context included (the real AIX dump in the reference
    shows MsgType unchanged). PutApplType/Name/Date/Time in the DLH describe who put it
    on the DLQ (``moment`` defaults to now).
    """
    date, time = put_date_time(moment)
    dlh = MQDLH(
        reason=reason,
        dest_q_name=dest_q_name,
        dest_q_mgr_name=dest_q_mgr_name,
        encoding=md.encoding,
        coded_char_set_id=md.coded_char_set_id,
        format=md.format,
        put_appl_type=put_appl_type,
        put_appl_name=put_appl_name,
        put_date=date,
        put_time=time,
    )
    data = encode_dlh(dlh, qmgr_encoding, ccsid=qmgr_ccsid) + bytes(body)
    new_md = replace(
        md,
        format=FMT_DEAD_LETTER_HEADER,
        encoding=qmgr_encoding,
        coded_char_set_id=qmgr_ccsid,
    )
    return new_md, data


def unwrap_from_dlq(md: MQMD, data: bytes | bytearray | memoryview) -> tuple[MQDLH, MQMD, bytes]:
    """Inverse of :func:`wrap_for_dlq`: (the DLH, the original MQMD, the original data).

    What a DLQ handler does before retrying the put to ``dlh.dest_q_name``.
    """
    if md.format != FMT_DEAD_LETTER_HEADER:
        raise WireError(
            Reason.FORMAT_ERROR,
            f"MQMD.Format is {md.format!r}, expected {FMT_DEAD_LETTER_HEADER!r}",
        )
    dlh, used = decode_dlh(data, md.encoding, ccsid=md.coded_char_set_id)
    original = replace(
        md, format=dlh.format, encoding=dlh.encoding, coded_char_set_id=dlh.coded_char_set_id
    )
    return dlh, original, bytes(memoryview(data)[used:])
