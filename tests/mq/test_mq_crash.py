"""Crash test: a child process working under syncpoint is SIGKILLed at random points.

After every kill the queue manager is reopened by the next child; at the end the test
drains the queue and checks, against the child's journal (fsynced around each commit):
every committed persistent message that was never taken is present exactly once,
nothing that was never committed is visible, committed gets stay gone, and no
non-persistent message survived.
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from gateway.mq.embedded.qmgr import EmbeddedQueueManager
from gateway.mq.port import GetOptions, MQError, OpenOption
from gateway.wire.reasons import Reason

TRIALS = 24
CHILD = "tests.mq.crash_child"
REPO = Path(__file__).resolve().parents[2]


def read_journal(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"PI": [], "PC": [], "GI": [], "GC": [], "NP": []}
    if not path.exists():
        return out
    text = path.read_text()
    # each line is one write(2) call, so a kill leaves whole lines only
    assert not text or text.endswith("\n"), "journal ends in a partial line"
    for line in text.splitlines():
        tag, *bodies = line.split(" ")
        out[tag].extend(bodies)
    return out


def ready_line(proc: subprocess.Popen[bytes], seconds: float) -> bytes:
    """The child's first stdout line, failing (not hanging) when it takes over ``seconds``."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    if not ready:
        proc.kill()
        proc.wait()
        raise AssertionError(f"child gave no ready line within {seconds} s")
    return proc.stdout.readline()


@pytest.mark.slow
async def test_sigkill_loses_no_committed_and_shows_no_uncommitted(tmp_path: Path) -> None:
    data = tmp_path / "qm"
    journal = tmp_path / "journal.txt"
    rnd = random.Random(int(os.environ.get("CRASH_SEED", "4242")))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    kills = 0
    for trial in range(TRIALS):
        child = subprocess.Popen(
            [sys.executable, "-m", CHILD, str(data), str(journal), str(trial),
             str(rnd.randrange(1 << 30))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )
        try:
            assert child.stdout is not None
            line = ready_line(child, 30)  # a hung start fails this trial
            assert line.strip() == b"ready", (line, child.stderr.read() if child.stderr else b"")
            time.sleep(rnd.uniform(0.02, 0.6))
            assert child.poll() is None, child.stderr.read() if child.stderr else b""
            child.send_signal(signal.SIGKILL)
            kills += 1
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(10)
            if child.stdout:
                child.stdout.close()
            if child.stderr:
                child.stderr.close()
        assert child.returncode == -signal.SIGKILL
    assert kills >= 20

    j = read_journal(journal)
    put_intent, put_committed = set(j["PI"]), set(j["PC"])
    get_intent, get_committed = set(j["GI"]), set(j["GC"])
    assert len(put_committed) > 100, "the child did too little work for the test to mean much"
    assert get_committed, "no get batch was committed"

    qm = EmbeddedQueueManager("CRASHQM", data)
    present: list[str] = []
    try:
        async with await qm.connect() as conn:
            q = await conn.open("CRASH.Q", OpenOption.INPUT_SHARED)
            while True:
                try:
                    present.append((await q.get(GetOptions())).body.decode())
                except MQError as exc:
                    assert exc.reason == Reason.NO_MSG_AVAILABLE
                    break
    finally:
        await qm.close()

    counts = Counter(present)
    duplicates = [b for b, c in counts.items() if c > 1]
    assert not duplicates, f"messages present more than once: {duplicates[:10]}"
    seen = set(present)
    never_committed = seen - put_intent
    assert not never_committed, f"uncommitted puts visible: {sorted(never_committed)[:10]}"
    lost = (put_committed - get_intent) - seen
    assert not lost, f"committed persistent messages lost: {sorted(lost)[:10]}"
    resurrected = get_committed & seen
    assert not resurrected, f"committed gets came back: {sorted(resurrected)[:10]}"
    assert not any(b.startswith("np") for b in seen), "a non-persistent message survived"
    # lower and upper bounds on what remains
    assert len(put_committed - get_intent) <= len(seen) <= len(put_intent - get_committed)
