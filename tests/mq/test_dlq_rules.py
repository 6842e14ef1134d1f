"""The runmqdlq-style rules table: parsing (every keyword, conventions, errors naming the
line), matching (table order, generics, symbolic names) and round trips."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.mq.dlq_rules import (
    Action,
    ControlData,
    DlqRulesError,
    Pattern,
    Rule,
    RulesTable,
    match_generic,
    parse_rules,
)
from gateway.wire.constants import Feedback, MsgType, Persistence, PutApplType
from gateway.wire.dlh import MQDLH
from gateway.wire.mqmd import MQMD
from gateway.wire.reasons import Reason


def dlh(**kw: object) -> MQDLH:
    values: dict[str, object] = dict(reason=Reason.UNKNOWN_OBJECT_NAME, dest_q_name="APP.IN",
                                     dest_q_mgr_name="QM1", format="MQSTR")
    values.update(kw)
    return MQDLH(**values)  # type: ignore[arg-type]


def md(**kw: object) -> MQMD:
    values: dict[str, object] = dict(format="MQDEAD", put_appl_name="payments",
                                     user_identifier="alice", msg_type=MsgType.DATAGRAM,
                                     persistence=Persistence.PERSISTENT)
    values.update(kw)
    return MQMD(**values)  # type: ignore[arg-type]


def errors(text: str) -> DlqRulesError:
    with pytest.raises(DlqRulesError) as err:
        parse_rules(text)
    return err.value


# ---------------------------------------------------------------- control data


def test_control_data_every_keyword() -> None:
    table = parse_rules(
        "inputq('MY.DLQ') inputqm(QM1) retryint(5) wait(30)\nACTION(IGNORE)\n"
    )
    assert table.control == ControlData(input_q="MY.DLQ", input_q_mgr="QM1", retry_int=5,
                                        wait=30)
    assert parse_rules("WAIT(no)\nACTION(DISCARD)").control.wait == "NO"
    assert parse_rules("WAIT(YES)\nACTION(DISCARD)").control.wait == "YES"
    assert parse_rules("ACTION(DISCARD)").control == ControlData()  # defaults
    assert parse_rules("INPUTQ(' ') INPUTQM(' ')\nACTION(DISCARD)").control == ControlData()


def test_ibm_sample_table_parses() -> None:
    text = """\
* An example rules table
inputqm(' ') inputq(' ')

* Rules
REASON(MQRC_Q_FULL) ACTION(RETRY) RETRY(5)
REASON(MQRC_PUT_INHIBITED) ACTION(RETRY) RETRY(5)
MSGTYPE(MQMT_REQUEST) REPLYQM(AAAA.*) +
ACTION(FWD) FWDQ(DEADQ) FWDQM(&REPLYQM)
DESTQM(bbbb.1) +
  action(fwd) fwdq(&DESTQ) fwdqm(bbbb.2) header(no)
PERSIST(MQPER_PERSISTENT) REASON (MQRC_PUT_INHIBITED) +
  ACTION (RETRY) RETRY (3)
ACTION(FWD) FWDQ(DEADQ.MANUAL) HEADER(YES)
"""
    table = parse_rules(text)
    assert len(table.rules) == 6
    r = table.rules
    assert r[0].pattern.reason == Reason.Q_FULL and r[0].action is Action.RETRY
    assert r[0].retry == 5 and r[0].line == 5
    assert r[2].pattern == Pattern(msgtype=MsgType.REQUEST, replyqm="AAAA.*")
    assert (r[2].fwd_q, r[2].fwd_q_mgr, r[2].header) == ("DEADQ", "&REPLYQM", True)
    assert r[3].pattern.destqm == "BBBB.1"  # bare values fold to upper case
    assert (r[3].fwd_q, r[3].fwd_q_mgr, r[3].header) == ("&DESTQ", "BBBB.2", False)
    assert r[4].pattern == Pattern(persist=Persistence.PERSISTENT,
                                   reason=Reason.PUT_INHIBITED)
    assert r[4].retry == 3 and r[4].line == 11


def test_every_pattern_keyword_and_symbolic_names() -> None:
    rule = parse_rules(
        "APPLIDAT('id 1') APPLNAME('payments') APPLTYPE(MQAT_UNIX) DESTQ(APP.IN) "
        "DESTQM(QM1) FEEDBACK(MQFB_COA) FORMAT(MQFMT_STRING) MSGTYPE(8) "
        "PERSIST(MQPER_NOT_PERSISTENT) REASON(2085) REPLYQ(R.Q) REPLYQM(QM2) "
        "USERID('alice') ACTION(IGNORE)"
    ).rules[0]
    assert rule.pattern == Pattern(
        applidat="id 1", applname="payments", appltype=PutApplType.UNIX, destq="APP.IN",
        destqm="QM1", feedback=Feedback.COA, format="MQSTR", msgtype=MsgType.DATAGRAM,
        persist=Persistence.NOT_PERSISTENT, reason=Reason.UNKNOWN_OBJECT_NAME,
        replyq="R.Q", replyqm="QM2", userid="alice",
    )
    # exception reports carry a reason code in Feedback
    fb = parse_rules("FEEDBACK(MQRC_Q_FULL) ACTION(IGNORE)").rules[0]
    assert fb.pattern.feedback == 2053
    assert parse_rules("APPLTYPE(-1) ACTION(IGNORE)").rules[0].pattern.appltype == -1


def test_every_action_keyword() -> None:
    table = parse_rules(
        "ACTION(FWD) FWDQ(INSPECT) FWDQM(QM2) HEADER(NO) PUTAUT(CTX) RETRY(7)\n"
        "ACTION(RETRY)\nACTION(DISCARD)\nACTION(IGNORE)\n"
    )
    fwd = table.rules[0]
    assert (fwd.action, fwd.fwd_q, fwd.fwd_q_mgr, fwd.header, fwd.put_aut, fwd.retry) == (
        Action.FWD, "INSPECT", "QM2", False, "CTX", 7)
    assert [r.action for r in table.rules[1:]] == [Action.RETRY, Action.DISCARD,
                                                   Action.IGNORE]
    assert all(r.retry == 1 and r.put_aut == "DEF" and r.header for r in table.rules[1:])
    assert parse_rules("ACTION(FWD) FWDQ(&REPLYQ)").rules[0].fwd_q == "&REPLYQ"


def test_conventions_commas_case_quotes_continuations() -> None:
    table = parse_rules(
        "   reason(mqrc_q_full),action(retry) , retry( 2 )   \n"
        "APPLNAME('ABC+\n   D') ACTION(IGNORE)\n"
        "APPLNAME('ABC-\n D') ACTION(IGNORE)\n"
        "USERID('o''neil') ACTION(IGNORE)\n"
        "\n*ACTION(BOGUS) comment lines are skipped\n"
        "DESTQ('lower.q') ACTION(IGNORE)\n"
    )
    assert table.rules[0].pattern.reason == Reason.Q_FULL and table.rules[0].retry == 2
    assert table.rules[1].pattern.applname == "ABCD"
    assert table.rules[2].pattern.applname == "ABC D"
    assert table.rules[3].pattern.userid == "o'neil"
    assert table.rules[4].pattern.destq == "lower.q"  # quoted: kept as written
    assert table.rules[4].line == 9


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("ACTION(IGNORE)\nDESTQ(A) COLOUR(RED) ACTION(IGNORE)", 2, "unknown keyword COLOUR"),
        ("* only comments\n\n", 1, "at least one rule"),
        ("INPUTQ(DLQ)\n", 1, "at least one rule"),
        ("DESTQ(A)\n", 1, "needs ACTION"),
        ("ACTION(DELETE)", 1, "DISCARD, IGNORE, RETRY or FWD"),
        ("ACTION(FWD)", 1, "needs FWDQ"),
        ("ACTION(FWD) FWDQ(' ')", 1, "not valid"),
        ("ACTION(FWD) FWDQ(&OTHER)", 1, "&DESTQ or &REPLYQ"),
        ("ACTION(FWD) FWDQ(X) FWDQM(&DESTQ)", 1, "&DESTQM or &REPLYQM"),
        ("ACTION(RETRY) FWDQ(X)", 1, "only valid with ACTION(FWD)"),
        ("ACTION(FWD) FWDQ(X) HEADER(MAYBE)", 1, "YES or NO"),
        ("ACTION(RETRY) RETRY(0)", 1, "out of range"),
        ("ACTION(RETRY) RETRY(ten)", 1, "not a number"),
        ("ACTION(IGNORE) PUTAUT(ALL)", 1, "DEF or CTX"),
        ("ACTION(IGNORE) ACTION(DISCARD)", 1, "twice"),
        ("ACTION(IGNORE)\n\nINPUTQ(DLQ)\n", 3, "first entry"),
        ("INPUTQ(DLQ) ACTION(IGNORE)", 1, "cannot share an entry"),
        ("WAIT(SOMETIMES)\nACTION(IGNORE)", 1, "YES, NO or a number"),
        ("RETRYINT(-5)\nACTION(IGNORE)", 1, "out of range"),
        ("ACTION(IGNORE)\nREASON(MQRC_NO_SUCH_THING) ACTION(IGNORE)", 2, "unknown symbolic"),
        ("ACTION(IGNORE)\nMSGTYPE(REQUEST) ACTION(IGNORE)", 2, "MQMT_"),
        ("FORMAT('') ACTION(IGNORE)", 1, "at least one character"),
        ("FORMAT() ACTION(IGNORE)", 1, "at least one character"),
        ("FORMAT ACTION(IGNORE)", 1, "needs a value in parentheses"),
        ("ACTION(IGNORE)\nAPPLNAME('abc) ACTION(IGNORE)", 2, "unterminated"),
        ("ACTION(IGNORE\n", 1, "missing ')'"),
        ("DESTQ(A B) ACTION(IGNORE)", 1, "single quotes"),
        ("DESTQ(A)ACTION(IGNORE)", 1, "blank or comma"),
        ("ACTION(IGNORE)\nFORMAT(TOOLONGNAME) ACTION(IGNORE)", 2, "longer than 8"),
        ("ACTION(IGNORE)\n(DESTQ) ACTION(IGNORE)", 2, "expected a keyword"),
        ("DESTQ(A) +\n  COLOUR(RED) ACTION(IGNORE)", 2, "unknown keyword COLOUR"),
    ],
)
def test_errors_name_the_line(text: str, line: int, words: str) -> None:
    err = errors(text)
    assert err.line == line, str(err)
    assert words in str(err) and str(err).startswith(f"rules table line {line}: ")


# ---------------------------------------------------------------- matching


def test_first_matching_rule_wins_in_table_order() -> None:
    table = parse_rules(
        "REASON(MQRC_Q_FULL) ACTION(RETRY)\n"
        "DESTQ(APP.*) ACTION(DISCARD)\n"
        "REASON(MQRC_UNKNOWN_OBJECT_NAME) ACTION(RETRY)\n"
        "ACTION(IGNORE)\n"
    )
    rule = table.match(dlh(), md())
    assert rule is not None and rule.action is Action.DISCARD and rule.line == 2
    assert [i for i, _ in table.matches(dlh(), md())] == [1, 2, 3]
    full = table.match(dlh(reason=Reason.Q_FULL, dest_q_name="OTHER"), md())
    assert full is not None and full.line == 1
    last = table.match(dlh(reason=Reason.PUT_INHIBITED, dest_q_name="OTHER"), md())
    assert last is not None and last.action is Action.IGNORE


def test_no_match_returns_none() -> None:
    table = parse_rules("DESTQ(OTHER) ACTION(RETRY)")
    assert table.match(dlh(), md()) is None


@pytest.mark.parametrize(
    ("pattern", "value", "hit"),
    [
        ("APP.*", "APP.IN", True),
        ("APP.*", "APP.", True),
        ("APP.*", "AP", False),
        ("*", "", True),
        ("?*", "", False),  # REPLYQ(?*): any non-blank ReplyToQ
        ("?*", "R", True),
        ("A?C", "ABC", True),
        ("A?C", "ABBC", False),
        ("A*C", "AXYZC", True),
        ("APP.IN", "APP.IN  ", True),  # trailing blanks are padding
        ("APP.IN", "APP.INX", False),
        ("a.b", "A.B", False),  # case matters in values
        ("A+B", "A+B", True),  # regex characters are literal
    ],
)
def test_generic_matching(pattern: str, value: str, hit: bool) -> None:
    assert match_generic(pattern, value) is hit


def test_each_keyword_matches_its_field() -> None:
    base_dlh, base_md = dlh(), md(reply_to_q="R.Q", reply_to_q_mgr="QM2",
                                  appl_identity_data="id1", put_appl_type=PutApplType.UNIX,
                                  feedback=Feedback.NONE)
    cases = {
        "APPLIDAT(ID*)": False, "APPLIDAT('id*')": True,
        "APPLNAME('pay*')": True, "APPLNAME('x*')": False,
        "APPLTYPE(MQAT_UNIX)": True, "APPLTYPE(MQAT_JAVA)": False,
        "DESTQ(APP.IN)": True, "DESTQ(APP.OUT)": False,
        "DESTQM(QM1)": True, "DESTQM(QM9)": False,
        "FEEDBACK(MQFB_NONE)": True, "FEEDBACK(MQFB_COA)": False,
        "FORMAT(MQSTR)": True, "FORMAT(MQDEAD)": False,  # the DLH's, not the MQMD's
        "MSGTYPE(MQMT_DATAGRAM)": True, "MSGTYPE(MQMT_REQUEST)": False,
        "PERSIST(MQPER_PERSISTENT)": True, "PERSIST(0)": False,
        "REASON(MQRC_UNKNOWN_OBJECT_NAME)": True, "REASON(MQRC_Q_FULL)": False,
        "REPLYQ(R.*)": True, "REPLYQ(' ')": False,
        "REPLYQM(QM2)": True, "REPLYQM(QM1)": False,
        "USERID('alice')": True, "USERID(ALICE)": False,
    }
    for pattern, hit in cases.items():
        table = parse_rules(f"{pattern} ACTION(IGNORE)")
        assert (table.match(base_dlh, base_md) is not None) is hit, pattern


def test_blank_pattern_matches_blank_field() -> None:
    table = parse_rules("REPLYQ(' ') ACTION(DISCARD)")
    assert table.match(dlh(), md(reply_to_q="")) is not None
    assert table.match(dlh(), md(reply_to_q="R")) is None


# ---------------------------------------------------------------- round trips and fuzz

_NAME = st.text(alphabet="ABCXYZ019._/%'", min_size=1, max_size=12).filter(
    lambda s: s.strip("* ") == s and s.rstrip() == s
)
_GENERIC = st.one_of(st.none(), _NAME, _NAME.map(lambda s: s + "*"),
                     st.text(alphabet="abc d'", min_size=1, max_size=8).map(str.rstrip)
                     .filter(lambda s: s != "" and s.lstrip() == s))


@st.composite
def rules_tables(draw: st.DrawFn) -> RulesTable:
    control = ControlData(
        input_q=draw(st.sampled_from(["", "SYSTEM.DEAD.LETTER.QUEUE", "my dlq"])),
        input_q_mgr=draw(st.sampled_from(["", "QM1"])),
        retry_int=draw(st.integers(0, 10_000)),
        wait=draw(st.one_of(st.sampled_from(["YES", "NO"]), st.integers(0, 999))),
    )
    rules = []
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(list(Action)))
        pattern = Pattern(
            applname=draw(_GENERIC), destq=draw(_GENERIC), userid=draw(_GENERIC),
            format=draw(st.one_of(st.none(), st.sampled_from(["MQSTR", "MQHRF2", "X*"]))),
            reason=draw(st.one_of(st.none(), st.sampled_from(list(Reason)),
                                  st.integers(0, 5000))),
            msgtype=draw(st.one_of(st.none(), st.sampled_from(list(MsgType)),
                                   st.integers(1, 999_999_999))),
            persist=draw(st.one_of(st.none(), st.sampled_from(list(Persistence)))),
            feedback=draw(st.one_of(st.none(), st.sampled_from(list(Feedback)))),
            appltype=draw(st.one_of(st.none(), st.sampled_from(list(PutApplType)))),
        )
        fwd = action is Action.FWD
        rules.append(Rule(
            action=action,
            pattern=pattern,
            fwd_q=draw(st.sampled_from(["INSPECT", "&DESTQ", "&REPLYQ", "lower"])) if fwd
            else "",
            fwd_q_mgr=draw(st.sampled_from(["", "QM2", "&DESTQM", "&REPLYQM"])) if fwd else "",
            header=draw(st.booleans()) if fwd else True,
            put_aut=draw(st.sampled_from(["DEF", "CTX"])),
            retry=draw(st.integers(1, 999_999_999)),
        ))
    return RulesTable(control, tuple(rules))


@given(rules_tables())
@settings(max_examples=100, deadline=None)
def test_round_trip_through_text(table: RulesTable) -> None:
    text = table.to_text()
    again = parse_rules(text)
    assert again == table, text


_FRAGMENTS = st.sampled_from([
    "ACTION(", "RETRY", "FWDQ", "(", ")", "'", "''", "+", "-", "\n", " ", ",", "*", "?",
    "REASON", "MQRC_Q_FULL", "INPUTQ", "WAIT", "YES", "&DESTQ", "HEADER", "NO", "12",
    "DISCARD)", "IGNORE", "é", "\t", "FWD", "destq", "x",
])


@given(st.one_of(st.text(max_size=200), st.lists(_FRAGMENTS, max_size=40).map("".join)))
@settings(max_examples=300, deadline=None)
def test_random_text_parses_or_fails_cleanly(text: str) -> None:
    try:
        table = parse_rules(text)
    except DlqRulesError as err:
        assert err.line >= 1
        assert str(err).startswith(f"rules table line {err.line}: ")
        return
    assert table.rules
    assert parse_rules(table.to_text()) == table


def test_shipped_sample_parses() -> None:
    sample = Path(__file__).resolve().parents[2] / "examples" / "dlq-rules.sample"
    table = parse_rules(sample.read_text(encoding="utf-8"))
    assert table.control == ControlData(wait="NO")
    assert [r.action for r in table.rules] == [
        Action.FWD, Action.RETRY, Action.RETRY, Action.RETRY, Action.DISCARD, Action.FWD,
        Action.FWD,
    ]
    retry = table.match(dlh(), md())
    assert retry is not None and retry.action is Action.RETRY and retry.retry == 5
