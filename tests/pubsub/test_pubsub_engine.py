"""The pure engine: command options, retained publications, responses, negative cases.

Over 500 lines on purpose: these are the engine's behaviour tests through its one public
entry (``PubSubEngine.handle``), grouped by command like the seed's tables; split by
engine module (handlers / fan-out / working set) they would test internals instead.
"""

from __future__ import annotations

import pytest

from gateway.pubsub.engine import PubSubEngine
from gateway.pubsub.outcome import Outcome
from gateway.pubsub.store import MemoryStore
from gateway.pubsub.topics import Scheme
from gateway.wire.constants import MsgType, Persistence, PutApplType, Report
from gateway.wire.folder import Element
from gateway.wire.formats import FMT_RF_HEADER, FMT_RF_HEADER_2
from gateway.wire.reasons import Reason
from gateway.wire.rfh import decode_rfh
from tests.support.pubsub_messages import CONTROL, DEFAULT, decode, rfh2_message, rfh_message

REQ = MsgType.REQUEST
CID = b"SUBSCRIBER-CORREL-ID-001"


@pytest.fixture
def engine() -> PubSubEngine:
    return PubSubEngine("QM1", MemoryStore(), clock=lambda: 1_700_000_000.0)


def regsub(
    engine: PubSubEngine,
    topic: str,
    *opts: str,
    queue: str = "SUB.Q",
    stream: str | None = None,
    **md: object,
) -> Outcome:
    pairs = [("MQPSCommand", "RegSub"), ("MQPSTopic", topic), ("MQPSQName", queue)]
    pairs += [("MQPSRegOpts", o) for o in opts]
    if stream:
        pairs.append(("MQPSStreamName", stream))
    md.setdefault("reply_to_q", "REPLY.Q")
    md.setdefault("msg_type", REQ)
    return engine.handle(rfh_message(CONTROL, pairs, **md))


def publish(
    engine: PubSubEngine,
    topic: str,
    payload: bytes = b"data",
    *opts: str,
    queue: str = DEFAULT,
    **md: object,
) -> Outcome:
    pairs = [("MQPSCommand", "Publish"), ("MQPSTopic", topic)]
    pairs += [("MQPSPubOpts", o) for o in opts]
    return engine.handle(rfh_message(queue, pairs, payload, **md))


def response_of(outcome: Outcome) -> tuple[str, str, str]:
    assert outcome.response is not None
    got = decode(outcome.response.md, outcome.response.body)
    if got.fmt == FMT_RF_HEADER:
        return (
            got.get("MQPSCompCode") or "",
            got.get("MQPSReason") or "",
            got.get("MQPSReasonText") or "",
        )
    return (got.get("pscr/Completion") or "", got.get("pscr/Response/Reason") or "", "")


# ----------------------------------------------------------------- responses ---------


def test_ok_response_follows_md_conventions(engine: PubSubEngine) -> None:
    out = regsub(engine, "News/*", report=Report.PASS_CORREL_ID, correl_id=CID)
    assert response_of(out) == ("0", "0", "MQRC_NONE")
    assert out.response is not None
    md = out.response.md
    assert (out.response.queue, out.response.q_mgr) == ("REPLY.Q", "QM1")
    assert md.msg_type == MsgType.REPLY and md.format == FMT_RF_HEADER
    assert md.correl_id == CID  # MQRO_PASS_CORREL_ID
    assert md.put_appl_type == PutApplType.QMGR and md.put_appl_name == "QM1"


def test_response_correl_id_defaults_to_command_msg_id(engine: PubSubEngine) -> None:
    msg = rfh2_message(
        CONTROL, [("Command", "RegSub"), ("Topic", "a/#")], reply_to_q="R.Q", msg_type=REQ
    )
    out = engine.handle(msg)
    assert out.response is not None
    assert out.response.md.correl_id == msg.md.msg_id
    assert out.response.md.format == FMT_RF_HEADER_2
    assert response_of(out)[0] == "ok"


@pytest.mark.parametrize(
    ("report", "ok_expected", "fail_expected"),
    [
        (0, False, False),
        (Report.PAN, True, False),
        (Report.NAN, False, True),
        (Report.PAN | Report.NAN, True, True),
    ],
)
def test_datagram_responses_follow_pan_nan(
    report: int, ok_expected: bool, fail_expected: bool
) -> None:
    engine = PubSubEngine("QM1", MemoryStore())
    ok = regsub(engine, "t", msg_type=MsgType.DATAGRAM, report=report)
    assert (ok.response is not None) is ok_expected
    bad = regsub(engine, "t/#", msg_type=MsgType.DATAGRAM, report=report)  # '#' refused
    assert bad.reason == Reason.TOPIC_ERROR
    assert (bad.response is not None) is fail_expected


# ----------------------------------------------------------------- negatives ---------


@pytest.mark.parametrize(
    ("pairs", "reason"),
    [
        ([("MQPSTopic", "a"), ("MQPSCommand", "RegSub")], Reason.RFH_COMMAND_ERROR),
        ([("MQPSCommand", "Subscribe"), ("MQPSTopic", "a")], Reason.RFH_COMMAND_ERROR),
        ([("MQPSCommand", "RegSub")], Reason.RFH_PARM_MISSING),
        (
            [("MQPSCommand", "RegSub"), ("MQPSTopic", "a"), ("MQPSDelOpts", "Local")],
            Reason.RFH_PARM_ERROR,
        ),
        (
            [("MQPSCommand", "RegSub"), ("MQPSTopic", "a"), ("MQPSBogus", "x")],
            Reason.RFH_PARM_ERROR,
        ),
        (
            [
                ("MQPSCommand", "RegSub"),
                ("MQPSTopic", "a"),
                ("MQPSSubName", "x"),
                ("MQPSSubName", "y"),
            ],
            Reason.RFH_DUPLICATE_PARM,
        ),
        (
            [("MQPSCommand", "RegSub"), ("MQPSTopic", "a"), ("MQPSRegOpts", "Sometimes")],
            Reason.REG_OPTIONS_ERROR,
        ),
        (
            [
                ("MQPSCommand", "RegSub"),
                ("MQPSTopic", "a"),
                ("MQPSRegOpts", "Pers"),
                ("MQPSRegOpts", "NonPers"),
            ],
            Reason.REG_OPTIONS_ERROR,
        ),
        ([("MQPSCommand", "RegSub"), ("MQPSTopic", "Sport/#")], Reason.TOPIC_ERROR),
        ([("MQPSCommand", "RegSub"), ("MQPSTopic", "+/x")], Reason.TOPIC_ERROR),
        (
            [("MQPSCommand", "RegSub"), ("MQPSTopic", "a"), ("MQPSStreamName", "bad stream")],
            Reason.STREAM_ERROR,
        ),
        (
            [("MQPSCommand", "RegSub"), ("MQPSTopic", "a"), ("MQPSRegOpts", "CorrelAsId")],
            Reason.CORREL_ID_ERROR,
        ),
    ],
)
def test_malformed_rfh_commands_are_refused_and_dead_lettered(
    engine: PubSubEngine, pairs: list[tuple[str, str]], reason: int
) -> None:
    pairs = [*pairs, ("MQPSQName", "SUB.Q")] if pairs[0][0] == "MQPSCommand" else pairs
    out = engine.handle(rfh_message(CONTROL, pairs, reply_to_q="R.Q", msg_type=REQ))
    assert out.reason == reason
    assert out.dead_letter is not None and out.dead_letter.reason == reason
    assert response_of(out)[:2] == ("2", str(int(reason)))
    assert engine.subscriptions == [] and engine.pending_mutations == []


def test_psc_negative_cases(engine: PubSubEngine) -> None:
    cases = [
        ([("Command", "RegPub"), ("Topic", "a")], Reason.RFH_COMMAND_ERROR),  # not in psc
        ([("Topic", "a")], Reason.RFH_COMMAND_ERROR),
        ([("Command", "RegSub"), ("Topic", "a"), ("Colour", "red")], Reason.RFH_PARM_ERROR),
        ([("Command", "RegSub"), ("Topic", "a"), ("RegOpt", "Anon")], Reason.REG_OPTIONS_ERROR),
        (
            [("Command", "RegSub"), ("Topic", "a"), ("QName", "Q"), ("QName", "Q")],
            Reason.RFH_DUPLICATE_PARM,
        ),
        ([("Command", "RegSub"), ("Topic", "$SYS/STREAM/+/x")], Reason.STREAM_ERROR),
        ([("Command", "ReqUpdate"), ("Topic", "a"), ("Topic", "b")], Reason.RFH_DUPLICATE_PARM),
    ]
    for psc, reason in cases:
        out = engine.handle(rfh2_message(CONTROL, psc, reply_to_q="R.Q", msg_type=REQ))
        assert out.reason == reason, psc
        assert out.dead_letter is not None
        assert response_of(out)[:2] == ("error", str(int(reason)))


def test_error_pscr_returns_the_original_psc_folder(engine: PubSubEngine) -> None:
    out = engine.handle(
        rfh2_message(
            CONTROL,
            [("Command", "RegSub"), ("Topic", "a"), ("RegOpt", "Bogus")],
            reply_to_q="R.Q",
            msg_type=REQ,
        )
    )
    assert out.response is not None
    got = decode(out.response.md, out.response.body)
    assert [f.name for f in got.folders] == ["pscr", "psc"]
    assert got.get("pscr/Response/RegOpt") == "Bogus"


def test_message_without_pubsub_header_is_dead_lettered(engine: PubSubEngine) -> None:
    msg = rfh_message(CONTROL, [("MQPSCommand", "RegSub")], reply_to_q="R.Q", msg_type=REQ)
    msg.md.format = "MQSTR"
    out = engine.handle(msg)
    assert out.dead_letter is not None and out.dead_letter.reason == Reason.RFH_ERROR


def test_broken_name_value_string_reports_error_position(engine: PubSubEngine) -> None:
    msg = rfh_message(CONTROL, [("MQPSCommand", "RegSub")], reply_to_q="R.Q", msg_type=REQ)
    msg.body = msg.body.replace(b"RegSub", b'"RegSu')
    out = engine.handle(msg)
    assert out.reason == Reason.RFH_STRING_ERROR
    assert out.response is not None
    got = decode(out.response.md, out.response.body)
    assert got.get("MQPSErrorPos") == str(len("MQPSCommand "))


def test_bad_msg_type_is_refused(engine: PubSubEngine) -> None:
    out = regsub(engine, "a", msg_type=MsgType.REPORT)
    assert out.reason == Reason.MSG_TYPE_ERROR and out.dead_letter is not None


def test_control_commands_on_a_stream_queue_are_refused(engine: PubSubEngine) -> None:
    out = engine.handle(
        rfh_message(
            DEFAULT,
            [("MQPSCommand", "RegSub"), ("MQPSTopic", "a"), ("MQPSQName", "Q")],
            reply_to_q="R",
            msg_type=REQ,
        )
    )
    assert out.reason == Reason.INCORRECT_Q


@pytest.mark.parametrize("command", ["Publish", "DeletePub"])
def test_rfh_v1_stream_commands_on_the_control_queue_are_refused(
    engine: PubSubEngine, command: str
) -> None:
    regsub(engine, "ctl/t")
    pairs = [("MQPSCommand", command), ("MQPSTopic", "ctl/t")]
    out = engine.handle(rfh_message(CONTROL, pairs, b"x", reply_to_q="R", msg_type=REQ))
    assert out.reason == Reason.INCORRECT_Q == 3079
    assert out.deliveries == []
    # the same command as MQRFH2 is accepted there (MQ 8 style)
    psc = [("Command", command), ("Topic", "ctl/t")]
    out2 = engine.handle(rfh2_message(CONTROL, psc, b"x", reply_to_q="R", msg_type=REQ))
    assert out2.reason == 0
    if command == "Publish":
        assert [d.destination.queue for d in out2.deliveries] == ["SUB.Q"]


def test_deregistering_unknown_subscription_is_refused_not_dead_lettered(
    engine: PubSubEngine,
) -> None:
    out = engine.handle(
        rfh_message(
            CONTROL,
            [("MQPSCommand", "DeregSub"), ("MQPSTopic", "x"), ("MQPSQName", "SUB.Q")],
            reply_to_q="R",
            msg_type=REQ,
        )
    )
    assert out.reason == Reason.NOT_REGISTERED and out.dead_letter is None
    assert response_of(out)[:2] == ("2", "3073")


def test_publication_topic_with_wildcard_is_refused(engine: PubSubEngine) -> None:
    out = publish(engine, "Sport/*", reply_to_q="R", msg_type=REQ)
    assert out.reason == Reason.TOPIC_ERROR and out.dead_letter is not None


# ----------------------------------------------------------------- delivery ----------


def test_forwarded_publication_md(engine: PubSubEngine) -> None:
    regsub(engine, "a/*", "CorrelAsId", correl_id=CID, user_identifier="subuser")
    regsub(engine, "a/*", queue="OTHER.Q")
    out = publish(engine, "a/b", b"x", persistence=Persistence.PERSISTENT, priority=7)
    by_queue = {d.destination.queue: d for d in out.deliveries}
    md = by_queue["SUB.Q"].md
    assert md.msg_type == MsgType.DATAGRAM and md.report == 0
    assert md.correl_id == CID
    assert md.persistence == Persistence.PERSISTENT and md.priority == 7
    assert md.put_appl_type == PutApplType.BROKER and md.reply_to_q_mgr == "QM1"
    assert md.user_identifier == "subuser"
    other = by_queue["OTHER.Q"].md
    assert other.correl_id not in (bytes(24), CID)  # broker-chosen, non-zero


@pytest.mark.parametrize(
    ("opt", "expected"),
    [
        ("Pers", Persistence.PERSISTENT),
        ("NonPers", Persistence.NOT_PERSISTENT),
        ("PersAsQueue", Persistence.PERSISTENCE_AS_Q_DEF),
        ("PersAsPub", Persistence.PERSISTENT),
    ],
)
def test_subscription_persistence_options(engine: PubSubEngine, opt: str, expected: int) -> None:
    regsub(engine, "t", opt)
    out = publish(engine, "t", persistence=Persistence.PERSISTENT)
    assert out.deliveries[0].md.persistence == expected


def test_incl_stream_name_on_default_stream(engine: PubSubEngine) -> None:
    regsub(engine, "t", "InclStreamName", queue="WITH.Q")
    regsub(engine, "t", queue="WITHOUT.Q")
    out = publish(engine, "t")
    names = {
        d.destination.queue: decode(d.md, d.body).get("MQPSStreamName") for d in out.deliveries
    }
    assert names == {"WITH.Q": DEFAULT, "WITHOUT.Q": None}


def test_one_copy_per_subscriber_unless_dups_ok(engine: PubSubEngine) -> None:
    regsub(engine, "a/*")
    regsub(engine, "*/b")
    out = publish(engine, "a/b")
    assert len(out.deliveries) == 1
    regsub(engine, "a/?", "DupsOK")
    out = publish(engine, "a/b")
    assert len(out.deliveries) == 2


def test_other_subs_only_skips_the_publisher(engine: PubSubEngine) -> None:
    regsub(engine, "chat", queue="ME.Q")
    regsub(engine, "chat", queue="YOU.Q")
    out = publish(engine, "chat", b"hi", "OtherSubsOnly", reply_to_q="ME.Q")
    assert [d.destination.queue for d in out.deliveries] == ["YOU.Q"]


def test_rfh2_publication_keeps_user_folders_for_rfh2_subscribers(engine: PubSubEngine) -> None:
    engine.handle(
        rfh2_message(
            CONTROL, [("Command", "RegSub"), ("Topic", "p/#"), ("QName", "SUB2.Q")], reply_to_q="R"
        )
    )
    usr = Element.from_pairs("usr", {"Colour": "Blue"})
    out = engine.handle(
        rfh2_message(DEFAULT, [("Command", "Publish"), ("Topic", "p/q")], b"body", folders=[usr])
    )
    got = decode(out.deliveries[0].md, out.deliveries[0].body)
    assert got.get("usr/Colour") == "Blue" and got.payload == b"body"


def test_rfh_publication_data_pairs_are_forwarded(engine: PubSubEngine) -> None:
    regsub(engine, "d")
    out = engine.handle(
        rfh_message(
            DEFAULT,
            [
                ("MQPSCommand", "Publish"),
                ("MQPSTopic", "d"),
                ("MQPSIntData", "42"),
                ("MQPSStringData", "forty two"),
                ("MQPSSeqNum", "7"),
                ("MQPSPubTime", "2026112203000000"),
                ("Colour", "Red"),
            ],
        )
    )
    got = decode(out.deliveries[0].md, out.deliveries[0].body)
    assert got.get("MQPSIntData") == "42" and got.get("MQPSStringData") == "forty two"
    assert got.get("MQPSSeqNum") == "7" and got.get("Colour") == "Red"


def test_escaped_literal_topics_round_trip(engine: PubSubEngine) -> None:
    regsub(engine, "ABC?D")
    out = publish(engine, "ABC%*D")
    assert decode(out.deliveries[0].md, out.deliveries[0].body).topic == "ABC%*D"


def test_wildcards_never_cross_streams(engine: PubSubEngine) -> None:
    regsub(engine, "*", queue="DEFAULT.ALL")
    engine.handle(
        rfh2_message(
            CONTROL, [("Command", "RegSub"), ("Topic", "#"), ("QName", "RFH2.ALL")], reply_to_q="R"
        )
    )
    out = publish(engine, "x", queue="StreamX")  # implicit stream naming: StreamX
    assert out.deliveries == []
    out = publish(engine, "x")
    assert sorted(d.destination.queue for d in out.deliveries) == ["DEFAULT.ALL", "RFH2.ALL"]


# ----------------------------------------------------------------- retained ----------


def test_retained_publication_sent_to_new_subscribers(engine: PubSubEngine) -> None:
    publish(engine, "price/apple", b"1.00", "RetainPub")
    publish(engine, "price/apple", b"1.10", "RetainPub")  # replaces
    out = regsub(engine, "price/*", "InformIfRet")
    assert [d.body[-4:] for d in out.deliveries] == [b"1.10"]
    got = decode(out.deliveries[0].md, out.deliveries[0].body)
    assert got.get_all("MQPSPubOpts") == ["IsRetainedPub"]
    # without InformIfRet the flag is not shown
    out = regsub(engine, "price/*", queue="PLAIN.Q")
    assert decode(out.deliveries[0].md, out.deliveries[0].body).get("MQPSPubOpts") is None
    # NewPubsOnly: no retained publication on registration
    out = regsub(engine, "price/*", "NewPubsOnly", queue="NEW.Q")
    assert out.deliveries == []


def test_publish_on_request_only_and_request_update(engine: PubSubEngine) -> None:
    publish(engine, "q/1", b"r1", "RetainPub")
    out = regsub(engine, "q/*", "PubOnReqOnly", queue="POLL.Q")
    assert out.deliveries == []
    assert publish(engine, "q/1", b"live").deliveries == []  # not pushed
    upd = engine.handle(
        rfh_message(
            CONTROL,
            [("MQPSCommand", "ReqUpdate"), ("MQPSTopic", "q/*"), ("MQPSQName", "POLL.Q")],
            reply_to_q="R",
            msg_type=REQ,
        )
    )
    assert response_of(upd)[:2] == ("0", "0")
    assert [d.destination.queue for d in upd.deliveries] == ["POLL.Q"]
    assert decode(upd.deliveries[0].md, upd.deliveries[0].body).payload == b"r1"


def test_request_update_without_retained_is_refused(engine: PubSubEngine) -> None:
    regsub(engine, "none/*", "PubOnReqOnly")
    upd = engine.handle(
        rfh_message(
            CONTROL,
            [("MQPSCommand", "ReqUpdate"), ("MQPSTopic", "none/*"), ("MQPSQName", "SUB.Q")],
            reply_to_q="R",
            msg_type=REQ,
        )
    )
    assert upd.reason == Reason.NO_RETAINED_MSG and upd.dead_letter is None


def test_delete_publication(engine: PubSubEngine) -> None:
    publish(engine, "k/1", b"a", "RetainPub")
    publish(engine, "k/2", b"b", "RetainPub")
    out = engine.handle(
        rfh_message(
            DEFAULT,
            [("MQPSCommand", "DeletePub"), ("MQPSTopic", "k/1")],
            reply_to_q="R",
            msg_type=REQ,
        )
    )
    assert response_of(out)[:2] == ("0", "0")
    assert [r.topic for r in engine.retained()] == ["k/2"]
    engine.handle(rfh2_message(DEFAULT, [("Command", "DeletePub"), ("Topic", "k/#")]))
    assert engine.retained() == []


def test_retained_is_per_stream(engine: PubSubEngine) -> None:
    publish(engine, "r", b"x-stream", "RetainPub", queue="StreamX")
    assert engine.retained() == []
    assert [r.topic for r in engine.retained("StreamX")] == ["r"]
    out = regsub(engine, "r", stream="StreamX")
    assert len(out.deliveries) == 1


# ----------------------------------------------------------------- registration ------


def test_deregistration_and_dereg_all(engine: PubSubEngine) -> None:
    regsub(engine, "a")
    regsub(engine, "b")
    regsub(engine, "c", queue="KEEP.Q")
    out = engine.handle(
        rfh_message(
            CONTROL,
            [
                ("MQPSCommand", "DeregSub"),
                ("MQPSTopic", "a"),
                ("MQPSTopic", "zzz"),
                ("MQPSQName", "SUB.Q"),
            ],
            reply_to_q="R",
            msg_type=REQ,
        )
    )
    assert response_of(out)[:2] == ("1", "3073")  # partly done: warning
    assert sorted(s.topic for s in engine.subscriptions) == ["b", "c"]
    engine.handle(
        rfh_message(
            CONTROL,
            [("MQPSCommand", "DeregSub"), ("MQPSRegOpts", "DeregAll"), ("MQPSQName", "SUB.Q")],
        )
    )
    assert [s.topic for s in engine.subscriptions] == ["c"]


def test_identity_includes_correl_id_with_correl_as_id(engine: PubSubEngine) -> None:
    regsub(engine, "t", "CorrelAsId", correl_id=b"A" * 24)
    regsub(engine, "t", "CorrelAsId", correl_id=b"B" * 24)
    regsub(engine, "t", "CorrelAsId", correl_id=b"A" * 24)  # same identity: updated
    assert sorted(s.correl_id for s in engine.subscriptions) == [b"A" * 24, b"B" * 24]


def test_no_alter_keeps_existing_options(engine: PubSubEngine) -> None:
    regsub(engine, "t", "Pers")
    regsub(engine, "t", "NonPers", "NoAlter")
    assert publish(engine, "t").deliveries[0].md.persistence == Persistence.PERSISTENT
    regsub(engine, "t", "NonPers")
    assert publish(engine, "t").deliveries[0].md.persistence == Persistence.NOT_PERSISTENT


def test_register_and_deregister_publisher(engine: PubSubEngine) -> None:
    out = engine.handle(
        rfh_message(
            CONTROL,
            [("MQPSCommand", "RegPub"), ("MQPSTopic", "p"), ("MQPSQName", "PUB.Q")],
            reply_to_q="R",
            msg_type=REQ,
        )
    )
    assert response_of(out)[:2] == ("0", "0")
    assert [(p.topic, p.queue) for p in engine.publishers] == [("p", "PUB.Q")]
    engine.handle(
        rfh_message(
            CONTROL, [("MQPSCommand", "DeregPub"), ("MQPSTopic", "p"), ("MQPSQName", "PUB.Q")]
        )
    )
    assert engine.publishers == []
    again = engine.handle(
        rfh_message(
            CONTROL,
            [("MQPSCommand", "DeregPub"), ("MQPSTopic", "p"), ("MQPSQName", "PUB.Q")],
            reply_to_q="R",
            msg_type=REQ,
        )
    )
    assert again.reason == Reason.NOT_REGISTERED


def test_sink_subscribers_are_ordinary_subscribers(engine: PubSubEngine) -> None:
    publish(engine, "s/retained", b"old", "RetainPub")
    _sub, retained = engine.subscribe_sink("kafka", "s/#", scheme=Scheme.TOPIC)
    assert [d.publication.payload for d in retained] == [b"old"]
    regsub(engine, "s/*")
    out = publish(engine, "s/new", b"fresh")
    kinds = sorted(str(d.destination) for d in out.deliveries)
    assert kinds == ["SUB.Q@QM1", "sink:kafka"]
    sink_delivery = next(d for d in out.deliveries if d.destination.is_sink)
    assert sink_delivery.body == b"fresh" and sink_delivery.topic == "s/new"
    assert engine.unsubscribe_sink("kafka", "s/#")
    assert [d.destination.queue for d in publish(engine, "s/new").deliveries] == ["SUB.Q"]


def test_identity_belongs_to_its_user_unless_variable_user_id(engine: PubSubEngine) -> None:
    regsub(engine, "own", user_identifier="alice")
    out = regsub(engine, "own", "NonPers", user_identifier="mallory")
    assert out.reason == Reason.DUPLICATE_IDENTITY and out.dead_letter is None
    out = engine.handle(
        rfh_message(
            CONTROL,
            [("MQPSCommand", "DeregSub"), ("MQPSTopic", "own"), ("MQPSQName", "SUB.Q")],
            reply_to_q="R",
            msg_type=REQ,
            user_identifier="mallory",
        )
    )
    assert out.reason == Reason.DUPLICATE_IDENTITY
    assert [s.user_identifier for s in engine.subscriptions] == ["alice"]
    regsub(engine, "shared", "VariableUserId", user_identifier="alice")
    out = regsub(engine, "shared", "VariableUserId", "Pers", user_identifier="bob")
    assert out.reason == 0


def test_subscription_lapses_after_its_command_expiry() -> None:
    now = [1_000.0]
    engine = PubSubEngine("QM1", MemoryStore(), clock=lambda: now[0])
    regsub(engine, "short", expiry=50)  # MQMD Expiry in tenths: 5 seconds
    regsub(engine, "short", queue="FOREVER.Q")
    assert len(publish(engine, "short").deliveries) == 2
    now[0] += 6
    out = publish(engine, "short")
    assert [d.destination.queue for d in out.deliveries] == ["FOREVER.Q"]
    assert [s.destination.queue for s in engine.subscriptions] == ["FOREVER.Q"]
    engine.commit()
    assert [s.destination.queue for s in engine.store.load().subscriptions] == ["FOREVER.Q"]


def test_rfh_error_response_carries_the_failing_name_value_string(engine: PubSubEngine) -> None:
    pairs = [("MQPSCommand", "RegSub"), ("MQPSTopic", "a/#"), ("MQPSQName", "SUB.Q")]
    out = engine.handle(rfh_message(CONTROL, pairs, reply_to_q="R", msg_type=REQ))
    assert out.response is not None
    first, used = decode_rfh(out.response.body, ccsid=1208)
    assert first.get("MQPSReason") == str(int(Reason.TOPIC_ERROR))
    assert first.get("MQPSParmId") == "MQPSTopic" and first.get("MQPSTopic") == "a/#"
    assert first.format == FMT_RF_HEADER
    original, _ = decode_rfh(out.response.body[used:], ccsid=1208)
    assert original.name_values == pairs
    ok = regsub(engine, "fine")  # an OK response is the three standard pairs only
    assert ok.response is not None
    only, used = decode_rfh(ok.response.body, ccsid=1208)
    assert used == len(ok.response.body) and len(only.name_values) == 3


def test_user_properties_cross_header_formats(engine: PubSubEngine) -> None:
    regsub(engine, "props", queue="V1.Q")
    engine.handle(
        rfh2_message(CONTROL, [("Command", "RegSub"), ("Topic", "props"), ("QName", "V2.Q")])
    )
    out = engine.handle(
        rfh_message(
            DEFAULT,
            [
                ("MQPSCommand", "Publish"),
                ("MQPSTopic", "props"),
                ("Colour", "Red"),
                ("bad name!", "x"),
            ],
            b"1",
        )
    )
    by_queue = {d.destination.queue: decode(d.md, d.body) for d in out.deliveries}
    assert by_queue["V2.Q"].get("usr/Colour") == "Red"
    assert by_queue["V1.Q"].get("Colour") == "Red"
    usr = Element.from_pairs("usr", {"Size": "XL"})
    out = engine.handle(
        rfh2_message(DEFAULT, [("Command", "Publish"), ("Topic", "props")], b"2", folders=[usr])
    )
    by_queue = {d.destination.queue: decode(d.md, d.body) for d in out.deliveries}
    assert by_queue["V1.Q"].get("Size") == "XL"
    assert by_queue["V2.Q"].get("usr/Size") == "XL"
