"""The MQSC subset: lexical rules, errors naming lines, execution and runmqsc output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.mq.embedded.mqsc import MQSCError, parse_command, parse_mqsc, split_commands
from gateway.mq.embedded.objects import QType, Usage
from gateway.mq.embedded.qmgr import EmbeddedQueueManager

REPO = Path(__file__).resolve().parents[2]


def test_lexical_rules() -> None:
    script = (
        "* a comment\n"
        "  \n"
        "define qlocal(app.in) +\n"
        "       descr('It''s mixed Case') -\n"
        "maxdepth(10)\n"
        "DEF QR(YORK) RNAME(' ') RQMNAME(CLUSQM)\n"
    )
    cmds = parse_mqsc(script)
    assert [c.line for c in cmds] == [3, 6]
    a, b = cmds
    assert (a.verb, a.obj, a.name) == ("DEFINE", "QLOCAL", "APP.IN")
    assert a.attrs == {"DESCR": "It's mixed Case", "MAXDEPTH": "10"}
    assert (b.obj, b.attrs["RNAME"], b.attrs["RQMNAME"]) == ("QREMOTE", "", "CLUSQM")


@pytest.mark.parametrize(
    ("script", "line", "words"),
    [
        ("DEFINE QLOCAL(A)\n\nFROB QLOCAL(B)\n", 3, "unknown"),
        ("DEFINE QLOCAL(A) DESCR('open\n", 1, "not closed"),
        ("* c\nDEFINE QLOCAL(A) +\n", 2, "continuation"),
        ("DEFINE QLOCAL\n", 1, "needs a name"),
        ("DEFINE QUEUE(X)\n", 1, "queue type"),
        ("DEFINE QLOCAL(BAD NAME!)\n", 1, "does not allow"),
        ("DEFINE QLOCAL(A) MAXDEPTH(1) MAXDEPTH(2)\n", 1, "twice"),
        ("DEFINE QLOCAL(" + "X" * 49 + ")\n", 1, "longer than 48"),
    ],
)
def test_errors_name_the_line(script: str, line: int, words: str) -> None:
    with pytest.raises(MQSCError) as err:
        for ln, text in split_commands(script):
            parse_command(text, ln)
    assert err.value.line == line
    assert words in str(err.value)
    assert str(err.value).startswith(f"line {line}:")


async def test_define_alter_display_delete(tmp_path: Path) -> None:
    qm = EmbeddedQueueManager("QMM", tmp_path / "qm")
    try:
        results = qm.run_mqsc(
            "DEFINE QLOCAL(XQ) USAGE(XMITQ) MAXMSGL(2000) BOTHRESH(5) BOQNAME(BO.Q)\n"
            "DEFINE QLOCAL(XQ)\n"
            "DEFINE QLOCAL(XQ) REPLACE USAGE(XMITQ) DEFPSIST(YES)\n"
            "ALTER QLOCAL(XQ) GET(DISABLED)\n"
            "ALTER QALIAS(XQ) GET(DISABLED)\n"
            "DEFINE QLOCAL(Y) MAXDEPTH(abc)\n"
            "DEFINE QLOCAL(Y) TARGET(X)\n"
            "DEFINE QALIAS(AL)\n"
            "DEFINE QLOCAL(Z) TRIGGER CLUSTER(DEMO)\n"
            "ALTER QMGR DEADQ(DLQ2) DEFXMITQ(XQ)\n"
            "DISPLAY QUEUE(X*) CURDEPTH MAXDEPTH\n"
            "DISPLAY QLOCAL(NOPE)\n"
        )
        ok = [r.ok for r in results]
        assert ok == [True, False, True, True, False, False, False, False, True, True, True, False]
        assert results[1].lines == ["AMQ8150E: IBM MQ object XQ already exists."]
        assert "not found" in results[4].lines[0]
        assert "not a number" in results[5].lines[0]
        assert "not valid for QLOCAL" in results[6].lines[0]
        assert "TARGET" in results[7].lines[0]
        xq = qm.catalogue.get("XQ")
        assert xq is not None and xq.qtype is QType.LOCAL and xq.usage is Usage.TRANSMISSION
        assert xq.default_persistent and not xq.get_enabled
        assert xq.max_msg_length == 4_194_304  # REPLACE resets unspecified attributes
        assert qm.catalogue.qmgr.dead_letter_q_name == "DLQ2"
        assert qm.catalogue.qmgr.default_xmit_q_name == "XQ"
        display = results[10].lines
        assert display[0] == "AMQ8409I: Display Queue details."
        assert "QUEUE(XQ)" in display[1] and "TYPE(QLOCAL)" in display[1]
        assert any("CURDEPTH(0)" in ln for ln in display)
        assert qm.run_mqsc("DELETE QLOCAL(XQ)")[0].lines == ["AMQ8007I: IBM MQ queue deleted."]
        assert qm.catalogue.get("XQ") is None
    finally:
        await qm.close()


def test_cli_runs_like_runmqsc(tmp_path: Path) -> None:
    def mqgw(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway.runtime.cli", "mqsc", *args],
            input=stdin, capture_output=True, text=True, cwd=REPO, timeout=60,
        )

    missing = mqgw("CLIQM", "--data-dir", str(tmp_path), stdin="DISPLAY QMGR\n")
    assert missing.returncode == 20 and "AMQ8118E" in missing.stderr
    created = mqgw("CLIQM", "--data-dir", str(tmp_path), "--create",
                   stdin="DEFINE QLOCAL(CLI.Q) MAXDEPTH(9)\nDIS Q(CLI.Q) MAXDEPTH\n")
    assert created.returncode == 0, created.stderr
    out = created.stdout
    assert "Starting MQSC for queue manager CLIQM." in out
    assert "     1 : DEFINE QLOCAL(CLI.Q) MAXDEPTH(9)" in out
    assert "AMQ8006I: IBM MQ queue created." in out and "MAXDEPTH(9)" in out
    assert "2 MQSC commands read." in out and "All valid MQSC commands were processed." in out
    again = mqgw("CLIQM", "--data-dir", str(tmp_path), stdin="DEFINE QLOCAL(CLI.Q)\nJUNK\n")
    assert again.returncode == 10
    assert "1 command has a syntax error." in again.stdout
    assert "One valid MQSC command could not be processed." in again.stdout


def test_cli_names_the_queue_manager_and_line_of_a_failing_command(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", "mqsc", "LINEQM", "--data-dir",
         str(tmp_path), "--create"],
        input="DEFINE QLOCAL(A)\n\nDEFINE QALIAS(B) TARGET(A) MAXDEPTH(5)\n",
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )
    assert done.returncode == 10
    assert "Traceback" not in done.stderr
    assert "queue manager LINEQM: line 3:" in done.stderr and "MAXDEPTH" in done.stderr
    assert "One valid MQSC command could not be processed." in done.stdout
