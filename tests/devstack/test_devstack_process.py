"""Service processes: own process group, stopped by pid (group included), log tails."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gateway.devstack.process import log_tail, pid_alive, process_start_time, spawn


def _wait_for(path: Path, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} never written")


def test_spawned_process_has_its_own_group_and_stop_kills_it(tmp_path: Path) -> None:
    proc = spawn("sleeper", ["sleep", "60"], log_path=tmp_path / "s.log", cwd=tmp_path)
    assert proc.alive()
    assert os.getpgid(proc.pid) == proc.pid
    assert proc.start_time == process_start_time(proc.pid)
    proc.stop(timeout=5)
    assert not proc.alive()
    assert not pid_alive(proc.pid, proc.start_time)
    proc.stop()  # idempotent


def test_stop_also_kills_grandchildren(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    proc = spawn(
        "parent",
        ["bash", "-c", f"sleep 60 & echo $! > {pid_file}; wait"],
        log_path=tmp_path / "p.log",
        cwd=tmp_path,
    )
    child = int(_wait_for(pid_file))
    child_start = process_start_time(child)
    assert pid_alive(child, child_start)
    proc.stop(timeout=5)
    deadline = time.monotonic() + 5
    while pid_alive(child, child_start) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pid_alive(child, child_start)


def test_process_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = spawn(
        "stubborn",
        ["bash", "-c", f"trap '' TERM; echo up > {ready}; while true; do sleep 0.1; done"],
        log_path=tmp_path / "t.log",
        cwd=tmp_path,
    )
    _wait_for(ready)
    started = time.monotonic()
    proc.stop(timeout=0.5)
    assert not proc.alive()
    assert time.monotonic() - started < 5


def test_pid_identity_includes_start_time(tmp_path: Path) -> None:
    proc = spawn("sleeper", ["sleep", "60"], log_path=tmp_path / "s.log", cwd=tmp_path)
    try:
        assert proc.start_time is not None
        assert pid_alive(proc.pid, proc.start_time)
        assert not pid_alive(proc.pid, proc.start_time + 1)  # "same pid, other process"
    finally:
        proc.stop()


def test_output_goes_to_log_and_tail_returns_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    proc = spawn(
        "printer",
        ["bash", "-c", "for i in $(seq 1 100); do echo line-$i; done; echo oops >&2"],
        log_path=log,
        cwd=tmp_path,
    )
    assert proc.popen is not None
    assert proc.popen.wait(5) == 0
    tail = log_tail(log, lines=3)
    assert tail.splitlines() == ["line-99", "line-100", "oops"]
    assert log_tail(tmp_path / "missing.log") == ""


def test_owned_service_dies_when_its_parent_is_killed(tmp_path: Path) -> None:
    """SIGKILL to the owner (think: a killed pytest) still takes its services down."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from gateway.devstack.process import spawn\n"
        "d = Path(sys.argv[1])\n"
        "p = spawn('sleeper', ['sleep', '60'], log_path=d / 's.log', cwd=d)\n"
        "(d / 'pid').write_text(f'{p.pid} {p.start_time}')\n"
        "time.sleep(60)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)])
    try:
        pid_text, start_text = _wait_for(tmp_path / "pid", timeout=20).split()
        pid, start = int(pid_text), int(start_text)
        assert pid_alive(pid, start)
    finally:
        owner.kill()
        owner.wait(10)
    deadline = time.monotonic() + 5
    while pid_alive(pid, start) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pid_alive(pid, start)
