"""Broker responses to command messages (reference §5.6, §5.5 ``pscr``, §5.7).

When: MsgType REQUEST always gets a response; DATAGRAM per its Report options (PAN =
on success, NAN = on failure, either for a warning). What: MQRFH v1 ``MQPSCompCode
MQPSReason MQPSReasonText`` (+ MQPSParmId/MQPSErrorPos and the culprit on error), or
an MQRFH2 ``pscr`` folder (+ the original ``psc`` on warning/error). MQMD: MsgType
REPLY, CorrelId = the command's MsgId (or its CorrelId with MQRO_PASS_CORREL_ID),
Priority/Persistence/Expiry copied from the command.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.pubsub.commands import HeaderKind
from gateway.wire.constants import ENC_NATIVE, MI_NONE, CompCode, MsgType, PutApplType, Report
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_NONE, FMT_RF_HEADER, FMT_RF_HEADER_2
from gateway.wire.mqmd import MQMD
from gateway.wire.put_time import put_date_time
from gateway.wire.reasons import Reason, reason_text
from gateway.wire.rfh import MQRFH, encode_rfh
from gateway.wire.rfh2 import MQRFH2, encode_rfh2

#: CCSID of the response headers' own text.
RESPONSE_CCSID = 1208


@dataclass(frozen=True, slots=True)
class ResponseDetail:
    """What a negative response names: the tag/element, its value, the error position."""

    parm_id: str = ""
    value: str = ""
    error_pos: int = -1


def response_wanted(md: MQMD, comp_code: int) -> bool:
    """The §5.7 rule: REQUEST always; DATAGRAM by PAN/NAN; nothing without a ReplyToQ."""
    if not md.reply_to_q:
        return False
    if md.msg_type == MsgType.REQUEST:
        return True
    pan = bool(md.report & Report.PAN)
    nan = bool(md.report & Report.NAN)
    if md.msg_type == MsgType.DATAGRAM:
        if comp_code == CompCode.OK:
            return pan
        if comp_code == CompCode.WARNING:
            return pan or nan
        return nan
    return True  # an invalid MsgType is reported to whoever asked for replies


def build_response(
    cmd_md: MQMD,
    kind: HeaderKind,
    psc: Element | None,
    *,
    name_values: list[tuple[str, str]] | None = None,
    comp_code: int,
    reason: int,
    detail: ResponseDetail,
    broker_q_mgr: str,
    now: float | None = None,
) -> tuple[str, str, MQMD, bytes] | None:
    """(ReplyToQMgr, ReplyToQ, MQMD, body) of the response, or None when none is due."""
    if not response_wanted(cmd_md, comp_code):
        return None
    if kind is HeaderKind.RFH:
        response = _rfh_response(comp_code, reason, detail)
        body = b""
        if comp_code != CompCode.OK and name_values and reason != Reason.RFH_ERROR:
            # The failing command's NameValueString follows the response (§5.6), here
            # as a second MQRFH so the message stays a well-formed header chain.
            response.format = FMT_RF_HEADER
            body = encode_rfh(MQRFH(name_values=name_values), ENC_NATIVE, ccsid=RESPONSE_CCSID)
        body = encode_rfh(response, ENC_NATIVE, ccsid=RESPONSE_CCSID) + body
        fmt, appl_type = FMT_RF_HEADER, PutApplType.QMGR
    else:
        body = encode_rfh2(
            _pscr_response(comp_code, reason, detail, psc), ENC_NATIVE, ccsid=RESPONSE_CCSID
        )
        fmt, appl_type = FMT_RF_HEADER_2, PutApplType.BROKER
    put_date, put_time = put_date_time(now)
    md = MQMD(
        report=0,
        msg_type=MsgType.REPLY,
        expiry=cmd_md.expiry,
        encoding=ENC_NATIVE,
        coded_char_set_id=RESPONSE_CCSID,
        format=fmt,
        priority=cmd_md.priority,
        persistence=cmd_md.persistence,
        msg_id=cmd_md.msg_id if cmd_md.report & Report.PASS_MSG_ID else MI_NONE,
        correl_id=cmd_md.correl_id if cmd_md.report & Report.PASS_CORREL_ID else cmd_md.msg_id,
        reply_to_q="",
        reply_to_q_mgr=broker_q_mgr,
        user_identifier=cmd_md.user_identifier,
        accounting_token=cmd_md.accounting_token,
        appl_identity_data=cmd_md.appl_identity_data,
        put_appl_type=appl_type,
        put_appl_name=broker_q_mgr[:28],
        put_date=put_date,
        put_time=put_time,
    )
    return cmd_md.reply_to_q_mgr, cmd_md.reply_to_q, md, body


def _rfh_response(comp_code: int, reason: int, detail: ResponseDetail) -> MQRFH:
    pairs = [
        ("MQPSCompCode", str(int(comp_code))),
        ("MQPSReason", str(int(reason))),
        ("MQPSReasonText", reason_text(reason) if reason else "MQRC_NONE"),
    ]
    if comp_code != CompCode.OK:
        if detail.parm_id.startswith("MQPS"):
            pairs.append(("MQPSParmId", detail.parm_id))
            if detail.value and detail.parm_id in (
                "MQPSTopic",
                "MQPSCommand",
                "MQPSRegOpts",
                "MQPSPubOpts",
                "MQPSDelOpts",
                "MQPSStreamName",
            ):
                pairs.append((detail.parm_id, detail.value))
        if detail.error_pos >= 0:
            pairs.append(("MQPSErrorPos", str(detail.error_pos)))
    return MQRFH(name_values=pairs, coded_char_set_id=0, format=FMT_NONE)


def _pscr_response(
    comp_code: int, reason: int, detail: ResponseDetail, psc: Element | None
) -> MQRFH2:
    completion = {CompCode.OK: "ok", CompCode.WARNING: "warning"}.get(CompCode(comp_code), "error")
    pscr = Element("pscr")
    pscr.add("Completion", completion)
    if comp_code != CompCode.OK:
        response = Element("Response")
        response.add("Reason", str(int(reason)))
        if detail.parm_id and not detail.parm_id.startswith("MQPS") and detail.parm_id != "psc":
            response.add(detail.parm_id, detail.value)
        pscr.children.append(response)
    folders = [pscr]
    if comp_code != CompCode.OK and psc is not None:
        folders.append(psc)
    return MQRFH2(folders=folders, format=FMT_NONE, coded_char_set_id=RESPONSE_CCSID)
