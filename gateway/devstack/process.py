"""Child processes of the devstack: spawned in their own process group, stopped by pid.

Every service runs in a new session (its pgid is its pid), so stopping it signals the
whole group and never anything found by name. Processes the current Python process owns
(pytest fixtures, ``with`` blocks) are also killed by an ``atexit`` hook and, on Linux, by
the kernel when their parent dies (``PR_SET_PDEATHSIG``); ``mqgw devstack up`` starts
*detached* processes instead, which outlive the CLI and are stopped by ``down`` using the
pid and kernel start time recorded in the state file (so a recycled pid is never hit).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1


# Looked up once here: the child between fork and exec must not load libraries or run
# ldconfig (ctypes.util.find_library does), only call an already-resolved function.
_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)


def _die_with_parent_of(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec
        if _prctl is None:
            return
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` in clock ticks (field 22 of /proc/PID/stat).

    ``None`` when no such process exists or it is a zombie (it has exited).
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """True when ``pid`` runs and, if given, was started at ``start_time`` (the same process)."""
    current = process_start_time(pid)
    if current is None:
        return False
    return start_time is None or current == start_time


def log_tail(path: Path | None, lines: int = 40, max_bytes: int = 64 * 1024) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    if path is None:
        return ""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


@dataclass(slots=True)
class ServiceProcess:
    """One running service: its pid (also its process-group id), start time and log."""

    name: str
    argv: list[str]
    pid: int
    start_time: int | None
    log_path: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid, self.start_time)

    def exit_code(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group, wait up to ``timeout`` s, then SIGKILL it."""
        with _OWNED_LOCK:
            _OWNED.discard(self)
        if not self.alive():
            self._reap()
            return
        self._signal_group(signal.SIGTERM)
        if not self._wait(timeout):
            self._signal_group(signal.SIGKILL)
            self._wait(5.0)
        self._reap()

    def _signal_group(self, sig: signal.Signals) -> None:
        # The group id is the pid (new session). Check identity first so a pid the kernel
        # has handed to someone else since is never signalled.
        if not self.alive():
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def _wait(self, timeout: float) -> bool:
        if self.popen is not None:
            try:
                self.popen.wait(timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            time.sleep(0.05)
        return not self.alive()

    def _reap(self) -> None:
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(0.5)

    def __hash__(self) -> int:
        return hash((self.pid, self.start_time))


_OWNED: set[ServiceProcess] = set()
_OWNED_LOCK = threading.Lock()


def _stop_owned() -> None:
    with _OWNED_LOCK:
        owned = list(_OWNED)
    for proc in owned:
        proc.stop(timeout=5.0)


atexit.register(_stop_owned)


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log_path: Path,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    detach: bool = False,
) -> ServiceProcess:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log_path``.

    ``detach=False`` (the default) ties the child's life to this process; ``detach=True``
    lets it outlive this process (the ``mqgw devstack up`` case).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # PDEATHSIG fires when the *thread* that forked exits, so only the main thread asks for it.
    on_main_thread = threading.current_thread() is threading.main_thread()
    preexec: Callable[[], None] | None = (
        _die_with_parent_of(os.getpid()) if not detach and on_main_thread else None
    )
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=full_env,
            start_new_session=True,
            preexec_fn=preexec,
        )
    proc = ServiceProcess(
        name=name,
        argv=list(argv),
        pid=popen.pid,
        start_time=process_start_time(popen.pid),
        log_path=log_path,
        popen=popen,
    )
    if not detach:
        with _OWNED_LOCK:
            _OWNED.add(proc)
    return proc


def adopt(
    name: str, argv: Sequence[str], pid: int, start_time: int | None, log_path: Path
) -> ServiceProcess:
    """A handle on a process some earlier run started (read back from the state file)."""
    return ServiceProcess(name, list(argv), pid, start_time, log_path, None)
