"""``mqgw run --config FILE`` as a child process, for tests that must crash or stop the
gateway from outside (SIGKILL at a random point, SIGTERM drain) and then read its
embedded queue manager's data directory from the test process.

Why a process and not the in-process gateway (tests/support/gateway.py): a SIGKILL
must lose exactly what a real crash loses — open units of work, unflushed client
buffers, the MQTT session's in-flight window — which only the kernel can do.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from gateway.devstack.process import ServiceProcess, spawn

#: Written into a child's log before its thread stacks (ChildProcess.dump_stacks).
_STACKS_MARKER = "---- thread stacks"


def mqgw_argv(config: Path) -> list[str]:
    """The ``mqgw run`` command line of this interpreter's environment."""
    return [sys.executable, "-m", "gateway.runtime.cli", "run", "--config", str(config)]


def write_config(path: Path, config: dict[str, Any]) -> Path:
    """``config`` as the YAML file ``mqgw run`` reads (paths relative to ``path``)."""
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


class ChildProcess:
    """One child process of a test at a time; every start appends to the same log, so
    a crash's traces stay readable after the next start."""

    #: Seconds SIGTERM gets before :meth:`terminate` SIGKILLs.
    terminate_timeout = 40.0
    #: Whether the child writes its thread stacks on SIGUSR1 (``mqgw``'s entry point
    #: does; for other programs SIGUSR1 would only end them).
    dumps_stacks = False

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        cwd: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.cwd = cwd
        self.env = env
        self.process: ServiceProcess | None = None
        self.starts = 0
        self._log_offset = 0

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        with self.log_path.open("ab") as log:
            log.write(f"---- start {self.starts + 1} ----\n".encode())
            self._log_offset = log.tell()
        self.process = spawn(
            self.name, self.argv, log_path=self.log_path, cwd=self.cwd, env=self.env
        )
        self.starts += 1

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.alive()

    def exit_code(self) -> int | None:
        return self.process.exit_code() if self.process is not None else None

    def kill(self) -> None:
        """SIGKILL (no handler runs, nothing is flushed) and reap; the flock dies with it."""
        proc = self.process
        if proc is None:
            return
        if proc.alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.stop(timeout=10)
        self.process = None

    def terminate(self, timeout: float | None = None) -> int | None:
        """SIGTERM (a clean stop: the gateway drains); its exit code."""
        proc = self.process
        if proc is None:
            return None
        if proc.alive():
            os.kill(proc.pid, signal.SIGTERM)
            limit = self.stop_timeout() if timeout is None else timeout
            deadline = time.monotonic() + limit
            while proc.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.alive():
                self.dump_stacks(f"SIGTERM not obeyed in {limit:.0f} s")
        proc.stop(timeout=5)  # SIGKILLs it only when the stop overran the timeout
        self.process = None
        return proc.exit_code()

    def stop_timeout(self) -> float:
        """Seconds SIGTERM gets before the SIGKILL."""
        return self.terminate_timeout

    def dump_stacks(self, why: str) -> None:
        """The running child's thread stacks into its log (``mqgw`` dumps them on SIGUSR1),
        so a failure says where it hung: a stop that overran, a wait that never ended.
        :meth:`log_tail` then shows them. Nothing for a child that does not dump them."""
        proc = self.process
        if proc is None or not proc.alive() or not self.dumps_stacks:
            return
        with self.log_path.open("ab") as log:
            log.write(f"{_STACKS_MARKER} ({why}) ----\n".encode())
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGUSR1)
        size, settled_at = -1, time.monotonic()
        end = settled_at + 3.0
        while time.monotonic() < end:  # the dump is written once the size stops growing
            now = self.log_path.stat().st_size
            if now != size:
                size, settled_at = now, time.monotonic()
            elif time.monotonic() - settled_at >= 0.3:
                break
            time.sleep(0.05)

    def log_since_start(self) -> str:
        """What the current (or last) run has logged so far."""
        with self.log_path.open("rb") as log:
            log.seek(self._log_offset)
            return log.read().decode("utf-8", "replace")

    def has_logged(self, text: str) -> bool:
        """Whether the current run's log contains ``text`` (e.g. a readiness line)."""
        return text in self.log_since_start()

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` of the log; after :meth:`dump_stacks`, from ``lines`` before
        the thread stacks to the end (the stacks are what explains the hang)."""
        from gateway.devstack.process import log_tail

        text = self.log_since_start()
        marker = text.rfind(_STACKS_MARKER)
        if marker < 0:
            return log_tail(self.log_path, lines)
        before = text[:marker].splitlines()[-lines:]
        return "\n".join([*before, text[marker:]])


class GatewayProcess(ChildProcess):
    """One ``mqgw run`` child at a time on one configuration."""

    dumps_stacks = True

    def __init__(self, config: Path, log_path: Path) -> None:
        super().__init__("mqgw", mqgw_argv(config), log_path, config.parent)
        self.config = config

    def stop_timeout(self) -> float:
        """The gateway's own bound on a stop (``shutdown_timeout`` plus the grace its
        stop watchdog allows), then a little for the exit: a SIGKILL before that would
        cut a stop the gateway is still entitled to finish."""
        from gateway.runtime.config import GatewayConfig
        from gateway.runtime.run import STOP_GRACE_S

        raw = yaml.safe_load(self.config.read_text(encoding="utf-8")) or {}
        budget = raw.get("shutdown_timeout", GatewayConfig.model_fields["shutdown_timeout"].default)
        return float(budget) + STOP_GRACE_S + 5.0
