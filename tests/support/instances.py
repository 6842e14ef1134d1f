"""Instances of one multi-instance node (docs/operations.md, "High availability"): each
``mqgw run --multi-instance`` a process of its own on the same configuration and data
directory, told its metrics port by ``MQGW_METRICS_PORT`` (two instances on one host)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.gateway_process import ChildProcess, mqgw_argv


class Instance(ChildProcess):
    """One instance: ``mqgw run --config CONFIG --multi-instance`` (or without ``-x``)."""

    dumps_stacks = True
    terminate_timeout = 45.0

    def __init__(self, name: str, config: Path, metrics_port: int,
                 env: dict[str, str] | None = None, multi_instance: bool = True) -> None:
        argv = mqgw_argv(config) + (["--multi-instance"] if multi_instance else [])
        super().__init__(name, argv, config.parent / f"{name}.log", config.parent,
                         {**(env or {}), "MQGW_METRICS_PORT": str(metrics_port)})
        self.config = config
        self.metrics_port = metrics_port

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def health(self) -> dict[str, Any] | None:
        """Its /healthz body (200 or 503), None when it does not answer."""
        url = f"http://127.0.0.1:{self.metrics_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                body: dict[str, Any] = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        except (OSError, ValueError):
            return None
        return body

    def role(self) -> str | None:
        """``active`` or ``standby`` as its /healthz says (this pid's answer only)."""
        body = self.health()
        instance = (body or {}).get("instance") or {}
        if self.process is None or instance.get("pid") != self.pid:
            return None
        role = instance.get("role")
        return str(role) if role else None

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def wait_for(self, what: str, check: Any, timeout: float) -> float:
        """Poll ``check`` until true; the seconds it took. Fails (with the log) when the
        process ends or ``timeout`` passes."""
        start = time.monotonic()
        while not check():
            assert self.running, f"{self.name} ended waiting for {what}\n{self.log_tail()}"
            if time.monotonic() - start > timeout:
                self.dump_stacks(what)
                raise AssertionError(f"{self.name}: {what} not within {timeout:.0f} s\n"
                                     f"{self.log_tail()}")
            time.sleep(0.05)
        return time.monotonic() - start


def mqgw_status_text(config: Path) -> tuple[int, str]:
    """``mqgw status`` as an operator reads it: (exit status, its text)."""
    done = subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", "status", "--config", str(config)],
        capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, done.stdout + done.stderr


def mqgw_status(config: Path) -> tuple[int, dict[str, Any]]:
    """``mqgw status --json`` as an operator runs it: (exit status, its JSON)."""
    done = subprocess.run(
        [sys.executable, "-m", "gateway.runtime.cli", "status", "--config", str(config),
         "--json"], capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.strip(), done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, out
