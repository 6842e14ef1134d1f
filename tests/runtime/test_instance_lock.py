"""The node directory's lock and records (gateway/runtime/instance_lock.py) against a
holder in another process: the kernel's POSIX record lock decides, whatever the records
say, and a record that is not one is never believed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.runtime.instance_lock import (
    HOLDER_FILE,
    RECORD_MAX,
    InstanceLock,
    InstanceRecord,
    StandbyMarker,
    is_locked,
    live_standbys,
    read_holder,
)

#: A holder process: takes the lock, says so, then waits to be killed.
HOLDER = """
import sys, time
from pathlib import Path
from gateway.runtime.instance_lock import InstanceLock, InstanceRecord
lock = InstanceLock(Path(sys.argv[1]), InstanceRecord.of_this_process(True))
assert lock.try_acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait(10)


def test_the_lock_is_the_kernels_and_dies_with_its_holder(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    mine = InstanceLock(tmp_path, InstanceRecord.of_this_process(True))
    assert is_locked(tmp_path) and not mine.try_acquire()
    record = read_holder(tmp_path)
    assert record is not None and record.pid == holder.pid and record.multi_instance

    os.kill(holder.pid, signal.SIGSTOP)  # frozen: still held
    try:
        assert not mine.try_acquire() and is_locked(tmp_path)
    finally:
        os.kill(holder.pid, signal.SIGCONT)

    holder.kill()
    holder.wait(10)
    assert not is_locked(tmp_path)
    before = time.time()
    assert mine.try_acquire() and mine.held
    now_holder = read_holder(tmp_path)
    assert now_holder is not None and now_holder.pid == os.getpid()
    assert now_holder.since >= before  # since: when it became active
    mine.release()
    assert read_holder(tmp_path) is None and not (tmp_path / HOLDER_FILE).exists()


def test_a_record_that_is_not_one_is_not_believed(tmp_path: Path) -> None:
    for text in ("", "pid 42\n", "[]", '{"host": "h"}', '{"host": "h", "pid": "x", '
                 '"since": 1, "multi_instance": true}', "{" * (RECORD_MAX + 10)):
        (tmp_path / HOLDER_FILE).write_text(text)
        assert read_holder(tmp_path) is None, text
    big = {"host": "h" * 10_000, "pid": 1, "since": 1.0, "multi_instance": False}
    (tmp_path / HOLDER_FILE).write_text(json.dumps(big))
    assert read_holder(tmp_path) is None  # longer than a record is read


def test_standbys_are_listed_while_they_live(tmp_path: Path) -> None:
    record = InstanceRecord("host/../x", 4242, 1.0, True)
    marker = StandbyMarker(tmp_path, record)
    assert marker.path.parent == tmp_path and "/" not in marker.path.name.removesuffix(".lock")
    # the probe of another process sees it (this one holds it: a probe here would drop it)
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; from gateway.runtime."
         "instance_lock import live_standbys; print([s.pid for s in live_standbys("
         "Path(sys.argv[1]))])", str(tmp_path)], capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "[4242]"
    marker.remove()
    assert live_standbys(tmp_path) == []
