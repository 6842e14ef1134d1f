"""MQXQH: transmission-queue header (428 bytes, embedded version-1 MQMD).

Why: messages for another queue manager wait on a transmission queue prefixed by this
header; the gateway reads and writes them when it acts as a queue manager in the
network, and resolves names from RemoteQName/RemoteQMgrName.
Reference: IBM MQ "MQXQH - Transmission-queue header" (q101500, q101510); separate-MQMD
rules and MQMDE use from the protocol reference §6.1–§6.2. The XQH is always in the
queue manager's native encoding and CCSID, given by the separate MQMD.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace

from gateway.wire.ccsid import (
    DEFAULT_STRUCTURE_CCSID,
    decode_char_field,
    encode_char_field,
    is_ebcdic,
    structure_ccsid,
)
from gateway.wire.constants import (
    ENC_NATIVE,
    GI_NONE,
    MI_NONE,
    RO_ACCEPT_UNSUP_IF_XMIT_MASK,
)
from gateway.wire.encoding import byte_order
from gateway.wire.errors import WireError
from gateway.wire.fixed_part import FixedPart
from gateway.wire.formats import FMT_MD_EXTENSION, FMT_XMIT_Q_HEADER
from gateway.wire.mqmd import MQMD, MQMD_LENGTH_1
from gateway.wire.mqmde import MQMDE, decode_mqmde, encode_mqmde
from gateway.wire.reasons import Reason

MQXQH_STRUC_ID = "XQH "
MQXQH_VERSION_1 = 1
MQXQH_LENGTH_1 = 428
_PREFIX = 104  # StrucId + Version + RemoteQName + RemoteQMgrName
_ASCII_ID = b"XQH "
_EBCDIC_ID = b"\xe7\xd8\xc8\x40"
_HEAD = {o: struct.Struct(o + "4si48s48s") for o in "<>"}
assert _PREFIX + MQMD_LENGTH_1 == MQXQH_LENGTH_1
_FIXED_PART = FixedPart(
    "MQXQH",
    Reason.XQH_ERROR,
    _HEAD,
    ascii_id=_ASCII_ID,
    ebcdic_id=_EBCDIC_ID,
    min_length=MQXQH_LENGTH_1,
    version=MQXQH_VERSION_1,
)


@dataclass(slots=True)
class MQXQH:
    """Transmission-queue header: destination names plus the application's MQMD (v1)."""

    remote_q_name: str = ""
    remote_q_mgr_name: str = ""
    msg_desc: MQMD = field(default_factory=MQMD)
    struc_id: str = MQXQH_STRUC_ID
    version: int = MQXQH_VERSION_1


def decode_xqh(
    buf: bytes | bytearray | memoryview, encoding: int = ENC_NATIVE, *, ccsid: int = 0
) -> tuple[MQXQH, int]:
    """Decode an MQXQH at the start of ``buf``; returns it and 428 consumed."""
    (_, _, rq, rqm), text_ccsid, order = _FIXED_PART.unpack(buf, encoding, ccsid)
    embedded_version = struct.unpack_from(order + "i", buf, _PREFIX + 4)[0]
    if embedded_version != 1:
        raise WireError(
            Reason.XQH_ERROR,
            f"MQXQH embedded MsgDesc Version is {embedded_version}; it is always 1",
            _PREFIX + 4,
        )
    try:
        md = MQMD.unpack(buf, _PREFIX, encoding, text_ccsid)
    except WireError as exc:
        raise WireError(Reason.XQH_ERROR, f"embedded MsgDesc: {exc.message}", exc.offset) from None
    xqh = MQXQH(
        remote_q_name=decode_char_field(rq, text_ccsid, field="MQXQH.RemoteQName", offset=8),
        remote_q_mgr_name=decode_char_field(
            rqm, text_ccsid, field="MQXQH.RemoteQMgrName", offset=56
        ),
        msg_desc=md,
    )
    return xqh, MQXQH_LENGTH_1


def encode_xqh(xqh: MQXQH, encoding: int = ENC_NATIVE, *, ccsid: int = 0) -> bytes:
    """Encode ``xqh`` (428 bytes); the embedded MsgDesc is written as version 1.

    Version-2 values in ``msg_desc`` cannot be carried here: use :func:`wrap_for_xmitq`,
    which adds an MQMDE.
    """
    order = byte_order(encoding, field="MQXQH target encoding", decoding=False)
    text_ccsid = structure_ccsid(ccsid)
    if xqh.msg_desc.has_v2_values():
        raise WireError(
            Reason.XQH_ERROR,
            "MQXQH.msg_desc has version-2 values; carry them in an MQMDE (wrap_for_xmitq)",
        )
    md = replace(xqh.msg_desc, version=1, struc_ccsid=text_ccsid)
    head = _HEAD[order].pack(
        _EBCDIC_ID if is_ebcdic(text_ccsid) else _ASCII_ID,
        MQXQH_VERSION_1,
        encode_char_field(
            xqh.remote_q_name, 48, text_ccsid, field="MQXQH.remote_q_name", reason=Reason.XQH_ERROR
        ),
        encode_char_field(
            xqh.remote_q_mgr_name,
            48,
            text_ccsid,
            field="MQXQH.remote_q_mgr_name",
            reason=Reason.XQH_ERROR,
        ),
    )
    return head + md.pack(encoding)


@dataclass(slots=True)
class XmitMessage:
    """A transmission-queue message taken apart: where it goes and what it is."""

    remote_q_name: str
    remote_q_mgr_name: str
    md: MQMD
    body: bytes
    xqh: MQXQH
    mde: MQMDE | None = None


def wrap_for_xmitq(
    md: MQMD,
    body: bytes,
    remote_q_name: str,
    remote_q_mgr_name: str,
    *,
    qmgr_encoding: int = ENC_NATIVE,
    qmgr_ccsid: int = DEFAULT_STRUCTURE_CCSID,
    msg_id: bytes = MI_NONE,
) -> tuple[MQMD, bytes]:
    """Put an application message in transmission-queue form: (separate MQMD, XQH+data).

    The embedded MsgDesc is the application's MQMD as version 1; non-default version-2
    fields go into an MQMDE after the XQH (embedded Format ``MQHMDE``). The separate MQMD
    follows IBM's rules: Report with MQRO_ACCEPT_UNSUP_IF_XMIT_MASK bits cleared, MsgType/
    Expiry/Feedback/Priority/Persistence and context copied, Encoding/CCSID of the queue
    manager, Format ``MQXMIT``, MsgId ``msg_id`` (MQMI_NONE = let the queue manager
    assign one), CorrelId = the embedded MsgId, BackoutCount 0.
    """
    embedded = replace(
        md,
        version=1,
        group_id=GI_NONE,
        msg_seq_number=1,
        offset=0,
        msg_flags=0,
        original_length=-1,
        backout_count=0,
    )
    tail = b""
    if md.has_v2_values():
        mde = MQMDE(
            encoding=md.encoding,
            coded_char_set_id=md.coded_char_set_id,
            format=md.format,
            group_id=md.group_id,
            msg_seq_number=md.msg_seq_number,
            offset=md.offset,
            msg_flags=md.msg_flags,
            original_length=md.original_length,
        )
        tail = encode_mqmde(mde, qmgr_encoding, ccsid=qmgr_ccsid)
        embedded.format = FMT_MD_EXTENSION
        embedded.encoding = qmgr_encoding
        embedded.coded_char_set_id = qmgr_ccsid
    xqh = MQXQH(remote_q_name, remote_q_mgr_name, embedded)
    data = encode_xqh(xqh, qmgr_encoding, ccsid=qmgr_ccsid) + tail + bytes(body)
    separate = replace(
        md,
        version=2,
        report=md.report & ~RO_ACCEPT_UNSUP_IF_XMIT_MASK,
        encoding=qmgr_encoding,
        coded_char_set_id=qmgr_ccsid,
        format=FMT_XMIT_Q_HEADER,
        msg_id=msg_id,
        correl_id=md.msg_id,
        backout_count=0,
        group_id=GI_NONE,
        msg_seq_number=1,
        offset=0,
        msg_flags=0,
        original_length=-1,
    )
    return separate, data


def unwrap_from_xmitq(md: MQMD, data: bytes | bytearray | memoryview) -> XmitMessage:
    """Inverse of :func:`wrap_for_xmitq`: the destination, the application MQMD and data.

    An MQMDE after the XQH is folded back into a version-2 MQMD.
    """
    if md.format != FMT_XMIT_Q_HEADER:
        raise WireError(
            Reason.FORMAT_ERROR, f"MQMD.Format is {md.format!r}, expected {FMT_XMIT_Q_HEADER!r}"
        )
    xqh, used = decode_xqh(data, md.encoding, ccsid=md.coded_char_set_id)
    app = replace(xqh.msg_desc)
    mde: MQMDE | None = None
    if app.format == FMT_MD_EXTENSION:
        try:
            mde, n = decode_mqmde(
                memoryview(data)[used:], app.encoding, ccsid=app.coded_char_set_id
            )
        except WireError as exc:
            raise WireError(exc.reason, exc.message, used + max(exc.offset, 0)) from None
        used += n
        app.version = 2
        app.encoding = mde.encoding
        app.coded_char_set_id = mde.coded_char_set_id
        app.format = mde.format
        app.group_id = mde.group_id
        app.msg_seq_number = mde.msg_seq_number
        app.offset = mde.offset
        app.msg_flags = mde.msg_flags
        app.original_length = mde.original_length
    return XmitMessage(
        remote_q_name=xqh.remote_q_name,
        remote_q_mgr_name=xqh.remote_q_mgr_name,
        md=app,
        body=bytes(memoryview(data)[used:]),
        xqh=xqh,
        mde=mde,
    )
