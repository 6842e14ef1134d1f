"""Reply addressing: the MQMDs of requests, replies and reports, and what an MQ answer
becomes for the requester.

Why one module: the CorrelId/MsgId rules of MQ request/reply (the Report options
PASS_CORREL_ID, PASS_MSG_ID, PASS_DISCARD_AND_EXPIRY and COPY_MSG_ID_TO_CORREL_ID, MQ's
default) must be applied identically when the gateway asks (requester routes) and when
it answers (service routes), and the error reply format must have one definition.
Reference: IBM MQ "MQMD - Report", "MQMD - CorrelId", "Reply-to queue and queue
manager"; docs/request-reply.md "Reply addressing".
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.plugin_api import Envelope
from gateway.routing.correlation import PendingRequest, PendingService
from gateway.routing.routes import ReportOption, RequestRoute
from gateway.wire.chain import parse_message
from gateway.wire.constants import CI_NONE, EI_UNLIMITED, ENC_NATIVE, MI_NONE
from gateway.wire.errors import WireError
from gateway.wire.folder import Element, usr_properties_of
from gateway.wire.formats import FMT_NONE, FMT_RF_HEADER_2, FMT_STRING
from gateway.wire.mqmd import MQMD, Feedback, MsgType, Persistence, Report
from gateway.wire.rfh2 import MQRFH2, encode_rfh2

__all__ = [
    "ERROR_KINDS",
    "REPORT_BITS",
    "ReplyKind",
    "classify",
    "correlation_key",
    "error_envelope",
    "reply_envelope",
    "reply_md",
    "report_md",
    "request_md",
    "request_message",
    "usr_folder",
    "wants_report",
]

#: Route ``report:`` option -> the plain MQRO bit put in the request (no data: the
#: gateway only needs the Feedback, never the original message back).
REPORT_BITS: dict[ReportOption, int] = {
    "exception": Report.EXCEPTION,
    "expiration": Report.EXPIRATION,
    "coa": Report.COA,
    "cod": Report.COD,
}
#: The ``error`` values of the error reply (docs/request-reply.md).
ERROR_KINDS = frozenset({"timeout", "expired", "exception", "coa", "cod", "refused"})

# Plain ints for bit tests (IntFlag arithmetic is slow and its repr noisy).
_PASS_CORREL_ID = int(Report.PASS_CORREL_ID)
_PASS_MSG_ID = int(Report.PASS_MSG_ID)
_PASS_DISCARD_AND_EXPIRY = int(Report.PASS_DISCARD_AND_EXPIRY)
_DISCARD_MSG = int(Report.DISCARD_MSG)
_EXPIRATION = int(Report.EXPIRATION)
_EXCEPTION = int(Report.EXCEPTION)
_COA = int(Report.COA)
_COD = int(Report.COD)


def _payload_format(env: Envelope) -> str:
    return FMT_STRING if env.is_text else env.payload_format.strip()


def _tenths(seconds: float) -> int:
    """Seconds as an MQ Expiry (tenths of a second, rounded up, at least 1). Rounded to
    a microsecond first so float noise in ``expiry_at - now`` does not add a tenth."""
    return max(1, math.ceil(round(seconds * 10, 5)))


def request_md(
    route: RequestRoute,
    env: Envelope,
    *,
    msg_id: bytes,
    reply_to_q: str,
    reply_to_q_mgr: str,
    now: float,
) -> MQMD:
    """The MQMD of a request put for ``env`` (put it with new_msg_id False).

    Expiry is the requester's own (``env.expiry``) when it has one, else the route's
    ``expiry``, else unlimited. In ``correl_id`` mode the request asks PASS_CORREL_ID and
    carries ``msg_id`` as CorrelId too, so in both modes the answer's CorrelId is
    ``msg_id``. ``now`` is unused today (the queue manager stamps PutDate/PutTime); it
    is part of the signature so callers pass one clock to every builder.
    """
    del now
    report = 0
    for option in route.report:
        report |= REPORT_BITS[option]
    correl_mode = route.correlation == "correl_id"
    if correl_mode:
        report |= _PASS_CORREL_ID
    if env.expiry > 0:
        expiry = env.expiry
    elif route.expiry is not None:
        expiry = _tenths(route.expiry)
    else:
        expiry = EI_UNLIMITED
    return MQMD(
        msg_type=MsgType.REQUEST,
        report=report,
        expiry=expiry,
        format=_payload_format(env),
        encoding=env.encoding,
        coded_char_set_id=env.ccsid,
        persistence=Persistence.PERSISTENT if route.persistent else Persistence.NOT_PERSISTENT,
        msg_id=msg_id,
        correl_id=msg_id if correl_mode else CI_NONE,
        reply_to_q=reply_to_q,
        reply_to_q_mgr=reply_to_q_mgr,
    )


#: A property name that can be an MQRFH2 ``usr`` element (dots: nested groups).
_USR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*")
#: CCSID of the MQRFH2 the gateway writes (its folders are UTF-8).
_HEADER_CCSID = 1208


def usr_folder(properties: Iterable[tuple[str, str]]) -> Element | None:
    """The MQRFH2 ``usr`` folder of a request's properties (a dotted name is a nested
    group, as on the way back); names that cannot be XML element names are left out.
    None when nothing remains."""
    usr = Element("usr")
    for name, value in properties:
        if not _USR_NAME.fullmatch(name):
            continue
        *groups, leaf = name.split(".")
        parent = usr
        for group in groups:
            found = next((c for c in parent.children if c.name == group and c.children), None)
            if found is None:
                found = Element(group)
                parent.children.append(found)
            parent = found
        parent.children.append(Element(leaf, text=value))
    return usr if usr.children else None


def request_message(md: MQMD, env: Envelope) -> tuple[MQMD, bytes]:
    """The MQMD and body put for a request: the payload as is, or, when the request
    carries properties, behind an MQRFH2 whose ``usr`` folder holds them (the MQMD then
    says MQHRF2; the MQRFH2 keeps the payload's format, encoding and CCSID)."""
    usr = usr_folder(env.property_items())
    if usr is None:
        return md, env.payload
    rfh2 = MQRFH2(
        folders=[usr],
        encoding=md.encoding,
        coded_char_set_id=md.coded_char_set_id,
        format=md.format,
    )
    header = encode_rfh2(rfh2, ENC_NATIVE, ccsid=_HEADER_CCSID)
    out = dataclasses.replace(
        md, format=FMT_RF_HEADER_2, encoding=ENC_NATIVE, coded_char_set_id=_HEADER_CCSID
    )
    return out, header + env.payload


def correlation_key(route: RequestRoute, msg_id: bytes) -> bytes:
    """The CorrelId the answer to a request put with ``msg_id`` carries: ``msg_id`` in
    both modes (copied by the service, or passed back from our CorrelId = msg_id)."""
    del route
    return msg_id


def _answer_ids(pending: PendingService) -> tuple[bytes, bytes]:
    """(MsgId, CorrelId) of a reply or report to ``pending``'s request, per its Report:
    CorrelId = the request's CorrelId with PASS_CORREL_ID, else its MsgId (MQ's default
    COPY_MSG_ID_TO_CORREL_ID); MsgId = the request's with PASS_MSG_ID, else none (the
    queue manager generates a new one)."""
    correl_id = pending.correl_id if pending.report & _PASS_CORREL_ID else pending.msg_id
    msg_id = pending.msg_id if pending.report & _PASS_MSG_ID else MI_NONE
    return msg_id, correl_id


def _answer_expiry_and_report(pending: PendingService, now: float) -> tuple[int, int]:
    """(Expiry, Report) of an answer: with PASS_DISCARD_AND_EXPIRY the request's
    remaining expiry and its DISCARD_MSG; otherwise unlimited and no options."""
    if not pending.report & _PASS_DISCARD_AND_EXPIRY:
        return EI_UNLIMITED, 0
    expiry = EI_UNLIMITED if pending.expiry_at is None else _tenths(pending.expiry_at - now)
    return expiry, pending.report & _DISCARD_MSG


def reply_md(pending: PendingService, env: Envelope, *, now: float) -> MQMD:
    """The MQMD of the reply to ``pending``'s request carrying ``env``'s payload
    (put with new_msg_id when MsgId is none)."""
    msg_id, correl_id = _answer_ids(pending)
    expiry, report = _answer_expiry_and_report(pending, now)
    return MQMD(
        msg_type=MsgType.REPLY,
        report=report,
        expiry=expiry,
        format=_payload_format(env),
        encoding=env.encoding,
        coded_char_set_id=env.ccsid,
        persistence=pending.persistence,
        priority=pending.priority,
        msg_id=msg_id,
        correl_id=correl_id,
    )


def report_md(pending: PendingService, feedback: int, *, now: float) -> MQMD:
    """The MQMD of a report (no data) to ``pending``'s request: the service-side timeout
    sends Feedback EXPIRATION (258) when :func:`wants_report` says so."""
    msg_id, correl_id = _answer_ids(pending)
    expiry, report = _answer_expiry_and_report(pending, now)
    return MQMD(
        msg_type=MsgType.REPORT,
        feedback=feedback,
        report=report,
        expiry=expiry,
        format=FMT_NONE,
        persistence=pending.persistence,
        priority=pending.priority,
        msg_id=msg_id,
        correl_id=correl_id,
    )


def wants_report(report: int, feedback: int) -> bool:
    """Whether a request with Report options ``report`` asked for a report with
    ``feedback``: EXPIRATION -> any EXPIRATION option, COA/COD -> theirs, anything else
    (an MQRC or application feedback) -> any EXCEPTION option."""
    if feedback == Feedback.EXPIRATION:
        return bool(report & _EXPIRATION)
    if feedback == Feedback.COA:
        return bool(report & _COA)
    if feedback == Feedback.COD:
        return bool(report & _COD)
    return bool(report & _EXCEPTION)


@dataclass(frozen=True, slots=True)
class ReplyKind:
    """What an answer on the reply queue is: ``kind`` (reply|coa|cod|expired|exception),
    its Feedback, and whether it ends the exchange (``final``)."""

    kind: str
    feedback: int
    final: bool


_REPLY = ReplyKind("reply", 0, True)


def classify(md: MQMD) -> ReplyKind:
    """Classify an answer by MsgType and Feedback. Anything that is not a REPORT counts
    as the reply (datagram answers are accepted, as MQ applications do)."""
    if md.msg_type != MsgType.REPORT:
        return _REPLY
    if md.feedback == Feedback.COA:
        return ReplyKind("coa", Feedback.COA, False)
    if md.feedback == Feedback.COD:
        return ReplyKind("cod", Feedback.COD, False)
    if md.feedback == Feedback.EXPIRATION:
        return ReplyKind("expired", Feedback.EXPIRATION, True)
    return ReplyKind("exception", md.feedback, True)


def error_envelope(
    pending: PendingRequest, kind: str, *, feedback: int = 0, text: str = ""
) -> Envelope:
    """THE error reply: UTF-8 JSON ``{"error", "feedback", "text", "route"}`` to the
    requester's reply topic with its correlation data; properties ``mq.error`` and
    ``mq.feedback`` say the same for clients that read headers only."""
    if kind not in ERROR_KINDS:
        raise ValueError(f"error kind {kind!r} is not one of {sorted(ERROR_KINDS)}")
    body = {"error": kind, "feedback": feedback, "text": text, "route": pending.route}
    return Envelope(
        stream="",
        topic=pending.reply_topic,
        payload=json.dumps(body, ensure_ascii=False).encode("utf-8"),
        payload_format=FMT_STRING,
        ccsid=1208,
        properties={"mq.error": kind, "mq.feedback": str(feedback)},
        correlation_data=pending.correlation_data,
    )


def reply_envelope(pending: PendingRequest, md: MQMD, payload: bytes) -> Envelope:
    """An MQ reply as the exchange envelope for the requester.

    Leading MQRFH2 headers are stripped; their ``usr`` properties become properties (a
    nested group as dotted names, as IBM MQ names them). A body whose MQRFH2 does not
    decode is passed on as is, with property ``mq.header.error`` saying why.
    """
    properties: dict[str, str] = {}
    body, fmt, encoding, ccsid = payload, md.format, md.encoding, md.coded_char_set_id
    if md.format == FMT_RF_HEADER_2:
        try:
            parsed = parse_message(md, payload)
            leading = 0
            while leading < len(parsed.headers) and isinstance(parsed.headers[leading], MQRFH2):
                leading += 1
            if leading < len(parsed.headers):
                parsed = parse_message(md, payload, depth=leading)
        except WireError as exc:
            properties["mq.header.error"] = f"MQRFH2 not decoded: {exc}"
        else:
            body, fmt, encoding, ccsid = (
                parsed.payload,
                parsed.format,
                parsed.encoding,
                parsed.ccsid,
            )
            for header in parsed.headers:
                assert isinstance(header, MQRFH2)
                for folder in header.folders_named("usr"):
                    properties.update(usr_properties_of(folder)[0])
    properties["mq.msg.type"] = "reply"
    properties["mq.feedback"] = "0"
    return Envelope(
        stream="",
        topic=pending.reply_topic,
        payload=body,
        payload_format=fmt.strip(),
        encoding=encoding,
        ccsid=ccsid,
        properties=properties,
        persistent=md.persistence == Persistence.PERSISTENT,
        correlation_data=pending.correlation_data,
    )
