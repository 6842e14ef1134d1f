"""Reply addressing: request/reply/report MQMDs per MQ's Report rules, classification,
the error reply and the reply envelope."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.plugin_api import Envelope
from gateway.routing.addressing import (
    ReplyKind,
    classify,
    correlation_key,
    error_envelope,
    reply_envelope,
    reply_md,
    report_md,
    request_md,
    wants_report,
)
from gateway.routing.correlation import PendingRequest, PendingService, request_token
from gateway.routing.routes import RequestRoute
from gateway.wire.chain import build_message
from gateway.wire.constants import CI_NONE, MI_NONE
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_NONE, FMT_RF_HEADER_2, FMT_STRING
from gateway.wire.mqmd import MQMD, Feedback, MsgType, Persistence, Report
from gateway.wire.rfh2 import MQRFH2

NOW = 1_700_000_000.0
OPTIONS = ("exception", "expiration", "coa", "cod")
BITS = {
    "exception": Report.EXCEPTION,
    "expiration": Report.EXPIRATION,
    "coa": Report.COA,
    "cod": Report.COD,
}


def _route(**changes: object) -> RequestRoute:
    base: dict[str, object] = {
        "name": "quote",
        "plugin": "kafka1",
        "source": "quote.requests",
        "destination": "SVC.QUOTE",
    }
    base.update(changes)
    return RequestRoute.model_validate(base)


def _env(**changes: object) -> Envelope:
    base: dict[str, object] = {"stream": "", "topic": "quote.requests", "payload": b"hello"}
    base.update(changes)
    return Envelope(**base)  # type: ignore[arg-type]


def _pending_service(report: int, **changes: object) -> PendingService:
    p = PendingService(
        token=b"M" * 24,
        route="pricing",
        msg_id=b"M" * 24,
        correl_id=b"C" * 24,
        reply_to_q="APP.REPLY",
        reply_to_q_mgr="QMA",
        report=report,
        persistence=Persistence.PERSISTENT,
        priority=7,
        expiry_at=None,
        deadline=NOW + 30,
    )
    for name, value in changes.items():
        setattr(p, name, value)
    return p


def _pending_request() -> PendingRequest:
    return PendingRequest(
        key=b"K" * 24,
        route="quote",
        source_id="quote|id|00",
        reply_topic="replies/42",
        correlation_data=b"\x00corr\xff",
        msg_id=b"K" * 24,
        deadline=NOW + 30,
    )


def _mq_answer(request: MQMD, msg_type: int, feedback: int = 0) -> MQMD:
    """What a conforming MQ application (or queue manager, for reports) sends back:
    IBM MQ's documented CorrelId/MsgId rules, written independently of the code."""
    # PASS_CORREL_ID, else MQRO_COPY_MSG_ID_TO_CORREL_ID (the default).
    passed = request.report & Report.PASS_CORREL_ID
    correl_id = request.correl_id if passed else request.msg_id
    msg_id = request.msg_id if request.report & Report.PASS_MSG_ID else b"N" * 24
    return MQMD(msg_type=msg_type, feedback=feedback, correl_id=correl_id, msg_id=msg_id)


# ---- request_md -----------------------------------------------------------------

ALL_COMBINATIONS = [
    list(c) for n in range(len(OPTIONS) + 1) for c in itertools.combinations(OPTIONS, n)
]


@pytest.mark.parametrize("report", ALL_COMBINATIONS)
@pytest.mark.parametrize("correlation", ["msg_id", "correl_id"])
def test_request_md_report_options(report: list[str], correlation: str) -> None:
    route = _route(report=report, correlation=correlation)
    msg_id = request_token("quote|id|01")
    md = request_md(
        route, _env(), msg_id=msg_id, reply_to_q="MQGW.REPLY", reply_to_q_mgr="GW", now=NOW
    )
    expected = 0
    for option in report:
        expected |= BITS[option]
    if correlation == "correl_id":
        expected |= Report.PASS_CORREL_ID
    assert md.report == expected
    # Plain options only: no *_WITH_DATA, never PASS_MSG_ID/DISCARD.
    assert (
        md.report
        & ~(Report.EXCEPTION | Report.EXPIRATION | Report.COA | Report.COD | Report.PASS_CORREL_ID)
        == 0
    )
    assert md.msg_type == MsgType.REQUEST
    assert md.msg_id == msg_id
    assert md.correl_id == (msg_id if correlation == "correl_id" else CI_NONE)
    assert (md.reply_to_q, md.reply_to_q_mgr) == ("MQGW.REPLY", "GW")
    key = correlation_key(route, msg_id)
    assert key == msg_id
    # Every answer MQ sends (reply and each report asked for) carries the key.
    assert _mq_answer(md, MsgType.REPLY).correl_id == key
    for option, feedback in (
        ("coa", Feedback.COA),
        ("cod", Feedback.COD),
        ("expiration", Feedback.EXPIRATION),
        ("exception", 2085),
    ):
        assert wants_report(md.report, feedback) == (option in report)
        assert _mq_answer(md, MsgType.REPORT, feedback).correl_id == key
    md.pack()  # encodable as is


def test_request_md_fields_from_envelope_and_route() -> None:
    env = _env(payload_format="MQSTR", encoding=273, ccsid=819)
    md = request_md(_route(), env, msg_id=b"x" * 24, reply_to_q="R", reply_to_q_mgr="", now=NOW)
    assert (md.format, md.encoding, md.coded_char_set_id) == (FMT_STRING, 273, 819)
    assert md.persistence == Persistence.PERSISTENT
    assert md.expiry == -1
    binary = _env(payload_format="", ccsid=1208)
    md = request_md(
        _route(persistent=False),
        binary,
        msg_id=b"x" * 24,
        reply_to_q="R",
        reply_to_q_mgr="",
        now=NOW,
    )
    assert md.format == FMT_NONE
    assert md.persistence == Persistence.NOT_PERSISTENT


@pytest.mark.parametrize(
    ("env_expiry", "route_expiry", "expected"),
    [(-1, None, -1), (55, None, 55), (55, 2.0, 55), (-1, 2.0, 20), (0, 0.01, 1), (-1, 0.25, 3)],
)
def test_request_md_expiry(env_expiry: int, route_expiry: float | None, expected: int) -> None:
    md = request_md(
        _route(expiry=route_expiry),
        _env(expiry=env_expiry),
        msg_id=b"x" * 24,
        reply_to_q="R",
        reply_to_q_mgr="",
        now=NOW,
    )
    assert md.expiry == expected


# ---- reply_md / report_md -------------------------------------------------------

_report_ints = st.integers(min_value=0, max_value=0x0FFFFFFF)


@given(report=_report_ints, remaining=st.none() | st.floats(min_value=-5, max_value=1e6))
def test_reply_and_report_ids_follow_the_request_report(
    report: int, remaining: float | None
) -> None:
    expiry_at = None if remaining is None else NOW + remaining
    pending = _pending_service(report, expiry_at=expiry_at)
    request = MQMD(
        msg_type=MsgType.REQUEST, report=report, msg_id=pending.msg_id, correl_id=pending.correl_id
    )
    mq = _mq_answer(request, MsgType.REPLY)
    for md in (
        reply_md(pending, _env(), now=NOW),
        report_md(pending, Feedback.EXPIRATION, now=NOW),
    ):
        assert md.correl_id == mq.correl_id
        assert md.msg_id == (pending.msg_id if report & Report.PASS_MSG_ID else MI_NONE)
        assert (md.persistence, md.priority) == (Persistence.PERSISTENT, 7)
        assert (md.reply_to_q, md.reply_to_q_mgr) == ("", "")
        if report & Report.PASS_DISCARD_AND_EXPIRY:
            assert md.report == report & Report.DISCARD_MSG
            if remaining is None:
                assert md.expiry == -1
            else:
                # The remaining time in tenths, rounded up (never expires early).
                tenths = remaining * 10
                assert md.expiry >= 1
                assert max(1.0, tenths - 1e-3) <= md.expiry < max(1.0, tenths) + 1
        else:
            assert (md.expiry, md.report) == (-1, 0)
        md.pack()


def test_reply_md_kind_and_format() -> None:
    pending = _pending_service(Report.PASS_CORREL_ID)
    md = reply_md(pending, _env(payload_format="MQSTR", ccsid=1208, encoding=546), now=NOW)
    assert md.msg_type == MsgType.REPLY
    assert (md.format, md.coded_char_set_id, md.encoding) == (FMT_STRING, 1208, 546)
    assert md.correl_id == b"C" * 24 and md.msg_id == MI_NONE
    rep = report_md(_pending_service(0), Feedback.EXPIRATION, now=NOW)
    assert (rep.msg_type, rep.feedback, rep.format) == (MsgType.REPORT, 258, FMT_NONE)
    assert rep.correl_id == b"M" * 24


def test_reply_md_remaining_expiry_in_tenths() -> None:
    pending = _pending_service(Report.PASS_DISCARD_AND_EXPIRY, expiry_at=NOW + 4.21)
    assert reply_md(pending, _env(), now=NOW).expiry == 43
    exact = _pending_service(Report.PASS_DISCARD_AND_EXPIRY, expiry_at=NOW + 1.9)
    assert reply_md(exact, _env(), now=NOW).expiry == 19  # no tenth added by float noise
    late = _pending_service(Report.PASS_DISCARD_AND_EXPIRY, expiry_at=NOW - 3)
    assert reply_md(late, _env(), now=NOW).expiry == 1


# ---- wants_report / classify ----------------------------------------------------


@pytest.mark.parametrize(
    ("report", "feedback", "wanted"),
    [
        (Report.EXPIRATION, 258, True),
        (Report.EXPIRATION_WITH_DATA, 258, True),
        (Report.EXPIRATION_WITH_FULL_DATA, 258, True),
        (Report.EXCEPTION, 258, False),
        (Report.COA, 259, True),
        (Report.COA_WITH_FULL_DATA, 259, True),
        (Report.COD, 259, False),
        (Report.COD_WITH_DATA, 260, True),
        (Report.COA, 260, False),
        (Report.EXCEPTION, 2085, True),
        (Report.EXCEPTION_WITH_DATA, 2087, True),
        (Report.EXPIRATION | Report.COA | Report.COD, 2085, False),
        (Report.NONE, 258, False),
        (Report.EXCEPTION, 65537, True),
    ],
)
def test_wants_report(report: int, feedback: int, wanted: bool) -> None:
    assert wants_report(report, feedback) is wanted


@pytest.mark.parametrize(
    ("msg_type", "feedback", "kind"),
    [
        (MsgType.REPLY, 0, ReplyKind("reply", 0, True)),
        (MsgType.DATAGRAM, 0, ReplyKind("reply", 0, True)),
        (MsgType.REQUEST, 0, ReplyKind("reply", 0, True)),
        (MsgType.REPORT, 259, ReplyKind("coa", 259, False)),
        (MsgType.REPORT, 260, ReplyKind("cod", 260, False)),
        (MsgType.REPORT, 258, ReplyKind("expired", 258, True)),
        (MsgType.REPORT, 2085, ReplyKind("exception", 2085, True)),
        (MsgType.REPORT, 65537, ReplyKind("exception", 65537, True)),
    ],
)
def test_classify(msg_type: int, feedback: int, kind: ReplyKind) -> None:
    assert classify(MQMD(msg_type=msg_type, feedback=feedback)) == kind


@given(
    report=st.lists(st.sampled_from(OPTIONS), unique=True),
    correlation=st.sampled_from(["msg_id", "correl_id"]),
    answer=st.sampled_from(
        [
            (MsgType.REPLY, 0, "reply"),
            (MsgType.REPORT, Feedback.COA, "coa"),
            (MsgType.REPORT, Feedback.COD, "cod"),
            (MsgType.REPORT, Feedback.EXPIRATION, "expired"),
            (MsgType.REPORT, 2087, "exception"),
        ]
    ),
    source=st.text(),
)
def test_round_trip_request_answer_classify(
    report: list[str], correlation: str, answer: tuple[int, int, str], source: str
) -> None:
    route = _route(report=report, correlation=correlation)
    msg_id = request_token(source)
    request = request_md(
        route, _env(), msg_id=msg_id, reply_to_q="MQGW.REPLY", reply_to_q_mgr="GW", now=NOW
    )
    # Through the bytes, as the service sees it.
    seen = MQMD.unpack(request.pack())
    msg_type, feedback, kind = answer
    back = MQMD.unpack(_mq_answer(seen, msg_type, feedback).pack())
    assert back.correl_id == correlation_key(route, msg_id)
    assert classify(back).kind == kind


# ---- error_envelope / reply_envelope ---------------------------------------------


def test_error_envelope() -> None:
    env = error_envelope(_pending_request(), "exception", feedback=2085, text="unknown queue")
    assert json.loads(env.payload.decode("utf-8")) == {
        "error": "exception",
        "feedback": 2085,
        "text": "unknown queue",
        "route": "quote",
    }
    assert list(json.loads(env.payload)) == ["error", "feedback", "text", "route"]
    assert (env.stream, env.topic) == ("", "replies/42")
    assert env.correlation_data == b"\x00corr\xff"
    assert dict(env.properties) == {"mq.error": "exception", "mq.feedback": "2085"}
    assert env.payload_format == "MQSTR" and env.ccsid == 1208
    timeout = error_envelope(_pending_request(), "timeout")
    assert json.loads(timeout.payload)["feedback"] == 0
    assert timeout.properties["mq.feedback"] == "0"
    with pytest.raises(ValueError, match="bogus"):
        error_envelope(_pending_request(), "bogus")


def test_error_envelope_text_is_utf8() -> None:
    env = error_envelope(_pending_request(), "refused", feedback=2087, text="Zürich QM")
    assert "Zürich QM".encode() in env.payload


def test_reply_envelope_plain_body() -> None:
    md = MQMD(
        msg_type=MsgType.REPLY,
        format=FMT_STRING,
        coded_char_set_id=819,
        encoding=273,
        persistence=Persistence.NOT_PERSISTENT,
    )
    env = reply_envelope(_pending_request(), md, b"price=42")
    assert env.payload == b"price=42"
    assert (env.payload_format, env.ccsid, env.encoding) == ("MQSTR", 819, 273)
    assert (env.topic, env.correlation_data) == ("replies/42", b"\x00corr\xff")
    assert dict(env.properties) == {"mq.msg.type": "reply", "mq.feedback": "0"}
    assert env.persistent is False


def test_reply_envelope_strips_mqrfh2_and_keeps_usr_properties() -> None:
    usr = Element.from_pairs("usr", {"Colour": "Blue", "Size": "3"})
    usr.children.append(Element("grp", children=[Element("inner", text="x")]))
    rfh2 = MQRFH2(folders=[usr, Element.from_pairs("mcd", {"Msd": "jms_text"})])
    fmt, enc, ccsid, data = build_message(
        [rfh2, MQRFH2(folders=[Element.from_pairs("usr", {"Second": "2"})])],
        b"price=42",
        FMT_STRING,
        payload_ccsid=1208,
    )
    md = MQMD(msg_type=MsgType.REPLY, format=fmt, encoding=enc, coded_char_set_id=ccsid)
    assert md.format == FMT_RF_HEADER_2
    env = reply_envelope(_pending_request(), md, data)
    assert env.payload == b"price=42"
    assert (env.payload_format, env.ccsid) == ("MQSTR", 1208)
    assert dict(env.properties) == {
        "Colour": "Blue",
        "Size": "3",
        "grp.inner": "x",
        "Second": "2",
        "mq.msg.type": "reply",
        "mq.feedback": "0",
    }


def test_reply_envelope_keeps_a_body_whose_mqrfh2_does_not_decode() -> None:
    md = MQMD(msg_type=MsgType.REPLY, format=FMT_RF_HEADER_2)
    env = reply_envelope(_pending_request(), md, b"RFH not really")
    assert env.payload == b"RFH not really"
    assert env.payload_format == "MQHRF2"
    assert env.properties["mq.header.error"].startswith("MQRFH2 not decoded")
