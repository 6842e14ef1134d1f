"""The CLI progress reporter, alone and in ``mqgw qm dlq`` on a stopped queue manager.

Alone: silent on a non-terminal unless forced, redrawn with ``\\r`` on a terminal,
throttled, and the summary line is always written. In ``mqgw qm dlq``: ``--progress``
shows the messages handled on stderr, stdout (the handler's report) is unchanged, and the
final count is there with or without it.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from pathlib import Path

from gateway.mq.embedded.admin import open_admin
from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import PutOptions
from gateway.runtime.progress import Progress
from gateway.wire.dlh import wrap_for_dlq
from gateway.wire.formats import FMT_STRING
from gateway.wire.mqmd import MQMD

ROOT = Path(__file__).resolve().parents[2]
DLQ = "SYSTEM.DEAD.LETTER.QUEUE"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_silent_on_a_pipe_but_the_summary_is_written() -> None:
    out, clock = io.StringIO(), _Clock()
    p = Progress("job", "items done", stream=out, clock=clock)
    for _ in range(5):
        p.update()
    clock.now += 2.5
    line = p.finish("ok")
    assert line == "job: 5 items done in 2.5 s (ok)"
    assert out.getvalue() == line + "\n"


def test_forced_on_a_pipe_writes_throttled_plain_lines() -> None:
    out, clock = io.StringIO(), _Clock()
    p = Progress("job", "items", stream=out, force=True, interval=1.0, clock=clock)
    p.update(1)
    p.update(2)  # same instant: throttled
    clock.now += 1.0
    p.update(3, "failed 0")
    p.finish()
    assert out.getvalue().splitlines() == ["job: 1 items", "job: 3 items (failed 0)",
                                           "job: 3 items in 1.0 s"]
    assert "\r" not in out.getvalue()


def test_on_a_terminal_one_line_is_redrawn_then_replaced_by_the_summary() -> None:
    out, clock = _Tty(), _Clock()
    p = Progress("job", "items", stream=out, interval=0.0, clock=clock)
    assert p.live
    p.update()
    p.update()
    p.finish()
    text = out.getvalue()
    assert text == "\r\x1b[Kjob: 1 items\r\x1b[Kjob: 2 items\r\x1b[Kjob: 2 items in 0.0 s\n"


async def _qm_with_dead_letters(data_dir: Path, count: int) -> None:
    qm = EmbeddedQueueManager("QMP", data_dir)
    qm.run_mqsc("DEFINE QLOCAL(LATE.Q)\n")
    await qm.close()
    session = await open_admin(data_dir)
    try:
        for i in range(count):
            md = MQMD(format=FMT_STRING, coded_char_set_id=1208, persistence=1)
            dl_md, dl_body = wrap_for_dlq(md, f"late {i}".encode(), 2085, "LATE.Q", "QMP",
                                          "test_progress")
            await session.conn.put1(DLQ, dl_md, dl_body, PutOptions(set_all_context=True))
    finally:
        await session.close()


def _dlq(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    rules = tmp_path / "rules.dlq"
    rules.write_text("INPUTQ(' ') RETRYINT(1) WAIT(NO)\n"
                     "REASON(MQRC_UNKNOWN_OBJECT_NAME) ACTION(RETRY) RETRY(1)\n")
    return subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", "qm", "dlq", "--data-dir",
         str(tmp_path / "qm"), "--rules", str(rules), "--once", *extra],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_dlq_progress_and_summary(tmp_path: Path) -> None:
    asyncio.run(_qm_with_dead_letters(tmp_path / "qm", 3))
    r = _dlq(tmp_path, "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    # not a terminal, not asked for: only the summary on stderr
    progress_lines = [x for x in r.stderr.splitlines() if x.startswith("mqgw qm dlq:")]
    assert len(progress_lines) == 1, r.stderr
    assert progress_lines[0].startswith("mqgw qm dlq: 3 messages handled in ")
    assert progress_lines[0].endswith("(removed 0, failed 0)")

    r = _dlq(tmp_path, "--progress")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "retried 3" in r.stdout and "failed 0" in r.stdout
    assert "mqgw qm dlq" not in r.stdout  # stdout is the handler's report only
    lines = [x for x in r.stderr.splitlines() if x.startswith("mqgw qm dlq:")]
    assert lines[0] == "mqgw qm dlq: 1 messages handled (failed 0)"
    assert lines[-1].startswith("mqgw qm dlq: 3 messages handled in ")
    assert lines[-1].endswith("(removed 3, failed 0)")
