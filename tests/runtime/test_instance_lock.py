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


#: An active instance whose lock is lost under it: the lock file's descriptor is replaced
#: by a read-only one of the same file (closing the old one releases the record lock, and
#: a write through the new one fails, as every write does on an NFS client whose lease
#: expired); :func:`gateway.runtime.run.guard_lock` must end the process with status 3.
LOSES_ITS_LOCK = """
import asyncio, logging, os, sys, time
from pathlib import Path
from gateway.runtime.instance_lock import LOCK_FILE, InstanceLock, InstanceRecord
from gateway.runtime.run import guard_lock
logging.basicConfig(level=logging.INFO)
directory = Path(sys.argv[1])
lock = InstanceLock(directory, InstanceRecord.of_this_process(True))
assert lock.try_acquire()

async def main():
    guard_lock(lock, interval=0.05)
    assert lock.still_held()
    print("holding", flush=True)
    readonly = os.open(directory / LOCK_FILE, os.O_RDONLY)
    os.dup2(readonly, lock._fd)
    await asyncio.sleep(60)
    print("still running", flush=True)

asyncio.run(main())
"""


def test_an_active_instance_that_loses_its_lock_ends_at_once(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", LOSES_ITS_LOCK, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["holding"], (done.stdout, done.stderr)
    assert done.returncode == 3, done.stderr
    assert "lost the lock on" in done.stderr


def test_the_lock_is_given_back_when_its_record_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.runtime import instance_lock

    def full_disk(_path: Path, _text: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(instance_lock, "_write_atomically", full_disk)
    lock = InstanceLock(tmp_path, InstanceRecord.of_this_process(True))
    with pytest.raises(OSError):
        lock.try_acquire()
    assert not lock.held
    # another process sees the lock free (in this process a probe always succeeds)
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; "
         "from gateway.runtime.instance_lock import is_locked; "
         "print(is_locked(Path(sys.argv[1])))", str(tmp_path)],
        capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "False", probe.stderr
    assert read_holder(tmp_path) is None
